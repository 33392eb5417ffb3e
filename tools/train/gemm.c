/* gemm.c: sgemm for the MLP: cblas_sgemm from OpenBLAS when available, else a blocked
 * loop in plain C whose innermost loop runs along rows of C and B so it vectorizes. */
#include <stdlib.h>
#include <string.h>

#ifdef GCOLL_TRAIN_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "gemm.h"

#ifdef GCOLL_TRAIN_HAVE_OPENBLAS

const char *train_sgemm_name(void)
{
    return "openblas";
}
void train_sgemm_init(void)
{
    openblas_set_num_threads(1);
}

void train_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc)
{
    cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#else

const char *train_sgemm_name(void)
{
    return "blocked C";
}
void train_sgemm_init(void) {}

/* Column and depth blocks: a 256-float slice of a C row and 128 rows of B (128 KiB) stay in
 * L2 while every row of A streams past them. */
#define NB 256
#define KB 128

static void row_axpy(float *restrict c, const float *restrict b, float s, int n)
{
    for (int j = 0; j < n; j++)
        c[j] += s * b[j];
}

void train_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc)
{
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        if (beta == 0.0f)
            memset(ci, 0, (size_t)n * sizeof(float));
        else if (beta != 1.0f)
            for (int j = 0; j < n; j++)
                ci[j] *= beta;
    }
    if (m == 0 || n == 0 || k == 0)
        return;
    /* op(B) as a k x n row-major panel: a transposed B is copied once (O(kn) against the
     * O(mnk) product) so the inner loop is always unit stride. */
    float *bt = NULL;
    const float *bp = b;
    int ldbp = ldb;
    if (transb) {
        bt = malloc((size_t)k * n * sizeof(float));
        if (!bt)
            abort();
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++)
                bt[(size_t)p * n + j] = b[(size_t)j * ldb + p];
        bp = bt;
        ldbp = n;
    }
    for (int j0 = 0; j0 < n; j0 += NB) {
        int nb = n - j0 < NB ? n - j0 : NB;
        for (int p0 = 0; p0 < k; p0 += KB) {
            int kb = k - p0 < KB ? k - p0 : KB;
            for (int i = 0; i < m; i++) {
                float *ci = c + (size_t)i * ldc + j0;
                for (int p = p0; p < p0 + kb; p++) {
                    float aip = transa ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                    if (aip != 0.0f) /* ReLU outputs and their gradients are often zero */
                        row_axpy(ci, bp + (size_t)p * ldbp + j0, alpha * aip, nb);
                }
            }
        }
    }
    free(bt);
}

#endif
