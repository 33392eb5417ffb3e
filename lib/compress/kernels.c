/* kernels.c: codec inner loops written once, compiled for generic x86-64 and for AVX2. */
#include "compress/kernels.h"

#include <cpuid.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/half.h"
#include "compress/rng.h"

/*
 * Each *_body below is plain C shaped so the vectorizer handles it (fixed eight-lane
 * accumulators, no early exits in the hot loop). CLONE2 instantiates it twice: once for
 * the baseline target and once with AVX2 enabled, and gcoll_kernels() picks a table at
 * run time from __builtin_cpu_supports. FMA is deliberately not enabled, so both clones
 * round identically. Loops the compiler cannot vectorize well have hand-written AVX2
 * versions in kernels_avx2.c.
 */

#define EXP_MASK 0x7f800000u
#define ABS_MASK 0x7fffffffu

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* out = / += / -= v, for one element; the mode switch sits outside the loops */
#define APPLY_LOOP(n, mode, out, expr)                                                             \
    do {                                                                                           \
        if ((mode) == GCOLL_DECODE_SET) {                                                          \
            for (size_t i = 0; i < (n); i++)                                                       \
                (out)[i] = (expr);                                                                 \
        } else if ((mode) == GCOLL_DECODE_ADD) {                                                   \
            for (size_t i = 0; i < (n); i++)                                                       \
                (out)[i] += (expr);                                                                \
        } else {                                                                                   \
            for (size_t i = 0; i < (n); i++)                                                       \
                (out)[i] -= (expr);                                                                \
        }                                                                                          \
    } while (0)

/* --- dense value sections ------------------------------------------------------------ */

KBODY int f32_put_body(const float *x, size_t n, uint8_t *out)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = fbits(x[i]);
        bad |= (u & EXP_MASK) == EXP_MASK;
        memcpy(out + 4 * i, &u, 4);
    }
    return bad != 0;
}
CLONE2(int, f32_put, (const float *x, size_t n, uint8_t *out), (x, n, out))

KBODY int f32_bad_body(const uint8_t *p, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (ld32(p + 4 * i) & EXP_MASK) == EXP_MASK;
    return bad != 0;
}
CLONE2(int, f32_bad, (const uint8_t *p, size_t n), (p, n))

static inline float ldf(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

KBODY int f32_apply_body(const uint8_t *p, size_t n, float *out, int mode)
{
    if (mode == GCOLL_DECODE_SET) {
        memcpy(out, p, 4 * n);
        return 0;
    }
    APPLY_LOOP(n, mode, out, ldf(p + 4 * i));
    return 0;
}
CLONE2(int, f32_apply, (const uint8_t *p, size_t n, float *out, int mode), (p, n, out, mode))
static void f32_apply_gen_v(const uint8_t *p, size_t n, float *out, int mode)
{
    (void)f32_apply_gen(p, n, out, mode);
}
static void f32_apply_avx2_v(const uint8_t *p, size_t n, float *out, int mode)
{
    (void)f32_apply_avx2(p, n, out, mode);
}

/* Finite values beyond fp16's range saturate to +-65504 rather than become Inf (which
 * no decoder accepts); error feedback keeps the excess. */
static int f16_put_gen(const float *x, size_t n, uint8_t *out)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad |= (fbits(x[i]) & EXP_MASK) == EXP_MASK;
        float v = x[i] > 65504.0f ? 65504.0f : (x[i] < -65504.0f ? -65504.0f : x[i]);
        uint16_t h = gcoll_f32_to_f16(v);
        memcpy(out + 2 * i, &h, 2);
    }
    return bad != 0;
}

KBODY int f16_bad_body(const uint8_t *p, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (ld16(p + 2 * i) & 0x7c00u) == 0x7c00u;
    return bad != 0;
}
CLONE2(int, f16_bad, (const uint8_t *p, size_t n), (p, n))

static void f16_apply_gen(const uint8_t *p, size_t n, float *out, int mode)
{
    APPLY_LOOP(n, mode, out, gcoll_f16_to_f32(ld16(p + 2 * i)));
}

/* bf16 without the NaN branch of gcoll_f32_to_bf16: NaN/Inf input is rejected anyway,
 * and finite values round identically, except that those which would round up to Inf
 * (|x| >= 0x7f7f8000) saturate to the largest finite bf16. */
KBODY int bf16_put_body(const float *x, size_t n, uint8_t *out)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = fbits(x[i]);
        bad |= (u & EXP_MASK) == EXP_MASK;
        uint16_t r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        uint16_t sat = (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
        uint16_t h = (u & ABS_MASK) >= 0x7f7f8000u ? sat : r;
        memcpy(out + 2 * i, &h, 2);
    }
    return bad != 0;
}
static int bf16_put_gen(const float *x, size_t n, uint8_t *out)
{
    return bf16_put_body(x, n, out);
}

KBODY int bf16_bad_body(const uint8_t *p, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (ld16(p + 2 * i) & 0x7f80u) == 0x7f80u;
    return bad != 0;
}
CLONE2(int, bf16_bad, (const uint8_t *p, size_t n), (p, n))

static inline float bf16f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
KBODY int bf16_apply_body(const uint8_t *p, size_t n, float *out, int mode)
{
    APPLY_LOOP(n, mode, out, bf16f(ld16(p + 2 * i)));
    return 0;
}
CLONE2(int, bf16_apply, (const uint8_t *p, size_t n, float *out, int mode), (p, n, out, mode))
static void bf16_apply_gen_v(const uint8_t *p, size_t n, float *out, int mode)
{
    (void)bf16_apply_gen(p, n, out, mode);
}
static void bf16_apply_avx2_v(const uint8_t *p, size_t n, float *out, int mode)
{
    (void)bf16_apply_avx2(p, n, out, mode);
}

/* --- q8 ------------------------------------------------------------------------------ */

KBODY float absmax_body(const float *x, size_t n)
{
    uint32_t m[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            uint32_t a = fbits(x[i + j]) & ABS_MASK;
            m[j] = a > m[j] ? a : m[j];
        }
    for (int j = 0; i + (size_t)j < n; j++) {
        uint32_t a = fbits(x[i + j]) & ABS_MASK;
        m[j] = a > m[j] ? a : m[j];
    }
    uint32_t r = 0;
    for (int j = 0; j < 8; j++)
        r = m[j] > r ? m[j] : r;
    if (r >= EXP_MASK)
        return INFINITY;
    float f;
    memcpy(&f, &r, 4);
    return f;
}
CLONE2(float, absmax, (const float *x, size_t n), (x, n))

/* Round to nearest even by the 1.5*2^23 trick (|v| <= 127.x here), which vectorizes
 * where lrintf does not. */
KBODY int q8_put_body(const float *x, size_t n, float inv, int8_t *codes)
{
    const float magic = 12582912.0f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        float r = (v + magic) - magic;
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        /* callers reject non-finite buckets; this keeps a NaN from ever reaching the
         * float-to-int conversion, which would be undefined (a fuzzer found a path) */
        r = r == r ? r : 0.0f;
        codes[i] = (int8_t)(int)r;
    }
    return 0;
}
static int q8_put_gen(const float *x, size_t n, float inv, int8_t *codes)
{
    return q8_put_body(x, n, inv, codes);
}
static void q8_put_gen_v(const float *x, size_t n, float inv, int8_t *codes)
{
    (void)q8_put_gen(x, n, inv, codes);
}

KBODY int q8_apply_body(const int8_t *codes, size_t n, float scale, float *out, int mode)
{
    APPLY_LOOP(n, mode, out, (float)codes[i] * scale);
    return 0;
}
CLONE2(int, q8_apply, (const int8_t *codes, size_t n, float scale, float *out, int mode),
       (codes, n, scale, out, mode))
static void q8_apply_gen_v(const int8_t *c, size_t n, float s, float *out, int mode)
{
    (void)q8_apply_gen(c, n, s, out, mode);
}
static void q8_apply_avx2_v(const int8_t *c, size_t n, float s, float *out, int mode)
{
    (void)q8_apply_avx2(c, n, s, out, mode);
}

/* --- sign ---------------------------------------------------------------------------- */

static float sign_put_gen(const float *x, size_t n, uint8_t *bits, int l2)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned b = 0;
        for (int j = 0; j < 8; j++) {
            uint32_t u = fbits(x[i + j]);
            b |= (u >> 31) << j;
            float a = fabsf(x[i + j]);
            acc[j] += l2 ? a * a : a;
        }
        bits[i / 8] = (uint8_t)b;
    }
    if (i < n) {
        unsigned b = 0;
        for (int j = 0; i + (size_t)j < n; j++) {
            b |= (fbits(x[i + j]) >> 31) << j;
            float a = fabsf(x[i + j]);
            acc[j] += l2 ? a * a : a;
        }
        bits[i / 8] = (uint8_t)b;
    }
    return gcoll_lanes8_sum(acc);
}

static void sign_apply_gen(const uint8_t *bits, size_t n, float scale, float *out, int mode)
{
    APPLY_LOOP(n, mode, out, ((bits[i >> 3] >> (i & 7)) & 1) ? -scale : scale);
}

/* --- reductions and feedback updates ------------------------------------------------- */

KBODY float sumsq_body(const float *x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += x[i + j] * x[i + j];
    for (int j = 0; i + (size_t)j < n; j++)
        acc[j] += x[i + j] * x[i + j];
    return gcoll_lanes8_sum(acc);
}
CLONE2(float, sumsq, (const float *x, size_t n), (x, n))

KBODY double sumsq_d_body(const float *x, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)x[i + j] * (double)x[i + j];
    for (int j = 0; i + (size_t)j < n; j++)
        acc[j] += (double)x[i + j] * (double)x[i + j];
    return gcoll_lanes8_sumd(acc);
}
CLONE2(double, sumsq_d, (const float *x, size_t n), (x, n))

KBODY size_t first_bad_body(const float *x, size_t n)
{
    size_t i = 0;
    for (; i < n; i += 256) {
        size_t m = GCOLL_MIN(n - i, (size_t)256);
        uint32_t bad = 0;
        for (size_t j = 0; j < m; j++)
            bad |= (fbits(x[i + j]) & EXP_MASK) == EXP_MASK;
        if (bad)
            break;
    }
    for (; i < n; i++)
        if ((fbits(x[i]) & EXP_MASK) == EXP_MASK)
            return i;
    return n;
}
static size_t first_bad_gen(const float *x, size_t n)
{
    return first_bad_body(x, n);
}

KBODY int axpy_body(float *e, const float *g, size_t n, float a)
{
    if (a == 1.0f)
        for (size_t i = 0; i < n; i++)
            e[i] += g[i];
    else
        for (size_t i = 0; i < n; i++)
            e[i] += a * g[i];
    return 0;
}
CLONE2(int, axpy, (float *e, const float *g, size_t n, float a), (e, g, n, a))
static void axpy_gen_v(float *e, const float *g, size_t n, float a)
{
    (void)axpy_gen(e, g, n, a);
}
static void axpy_avx2_v(float *e, const float *g, size_t n, float a)
{
    (void)axpy_avx2(e, g, n, a);
}

/* DGC momentum correction (Lin et al. 2018, Algorithm 1): u = m*u + g; v += u. */
KBODY int dgc_body(float *u, float *v, const float *g, size_t n, float m, float a)
{
    for (size_t i = 0; i < n; i++) {
        float ui = m * u[i] + a * g[i];
        u[i] = ui;
        v[i] += ui;
    }
    return 0;
}
CLONE2(int, dgc, (float *u, float *v, const float *g, size_t n, float m, float a),
       (u, v, g, n, m, a))
static void dgc_gen_v(float *u, float *v, const float *g, size_t n, float m, float a)
{
    (void)dgc_gen(u, v, g, n, m, a);
}
static void dgc_avx2_v(float *u, float *v, const float *g, size_t n, float m, float a)
{
    (void)dgc_avx2(u, v, g, n, m, a);
}

/* --- selection ----------------------------------------------------------------------- */

KBODY int hist16_body(const float *x, size_t n, uint32_t *hist)
{
    /* two interleaved histograms halve store-forwarding stalls on runs of equal values */
    uint32_t *h2 = hist + 65536;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        hist[(fbits(x[i]) & ABS_MASK) >> 15]++;
        h2[(fbits(x[i + 1]) & ABS_MASK) >> 15]++;
    }
    if (i < n)
        hist[(fbits(x[i]) & ABS_MASK) >> 15]++;
    for (size_t b = 0; b < 65536; b++)
        hist[b] += h2[b];
    return 0;
}
CLONE2(int, hist16, (const float *x, size_t n, uint32_t *hist), (x, n, hist))
static void hist16_gen_v(const float *x, size_t n, uint32_t *h)
{
    (void)hist16_gen(x, n, h);
}
static void hist16_avx2_v(const float *x, size_t n, uint32_t *h)
{
    (void)hist16_avx2(x, n, h);
}

/* The sign scale's sum, taken as the axpy writes e: lane j accumulates elements 8t + j
 * in the order sign_put does, so the scale comes out identical. */
KBODY int axpy_abssum_body(float *e, const float *g, size_t n, float a, int l2, float *acc)
{
    float l[8];
    memcpy(l, acc, sizeof(l));
    size_t i = 0;
    if (l2) {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                float x = e[i + j] + a * g[i + j];
                e[i + j] = x;
                l[j] += x * x;
            }
    } else {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                float x = e[i + j] + a * g[i + j];
                e[i + j] = x;
                l[j] += fabsf(x);
            }
    }
    for (int j = 0; i + (size_t)j < n; j++) {
        float x = e[i + j] + a * g[i + j];
        e[i + j] = x;
        l[j] += l2 ? x * x : fabsf(x);
    }
    memcpy(acc, l, sizeof(l));
    return 0;
}
CLONE2(int, axpy_abssum, (float *e, const float *g, size_t n, float a, int l2, float *acc),
       (e, g, n, a, l2, acc))
static void axpy_abssum_gen_v(float *e, const float *g, size_t n, float a, int l2, float *acc)
{
    (void)axpy_abssum_gen(e, g, n, a, l2, acc);
}
static void axpy_abssum_avx2_v(float *e, const float *g, size_t n, float a, int l2, float *acc)
{
    (void)axpy_abssum_avx2(e, g, n, a, l2, acc);
}

/* --- qsgd ---------------------------------------------------------------------------- */

/* Stochastic rounding of QSGD (Alistarh et al. 2017); see values.c for the format. */
static void qsgd_codes_gen(const float *x, size_t n, float f, uint32_t s, uint32_t base,
                           uint32_t klo, uint32_t khi, uint8_t *codes)
{
    for (size_t i = 0; i < n; i++) {
        float r = fabsf(x[i]) * f;
        uint32_t l = (uint32_t)r;
        float frac = r - (float)l;
        uint32_t h = gcoll_hash32(gcoll_hash32(base + (uint32_t)i + klo) ^ khi);
        l += gcoll_u01(h) < frac;
        l = l > s ? s : l;
        codes[i] = (uint8_t)(x[i] < 0 ? s - l : s + l);
    }
}

KBODY int qsgd_sub_body(const uint8_t *codes, size_t n, uint32_t s, float f, float *e)
{
    for (size_t i = 0; i < n; i++)
        e[i] -= (float)((int32_t)codes[i] - (int32_t)s) * f;
    return 0;
}
CLONE2(int, qsgd_sub, (const uint8_t *codes, size_t n, uint32_t s, float f, float *e),
       (codes, n, s, f, e))
static void qsgd_sub_gen_v(const uint8_t *c, size_t n, uint32_t s, float f, float *e)
{
    (void)qsgd_sub_gen(c, n, s, f, e);
}
static void qsgd_sub_avx2_v(const uint8_t *c, size_t n, uint32_t s, float f, float *e)
{
    (void)qsgd_sub_avx2(c, n, s, f, e);
}

/* Inverse of values.c's qsgd_pack8: eight B-bit codes (LSB first in the low 8B bits) to
 * one byte each, halves, then quads, then pairs (B <= 8 keeps every step in its lane). */
static inline uint64_t qsgd_unpack8(uint64_t v, unsigned B)
{
    const uint64_t m4 = (1ull << (4 * B)) - 1u;
    const uint64_t m2 = ((1ull << (2 * B)) - 1u) * 0x0000000100000001ull;
    const uint64_t m1 = ((1ull << B) - 1u) * 0x0001000100010001ull;
    v = (v & m4) | (((v >> (4 * B)) & m4) << 32);
    v = (v & m2) | (((v >> (2 * B)) & m2) << 16);
    return (v & m1) | (((v >> B) & m1) << 8);
}

static inline void qsgd_bytes8(uint64_t v, uint8_t *c)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(c, &v, 8);
#else
    for (int j = 0; j < 8; j++)
        c[j] = (uint8_t)(v >> (8 * j));
#endif
}

#define QSGD_DEC_RUN 256 /* codes unpacked per run of the float loop (a multiple of 8) */

/* The loose codes (before the first whole group, after the last) one at a time; whole
 * groups unpacked to bytes by SWAR, then a loop the compiler vectorizes. */
static void qsgd_apply_gen(const uint8_t *p, size_t plen, size_t i0, size_t n, unsigned B,
                           uint32_t s, float f, float *out, int mode)
{
    const int32_t si = (int32_t)s;
    size_t j = GCOLL_MIN(n, (8 - i0 % 8) % 8);
    APPLY_LOOP(j, mode, out, (float)((int32_t)gcoll_qsgd_code1(p, B, i0 + i) - si) * f);
    uint8_t c[QSGD_DEC_RUN];
    while (n - j >= 8) {
        size_t m = GCOLL_MIN(n - j, (size_t)QSGD_DEC_RUN) & ~(size_t)7;
        size_t g0 = (i0 + j) / 8;
        for (size_t t = 0; t < m; t += 8)
            qsgd_bytes8(qsgd_unpack8(gcoll_qsgd_group(p, plen, g0 + t / 8, B), B), c + t);
        float *o = out + j;
        APPLY_LOOP(m, mode, o, (float)((int32_t)c[i] - si) * f);
        j += m;
    }
    const uint8_t *pp = p;
    size_t base = i0 + j;
    float *o = out + j;
    APPLY_LOOP(n - j, mode, o, (float)((int32_t)gcoll_qsgd_code1(pp, B, base + i) - si) * f);
}

/* Any byte of the unpacked groups equal to 2^B - 1: the exact zero-byte test on v ^ top. */
static int qsgd_bad_gen(const uint8_t *p, size_t plen, size_t n, unsigned B)
{
    const uint32_t top = (1u << B) - 1u;
    const uint64_t rep = (uint64_t)top * 0x0101010101010101ull;
    uint64_t bad = 0;
    size_t g = 0;
    for (; 8 * g + 8 <= n; g++) {
        uint64_t t = qsgd_unpack8(gcoll_qsgd_group(p, plen, g, B), B) ^ rep;
        bad |= (t - 0x0101010101010101ull) & ~t & 0x8080808080808080ull;
    }
    int any = bad != 0;
    for (size_t i = 8 * g; i < n; i++)
        any |= gcoll_qsgd_code1(p, B, i) == top;
    return any;
}

/* Threshold selection over x[i, i+m), m <= 8: indices and values appended at *cnt (stored
 * while there is room), *bad set on NaN/Inf. A block with nothing selected costs one test. */
static inline void collect_block(const float *x, size_t i, size_t m, uint32_t thr, uint32_t *idx,
                                 float *val, size_t cap, size_t *cnt, int *bad, float *zero_at)
{
    uint32_t any = 0;
    for (size_t j = 0; j < m; j++)
        any |= (fbits(x[i + j]) & ABS_MASK) >= thr;
    if (!any)
        return;
    for (size_t j = 0; j < m; j++) {
        uint32_t a = fbits(x[i + j]) & ABS_MASK;
        if (a >= thr) {
            if (a >= EXP_MASK)
                *bad = 1;
            if (*cnt < cap) {
                idx[*cnt] = (uint32_t)(i + j);
                val[*cnt] = x[i + j];
                if (zero_at)
                    zero_at[i + j] = 0.0f;
            }
            (*cnt)++;
        }
    }
}

static size_t collect_ge_gen(const float *x, size_t n, uint32_t thr, uint32_t *idx, float *val,
                             size_t cap, int *bad)
{
    size_t cnt = 0;
    for (size_t i = 0; i < n; i += 8)
        collect_block(x, i, GCOLL_MIN(n - i, (size_t)8), thr, idx, val, cap, &cnt, bad, NULL);
    return cnt;
}

/* Threshold selection fused with the feedback update, eight elements at a time. */
static size_t axpy_collect_ge_gen(float *dst, const float *e, const float *g, size_t n, float a,
                                  uint32_t thr, uint32_t *idx, float *val, size_t cap, int *bad,
                                  int zero)
{
    size_t cnt = 0;
    for (size_t i = 0; i < n; i += 8) {
        size_t m = GCOLL_MIN(n - i, (size_t)8);
        for (size_t j = 0; j < m; j++)
            dst[i + j] = e[i + j] + a * g[i + j];
        collect_block(dst, i, m, thr, idx, val, cap, &cnt, bad, zero ? dst : NULL);
    }
    return cnt;
}

static void stream_copy_gen(float *dst, const float *src, size_t n)
{
    memcpy(dst, src, n * sizeof(float));
}

/* --- dispatch ------------------------------------------------------------------------ */

static const gcoll_kernels_t k_generic = {
    .f32_put = f32_put_gen,
    .f32_bad = f32_bad_gen,
    .f32_apply = f32_apply_gen_v,
    .f16_put = f16_put_gen,
    .f16_bad = f16_bad_gen,
    .f16_apply = f16_apply_gen,
    .bf16_put = bf16_put_gen,
    .bf16_bad = bf16_bad_gen,
    .bf16_apply = bf16_apply_gen_v,
    .absmax = absmax_gen,
    .q8_put = q8_put_gen_v,
    .q8_apply = q8_apply_gen_v,
    .sign_put = sign_put_gen,
    .sign_apply = sign_apply_gen,
    .sumsq = sumsq_gen,
    .sumsq_d = sumsq_d_gen,
    .first_bad = first_bad_gen,
    .axpy = axpy_gen_v,
    .dgc = dgc_gen_v,
    .hist16 = hist16_gen_v,
    .collect_ge = collect_ge_gen,
    .axpy_abssum = axpy_abssum_gen_v,
    .axpy_collect_ge = axpy_collect_ge_gen,
    .qsgd_codes = qsgd_codes_gen,
    .qsgd_sub = qsgd_sub_gen_v,
    .qsgd_apply = qsgd_apply_gen,
    .qsgd_bad = qsgd_bad_gen,
    .stream_copy = stream_copy_gen,
};

static const gcoll_kernels_t k_avx2 = {
    .f32_put = f32_put_avx2,
    .f32_bad = f32_bad_avx2,
    .f32_apply = f32_apply_avx2_v,
    .f16_put = gcoll_k_f16_put_avx2,
    .f16_bad = f16_bad_avx2,
    .f16_apply = gcoll_k_f16_apply_avx2,
    .bf16_put = gcoll_k_bf16_put_avx2,
    .bf16_bad = bf16_bad_avx2,
    .bf16_apply = bf16_apply_avx2_v,
    .absmax = absmax_avx2,
    .q8_put = gcoll_k_q8_put_avx2,
    .q8_apply = q8_apply_avx2_v,
    .sign_put = gcoll_k_sign_put_avx2,
    .sign_apply = gcoll_k_sign_apply_avx2,
    .sumsq = sumsq_avx2,
    .sumsq_d = sumsq_d_avx2,
    .first_bad = gcoll_k_first_bad_avx2,
    .axpy = axpy_avx2_v,
    .dgc = dgc_avx2_v,
    .hist16 = hist16_avx2_v,
    .collect_ge = gcoll_k_collect_ge_avx2,
    .axpy_collect_ge = gcoll_k_axpy_collect_ge_avx2,
    .axpy_abssum = axpy_abssum_avx2_v,
    .qsgd_codes = gcoll_k_qsgd_codes_avx2,
    .qsgd_sub = qsgd_sub_avx2_v,
    .qsgd_apply = gcoll_k_qsgd_apply_avx2,
    .qsgd_bad = gcoll_k_qsgd_bad_avx2,
    .stream_copy = gcoll_k_stream_copy_avx2,
};

static const gcoll_kernels_t *k_cur;
static gcoll_simd_t simd_cur;

/* AVX2 (which implies OS support for the YMM state) plus F16C, read from CPUID leaf 1
 * since not every compiler knows "f16c" as a __builtin_cpu_supports feature. */
static int cpu_has_avx2(void)
{
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_F16C) && (c & bit_POPCNT);
}

gcoll_simd_t gcoll_simd_set(gcoll_simd_t level)
{
    if (level == GCOLL_SIMD_AUTO) {
        /* GCOLL_CODEC_SIMD=generic forces the fallback (CI runs the tests both ways) */
        const char *env = getenv("GCOLL_CODEC_SIMD");
        if (env && (!strcasecmp(env, "generic") || !strcasecmp(env, "scalar")))
            level = GCOLL_SIMD_GENERIC;
        else if (env && *env && strcasecmp(env, "auto") && strcasecmp(env, "avx2"))
            GCOLL_WARN("compress: GCOLL_CODEC_SIMD=%s not understood (auto|generic|avx2)", env);
        if (level == GCOLL_SIMD_AUTO)
            level = cpu_has_avx2() ? GCOLL_SIMD_AVX2 : GCOLL_SIMD_GENERIC;
    }
    if (level == GCOLL_SIMD_AVX2 && !cpu_has_avx2()) {
        GCOLL_WARN("compress: AVX2 kernels requested but this CPU lacks AVX2/F16C");
        level = GCOLL_SIMD_GENERIC;
    }
    const gcoll_kernels_t *k = level == GCOLL_SIMD_AVX2 ? &k_avx2 : &k_generic;
    __atomic_store_n(&simd_cur, level, __ATOMIC_RELAXED);
    __atomic_store_n(&k_cur, k, __ATOMIC_RELEASE);
    GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS, "compress: using %s kernels", gcoll_simd_name(level));
    return level;
}

const gcoll_kernels_t *gcoll_kernels(void)
{
    const gcoll_kernels_t *k = __atomic_load_n(&k_cur, __ATOMIC_ACQUIRE);
    if (GCOLL_UNLIKELY(k == NULL)) {
        gcoll_simd_set(GCOLL_SIMD_AUTO);
        k = __atomic_load_n(&k_cur, __ATOMIC_ACQUIRE);
    }
    return k;
}

gcoll_simd_t gcoll_simd_active(void)
{
    (void)gcoll_kernels();
    return __atomic_load_n(&simd_cur, __ATOMIC_RELAXED);
}

const char *gcoll_simd_name(gcoll_simd_t level)
{
    switch (level) {
    case GCOLL_SIMD_GENERIC:
        return "generic";
    case GCOLL_SIMD_AVX2:
        return "avx2";
    default:
        return "auto";
    }
}
