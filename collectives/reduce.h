/* reduce.h: elementwise reduction kernels for every dtype and op. */
#ifndef GCOLL_REDUCE_H
#define GCOLL_REDUCE_H

#include <stddef.h>

#include "gcoll.h"

/* dst[i] = dst[i] op src[i] for n elements; AVG reduces as SUM (see gcoll_reduce_finish).
 * fp16 and bf16 are computed in fp32 and rounded to nearest even. */
void gcoll_reduce_local(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op);

/* dst[i] = src[i] op dst[i]: gcoll_reduce_local with the operands in the other order, for a
 * partial sum received straight into dst and combined with the local input src, so that
 * the result is bit for bit what gcoll_reduce_local(local copy, received) gives (MIN and MAX
 * keep the first operand when one is NaN). */
void gcoll_reduce_rev(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op);

/* Why op cannot reduce dtype (a bitwise op on a float type, AVG on bool), or NULL when it
 * can. Both must be known values. */
const char *gcoll_reduce_check(gcoll_dtype_t dtype, gcoll_op_t op);

/* Completes an AVG: divides n elements by nranks (integers truncate toward zero). */
void gcoll_reduce_finish(void *buf, size_t n, gcoll_dtype_t dtype, gcoll_op_t op, int nranks);

/* Forces the portable kernels (for tests of the fallback); returns the previous value. */
int gcoll_reduce_force_scalar(int on);

#endif /* GCOLL_REDUCE_H */
