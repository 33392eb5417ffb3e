/* values_float.h: what the portable and AVX2 kernels of the narrow float sections share. */
#ifndef GCOLL_COMPRESS_VALUES_FLOAT_H
#define GCOLL_COMPRESS_VALUES_FLOAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int m;            /* mantissa bits */
    int emin, emax;   /* exponents of the smallest and largest normal binade */
    uint32_t maxcode; /* magnitude code of the largest normal (codes above: NaN/Inf or none) */
    float maxval;     /* its value */
} gcoll_fl_fmt_t;

static inline float gcoll_fl_pow2(int e) /* normal range only */
{
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The E8M0 code of the shared scale of a block whose largest |x| has bits amax (finite):
 * floor(log2 amax) - emax, kept in [-127, 127] (a block of zeros or float subnormals gets
 * the smallest scale). */
static inline uint32_t gcoll_fl_mx_scale_code(uint32_t amax, int emax)
{
    int32_t fe = (int32_t)(amax >> 23);
    int32_t x = fe ? fe - 127 - emax : -127;
    x = x < -127 ? -127 : x;
    return (uint32_t)(x + 127);
}

/* MX blocks of x[0..n): E8M0 scales into sc, element codes into el (values_float.c's
 * layout), the rounding stream's element i drawn at i + klo. Returns the first block with a
 * non-finite value, or the number of blocks. */
size_t gcoll_fl_mx_put_gen(const float *x, size_t n, const gcoll_fl_fmt_t *f, int fp4, int sr,
                           uint32_t klo, uint32_t khi, uint8_t *sc, uint8_t *el);
size_t gcoll_fl_mx_put_avx2(const float *x, size_t n, const gcoll_fl_fmt_t *f, int fp4, int sr,
                            uint32_t klo, uint32_t khi, uint8_t *sc, uint8_t *el);
/* fp8 codes (sign in bit 7) of x[0..n) at scale 2^d, whole groups of 32: returns how many
 * it wrote (the caller does the rest). */
size_t gcoll_fl_codes_avx2(const float *x, size_t n, int32_t d, const gcoll_fl_fmt_t *f, int sr,
                           uint32_t base, uint32_t klo, uint32_t khi, uint8_t *out);
/* out[0..8 groups) =, += or -= (mode) the values of 8 * groups element codes (bytes, or
 * nibbles from a byte boundary) times scale. */
void gcoll_fl_apply8_avx2(const uint8_t *codes, int fp4, size_t groups, const gcoll_fl_fmt_t *f,
                          float scale, float *out, int mode);

#endif /* GCOLL_COMPRESS_VALUES_FLOAT_H */
