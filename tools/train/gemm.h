/* gemm.h: the one matrix product the MLP needs, through OpenBLAS when built with it. */
#ifndef GCOLL_TRAIN_GEMM_H
#define GCOLL_TRAIN_GEMM_H

/* Row-major C[m x n] = alpha * op(A) op(B) + beta * C, op(X) = X^T when trans* != 0;
 * op(A) is m x k, op(B) is k x n; lda, ldb, ldc are row strides. Deterministic for a given
 * build (the fallback's summation order is fixed; OpenBLAS runs on one thread). */
void train_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);

/* "openblas" or "blocked C". */
const char *train_sgemm_name(void);

/* Pins the BLAS to one thread: ranks share the machine's cores with each other and with
 * gcoll's progress threads. */
void train_sgemm_init(void);

#endif
