/* kernels.h: the codec inner loops behind one dispatch table (generic and AVX2 builds). */
#ifndef GCOLL_COMPRESS_KERNELS_H
#define GCOLL_COMPRESS_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "compress/compress.h"

/* A loop body written once (KBODY name##_body) and compiled twice by CLONE2: for the
 * baseline target (name##_gen) and with AVX2 (name##_avx2); callers pick one at run time.
 * No FMA in either, so both round identically. */
#define KBODY static inline __attribute__((always_inline))
#define TARGET_AVX2 __attribute__((target("avx2,f16c,popcnt")))
#define CLONE2(ret, name, params, args)                                                            \
    static ret name##_gen params                                                                   \
    {                                                                                              \
        return name##_body args;                                                                   \
    }                                                                                              \
    TARGET_AVX2 static ret name##_avx2 params                                                      \
    {                                                                                              \
        return name##_body args;                                                                   \
    }

/*
 * Conventions: payload pointers (uint8_t) may be unaligned and are read/written with
 * memcpy-sized accesses; "mode" is a gcoll_dmode_t (SET, ADD, SUB). Reductions use eight
 * fixed lanes, so the generic and AVX2 kernels give bit-identical results; no kernel
 * uses FMA contraction for the same reason. Kernels that return "bad" report whether
 * any input was NaN/Inf (encoders) or whether a payload holds a non-finite pattern
 * (decoder checks).
 */
typedef struct {
    /* dense value sections */
    int (*f32_put)(const float *x, size_t n, uint8_t *out);
    int (*f32_bad)(const uint8_t *p, size_t n);
    void (*f32_apply)(const uint8_t *p, size_t n, float *out, int mode);
    int (*f16_put)(const float *x, size_t n, uint8_t *out);
    int (*f16_bad)(const uint8_t *p, size_t n);
    void (*f16_apply)(const uint8_t *p, size_t n, float *out, int mode);
    int (*bf16_put)(const float *x, size_t n, uint8_t *out);
    int (*bf16_bad)(const uint8_t *p, size_t n);
    void (*bf16_apply)(const uint8_t *p, size_t n, float *out, int mode);
    /* q8: max |x| (NaN/Inf -> +inf), quantize with inv = 127/max, dequantize */
    float (*absmax)(const float *x, size_t n);
    void (*q8_put)(const float *x, size_t n, float inv, int8_t *codes);
    void (*q8_apply)(const int8_t *codes, size_t n, float scale, float *out, int mode);
    /* sign: packs sign bits of x (n multiple of 8 except the message tail) and returns
     * sum |x| (l2 == 0) or sum x^2 (l2 == 1) */
    float (*sign_put)(const float *x, size_t n, uint8_t *bits, int l2);
    void (*sign_apply)(const uint8_t *bits, size_t n, float scale, float *out, int mode);
    /* sums of squares: float lanes (qsgd) and double lanes (clipping norm) */
    float (*sumsq)(const float *x, size_t n);
    double (*sumsq_d)(const float *x, size_t n);
    /* index of the first NaN/Inf, n if none */
    size_t (*first_bad)(const float *x, size_t n);
    /* e += a * g; DGC momentum correction u = m*u + a*g, v += u */
    void (*axpy)(float *e, const float *g, size_t n, float a);
    void (*dgc)(float *u, float *v, const float *g, size_t n, float m, float a);
    /* selection: histogram of |x| bits >> 15 into hist[0..65536); hist has 131072
     * counters, all zeroed by the caller (the upper half is a second lane); collect
     * i for |x| bits >= thr (thr >= 1), storing at most cap indices in idx and their
     * values x[i] in val (so no later pass gathers them from x), returning the count;
     * *bad set if a NaN/Inf was seen */
    void (*hist16)(const float *x, size_t n, uint32_t *hist);
    size_t (*collect_ge)(const float *x, size_t n, uint32_t thr, uint32_t *idx, float *val,
                         size_t cap, int *bad);
    /* dst = e + a * g (dst == e: in place; else the two do not overlap), then collect_ge
     * over dst; with zero, each stored element of dst is then set to 0 (the residual of a
     * value sent exactly: the caller restores those it does not send from val) */
    size_t (*axpy_collect_ge)(float *dst, const float *e, const float *g, size_t n, float a,
                              uint32_t thr, uint32_t *idx, float *val, size_t cap, int *bad,
                              int zero);
    /* e += a * g, then acc[j] += |e_i| (l2 == 0) or e_i^2 (l2 == 1) for i = 8t + j: the
     * lanes of sign_put, continued across calls (n a multiple of 8 except at the end) */
    void (*axpy_abssum)(float *e, const float *g, size_t n, float a, int l2, float *acc);
    /* QSGD codes, one byte each: level of |x| * f rounded up with probability equal to its
     * fraction, drawn from hash32(hash32(base + i + klo) ^ khi), offset binary s -/+ level;
     * and e -= (code - s) * f, the decoded value subtracted (f = norm / s) */
    void (*qsgd_codes)(const float *x, size_t n, float f, uint32_t s, uint32_t base, uint32_t klo,
                       uint32_t khi, uint8_t *codes);
    void (*qsgd_sub)(const uint8_t *codes, size_t n, uint32_t s, float f, float *e);
    /* QSGD decode: codes [i, i+n) of a packed stream of plen bytes (B-bit codes, LSB
     * first; see values.c) applied to out[0..n) as (float)(code - s) * f, the decoder's
     * only rounding; reads nothing past plen. qsgd_bad: whether any of the first n codes
     * is 2^B - 1, the one B-bit pattern above 2s. */
    void (*qsgd_apply)(const uint8_t *packed, size_t plen, size_t i, size_t n, unsigned B,
                       uint32_t s, float f, float *out, int mode);
    int (*qsgd_bad)(const uint8_t *packed, size_t plen, size_t n, unsigned B);
    /* dst[0..n) = src[0..n) with stores that bypass the cache where the CPU has them (for
     * outputs far larger than the caches: no read for ownership of each line); ordered
     * before the function returns */
    void (*stream_copy)(float *dst, const float *src, size_t n);
} gcoll_kernels_t;

/* The table in force (see gcoll_simd_set). */
const gcoll_kernels_t *gcoll_kernels(void);

/* AVX2 replacements for the loops the compiler cannot vectorize well (kernels_avx2.c). */
int gcoll_k_f16_put_avx2(const float *x, size_t n, uint8_t *out);
size_t gcoll_k_first_bad_avx2(const float *x, size_t n);
void gcoll_k_stream_copy_avx2(float *dst, const float *src, size_t n);
void gcoll_k_f16_apply_avx2(const uint8_t *p, size_t n, float *out, int mode);
float gcoll_k_sign_put_avx2(const float *x, size_t n, uint8_t *bits, int l2);
size_t gcoll_k_collect_ge_avx2(const float *x, size_t n, uint32_t thr, uint32_t *idx, float *val,
                               size_t cap, int *bad);
int gcoll_k_bf16_put_avx2(const float *x, size_t n, uint8_t *out);
void gcoll_k_q8_put_avx2(const float *x, size_t n, float inv, int8_t *codes);
void gcoll_k_sign_apply_avx2(const uint8_t *bits, size_t n, float scale, float *out, int mode);
size_t gcoll_k_axpy_collect_ge_avx2(float *dst, const float *e, const float *g, size_t n, float a,
                                    uint32_t thr, uint32_t *idx, float *val, size_t cap, int *bad,
                                    int zero);
void gcoll_k_qsgd_apply_avx2(const uint8_t *packed, size_t plen, size_t i, size_t n, unsigned B,
                             uint32_t s, float f, float *out, int mode);
int gcoll_k_qsgd_bad_avx2(const uint8_t *packed, size_t plen, size_t n, unsigned B);
void gcoll_k_qsgd_codes_avx2(const float *x, size_t n, float f, uint32_t s, uint32_t base,
                             uint32_t klo, uint32_t khi, uint8_t *codes);

/* Shared helpers for QSGD decoding (generic and AVX2): one code by its bit offset, and
 * the little-endian load of group g's bytes (eight codes start at byte g * B), of which
 * only those below plen are read. */
static inline uint32_t gcoll_qsgd_code1(const uint8_t *packed, unsigned B, uint64_t j)
{
    uint64_t bit = j * B;
    const uint8_t *q = packed + bit / 8;
    unsigned sh = (unsigned)(bit % 8);
    uint32_t v = q[0];
    if (sh + B > 8)
        v |= (uint32_t)q[1] << 8;
    return (v >> sh) & ((1u << B) - 1u);
}
static inline uint64_t gcoll_qsgd_group(const uint8_t *packed, size_t plen, size_t g, unsigned B)
{
    size_t at = g * B;
    uint64_t v = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (at + 8 <= plen) {
        memcpy(&v, packed + at, 8);
        return v;
    }
#endif
    for (size_t j = 0; j < 8 && at + j < plen; j++)
        v |= (uint64_t)packed[at + j] << (8 * j);
    return v;
}

/* Shared helpers: fixed-order combine of eight lanes. */
static inline float gcoll_lanes8_sum(const float a[8])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
static inline double gcoll_lanes8_sumd(const double a[8])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#endif /* GCOLL_COMPRESS_KERNELS_H */
