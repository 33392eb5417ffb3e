/* values_float.c: narrow float value sections: stochastic rounding for fp16/bf16, fp8 (OCP
 * OFP8 E4M3/E5M2) with a per-message scale, and OCP Microscaling MXFP8/MXFP4 blocks. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/half.h"
#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/values.h"
#include "compress/values_float.h"
#include "compress/wire.h"

/*
 * References: OCP 8-bit Floating Point Specification (OFP8) rev. 1.0 (2023) for E4M3 (bias
 * 7, no infinities, S.1111.111 the only NaN, largest normal 448) and E5M2 (bias 15, IEEE-like,
 * largest normal 57344); OCP Microscaling Formats (MX) Specification v1.0 (2023) for MXFP8
 * and MXFP4: a block of 32 elements shares an E8M0 scale X = 2^(floor(log2(max|V|)) -
 * emax_elem) (bias 127, 0xFF NaN, smallest scale 2^-127), elements are V / X in the element
 * format with values beyond its largest normal clamped to it.
 *
 * One rounding routine serves every element format: |x| / 2^d is split as an integer part
 * and a 32-bit fraction in units of the target's spacing at its binade (its exponent clamped
 * below at emin, which gives the subnormals), then rounded to nearest even or stochastically
 * (up iff fraction + r >= 2^32 for a uniform 32-bit r: probability fraction / 2^32 exactly,
 * so E[Q(v)] = v whenever v is at most the largest normal). Everything is integer
 * arithmetic on the float's bits, with no division or multiplication by the scale, so the
 * code is exact and the same on every CPU and in both kernel builds. Float subnormal inputs
 * (|x| < 2^-126) count as zero: they are below every format's reach at any scale used here.
 */

typedef gcoll_fl_fmt_t fmt_t;

static const fmt_t FMT_E4M3 = {3, -6, 8, 0x7e, 448.0f};
static const fmt_t FMT_E5M2 = {2, -14, 15, 0x7b, 57344.0f};
static const fmt_t FMT_E2M1 = {1, 0, 2, 0x7, 6.0f};
static const fmt_t FMT_F16 = {10, -14, 15, 0x7bff, 65504.0f};

static const fmt_t *elem_fmt(const gcoll_vspec_t *vs)
{
    if (vs->fmt == GCOLL_VF_MXFP4)
        return &FMT_E2M1;
    return vs->bits == GCOLL_FP8_E5M2 ? &FMT_E5M2 : &FMT_E4M3;
}

/* The magnitude code of |x| / 2^d (u: the bits of x) in format f, saturated at f's largest
 * normal; rnd: 32 random bits (stochastic), or ~0u selects round to nearest even. Written
 * without branches so the loops below vectorize. */
KBODY uint32_t round_code(uint32_t u, int32_t d, int m, int emin, int emax, uint32_t maxcode,
                          uint32_t rnd, int sr)
{
    uint32_t a = u & 0x7fffffffu;
    int32_t fe = (int32_t)(a >> 23);
    uint32_t m24 = fe ? (a & 0x7fffffu) | 0x800000u : 0u;
    int32_t e = fe ? fe - 127 - d : emin - 64;
    e = e > emax + 1 ? emax + 1 : e;
    int32_t ec = e < emin ? emin : e;
    int32_t s = 23 - m + (ec - e); /* >= 20 for fp8: v / spacing = m24 / 2^s */
    uint32_t ip = s < 32 ? m24 >> s : 0u;
    uint32_t frac = s < 32 ? m24 << (32 - s) : (s < 56 ? m24 >> (s - 32) : 0u);
    uint32_t up;
    if (sr)
        up = frac > ~rnd; /* frac + rnd >= 2^32 */
    else
        up = frac > 0x80000000u || (frac == 0x80000000u && (ip & 1u));
    uint32_t code = ((uint32_t)(ec - emin) << m) + ip + up;
    return code > maxcode ? maxcode : code;
}

KBODY uint32_t rnd_at(uint32_t i, uint32_t klo, uint32_t khi)
{
    return gcoll_hash32(gcoll_hash32(i + klo) ^ khi);
}

/* fp8: codes of x[0..n) (elements base.. of the section) at scale 2^d into out. */
KBODY void fp8_codes_body(const float *x, size_t n, int32_t d, const fmt_t f, int sr, uint32_t base,
                          uint32_t klo, uint32_t khi, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = gcoll_f32_bits(x[i]);
        uint32_t r = sr ? rnd_at(base + (uint32_t)i, klo, khi) : 0u;
        uint32_t c = round_code(u, d, f.m, f.emin, f.emax, f.maxcode, r, sr);
        out[i] = (uint8_t)(c | ((u >> 24) & 0x80u));
    }
}

/* The largest |x| bit pattern of a block (NaN/Inf: >= 0x7f800000). */
KBODY uint32_t absmax_bits_body(const float *x, size_t n)
{
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = gcoll_f32_bits(x[i]) & 0x7fffffffu;
        mx = a > mx ? a : mx;
    }
    return mx;
}

#define MX_BLOCK GCOLL_MX_BLOCK

/* MX blocks: scales into sc[0..nb), element codes (MXFP8: one byte each; MXFP4: two per
 * byte, the lower nibble first) into el. Returns the first block with a non-finite value,
 * or nb. */
KBODY size_t mx_put_body(const float *x, size_t n, const fmt_t f, int fp4, int sr, uint32_t klo,
                         uint32_t khi, uint8_t *sc, uint8_t *el)
{
    size_t nb = (n + MX_BLOCK - 1) / MX_BLOCK;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * MX_BLOCK, m = n - lo < MX_BLOCK ? n - lo : MX_BLOCK;
        const float *xb = x + lo;
        uint32_t amax = absmax_bits_body(xb, m);
        if (amax >= 0x7f800000u)
            return b;
        uint32_t s = gcoll_fl_mx_scale_code(amax, f.emax);
        sc[b] = (uint8_t)s;
        int32_t d = (int32_t)s - 127;
        uint8_t codes[MX_BLOCK];
        for (size_t i = 0; i < m; i++) {
            uint32_t u = gcoll_f32_bits(xb[i]);
            uint32_t r = sr ? rnd_at((uint32_t)(lo + i), klo, khi) : 0u;
            uint32_t c = round_code(u, d, f.m, f.emin, f.emax, f.maxcode, r, sr);
            codes[i] = (uint8_t)(c | ((u >> (fp4 ? 28 : 24)) & (fp4 ? 0x8u : 0x80u)));
        }
        if (!fp4) {
            memcpy(el + lo, codes, m);
        } else {
            if (m & 1)
                codes[m] = 0; /* the spare nibble of an odd tail is zero */
            for (size_t i = 0; i < m; i += 2)
                el[(lo + i) / 2] = (uint8_t)(codes[i] | (codes[i + 1] << 4));
        }
    }
    return nb;
}

/* fp16 / bf16 with stochastic rounding (Gupta et al. 2015; Connolly, Higham, Mary 2021 for
 * its unbiasedness): bf16 adds 16 random bits below the kept half of the float (exact for
 * normals and subnormals alike), fp16 goes through round_code. Values that would round
 * beyond the largest finite value saturate to it, as the nearest-rounding kernels do. */
KBODY int half_sr_body(const float *x, size_t n, int bf, uint32_t base, uint32_t klo, uint32_t khi,
                       uint8_t *out)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = gcoll_f32_bits(x[i]), a = u & 0x7fffffffu;
        bad |= a >= 0x7f800000u;
        uint32_t r = rnd_at(base + (uint32_t)i, klo, khi);
        uint32_t h;
        if (bf) {
            h = (a + (r >> 16)) >> 16;
            h = h > 0x7f7fu ? 0x7f7fu : h;
        } else {
            h = round_code(u, 0, FMT_F16.m, FMT_F16.emin, FMT_F16.emax, FMT_F16.maxcode, r, 1);
        }
        uint16_t o = (uint16_t)(h | ((u >> 16) & 0x8000u));
        memcpy(out + 2 * i, &o, 2);
    }
    return bad != 0;
}

/* Both builds of each loop; the AVX2 one where gcoll_simd_active() says so (same results:
 * integer arithmetic only). */
#define CLONE(ret, name, params, args)                                                             \
    CLONE2(ret, name, params, args)                                                                \
    static ret name params                                                                         \
    {                                                                                              \
        return gcoll_simd_active() == GCOLL_SIMD_AVX2 ? name##_avx2 args : name##_gen args;        \
    }

/* The format is a constant in each instance, so each loop is compiled per format. */
#define MX_INST(tag, F, FP4, SR)                                                                   \
    KBODY size_t mx_##tag##_body(const float *x, size_t n, uint32_t klo, uint32_t khi,             \
                                 uint8_t *sc, uint8_t *el)                                         \
    {                                                                                              \
        return mx_put_body(x, n, F, FP4, SR, klo, khi, sc, el);                                    \
    }                                                                                              \
    static size_t mx_##tag##_gen(const float *x, size_t n, uint32_t klo, uint32_t khi,             \
                                 uint8_t *sc, uint8_t *el)                                         \
    {                                                                                              \
        return mx_##tag##_body(x, n, klo, khi, sc, el);                                            \
    }
MX_INST(e4m3_rn, FMT_E4M3, 0, 0)
MX_INST(e4m3_sr, FMT_E4M3, 0, 1)
MX_INST(e5m2_rn, FMT_E5M2, 0, 0)
MX_INST(e5m2_sr, FMT_E5M2, 0, 1)
MX_INST(e2m1_rn, FMT_E2M1, 1, 0)
MX_INST(e2m1_sr, FMT_E2M1, 1, 1)

size_t gcoll_fl_mx_put_gen(const float *x, size_t n, const fmt_t *f, int fp4, int sr, uint32_t klo,
                           uint32_t khi, uint8_t *sc, uint8_t *el)
{
    if (fp4)
        return (sr ? mx_e2m1_sr_gen : mx_e2m1_rn_gen)(x, n, klo, khi, sc, el);
    if (f == &FMT_E5M2)
        return (sr ? mx_e5m2_sr_gen : mx_e5m2_rn_gen)(x, n, klo, khi, sc, el);
    return (sr ? mx_e4m3_sr_gen : mx_e4m3_rn_gen)(x, n, klo, khi, sc, el);
}

#define FP8_INST(tag, F, SR)                                                                       \
    KBODY int fp8_##tag##_body(const float *x, size_t n, int32_t d, uint32_t base, uint32_t klo,   \
                               uint32_t khi, uint8_t *out)                                         \
    {                                                                                              \
        fp8_codes_body(x, n, d, F, SR, base, klo, khi, out);                                       \
        return 0;                                                                                  \
    }                                                                                              \
    CLONE(int, fp8_##tag,                                                                          \
          (const float *x, size_t n, int32_t d, uint32_t base, uint32_t klo, uint32_t khi,         \
           uint8_t *out),                                                                          \
          (x, n, d, base, klo, khi, out))
FP8_INST(e4m3_rn, FMT_E4M3, 0)
FP8_INST(e4m3_sr, FMT_E4M3, 1)
FP8_INST(e5m2_rn, FMT_E5M2, 0)
FP8_INST(e5m2_sr, FMT_E5M2, 1)

KBODY uint32_t absmax_u_body(const float *x, size_t n)
{
    return absmax_bits_body(x, n);
}
CLONE(uint32_t, absmax_u, (const float *x, size_t n), (x, n))

CLONE(int, half_sr,
      (const float *x, size_t n, int bf, uint32_t base, uint32_t klo, uint32_t khi, uint8_t *out),
      (x, n, bf, base, klo, khi, out))

/* --- encode --------------------------------------------------------------------------- */

static gcoll_status_t nonfinite(const float *x, size_t n, size_t lo, const char *what)
{
    size_t i = gcoll_kernels()->first_bad(x, n);
    GCOLL_WARN("compress: %s: non-finite input %g at element %zu", what, i < n ? (double)x[i] : 0.0,
               lo + i);
    return GCOLL_ERR_INVALID;
}

int gcoll_vsec_is_float_lowp(const gcoll_vspec_t *vs)
{
    return vs->fmt == GCOLL_VF_FP8 || vs->fmt == GCOLL_VF_MXFP8 || vs->fmt == GCOLL_VF_MXFP4 ||
           ((vs->fmt == GCOLL_VF_F16 || vs->fmt == GCOLL_VF_BF16) &&
            vs->round == GCOLL_ROUND_STOCHASTIC);
}

/* The exponent d of fp8's scale 2^d: the smallest with max|x| / 2^d <= the format's largest
 * normal (a power of two, so scaling is exact), kept within [-126, 127] so that 2^d is a
 * normal float. */
static int32_t fp8_scale_exp(uint32_t amax, const fmt_t *f)
{
    int32_t fe = (int32_t)(amax >> 23);
    if (fe == 0)
        return -126;
    int32_t d = fe - 127 - f->emax + ((amax & 0x7fffffu) > (gcoll_f32_bits(f->maxval) & 0x7fffffu));
    return d < -126 ? -126 : d > 127 ? 127 : d;
}

static const float *elem_lut(const gcoll_vspec_t *vs);

/* Codes whose value times scale would overflow float become the largest that does not
 * (saturation, as fp16's encoder does; only for max|x| within a spacing of FLT_MAX). */
static void fp8_saturate(const gcoll_vspec_t *vs, uint8_t *codes, size_t n, float scale)
{
    const float *lut = elem_lut(vs);
    uint32_t top = elem_fmt(vs)->maxcode;
    while (top > 0 && (double)lut[top] * scale > 3.4028234663852886e38)
        top--;
    for (size_t i = 0; i < n; i++)
        if ((codes[i] & 0x7fu) > top)
            codes[i] = (uint8_t)((codes[i] & 0x80u) | top);
}

gcoll_status_t gcoll_vsec_float_put(const gcoll_vspec_t *vs, const float *x, size_t n, size_t lo,
                                    uint64_t key, uint8_t *out)
{
    const uint32_t klo = (uint32_t)key, khi = (uint32_t)(key >> 32);
    const int sr = vs->round == GCOLL_ROUND_STOCHASTIC;
    switch (vs->fmt) {
    case GCOLL_VF_F16:
    case GCOLL_VF_BF16:
        if (half_sr(x, n, vs->fmt == GCOLL_VF_BF16, (uint32_t)lo, klo, khi, out))
            return nonfinite(x, n, lo, "stochastic rounding");
        return GCOLL_OK;
    case GCOLL_VF_FP8: {
        if (n == 0)
            return GCOLL_OK;
        uint32_t amax = absmax_u(x, n);
        if (amax >= 0x7f800000u)
            return nonfinite(x, n, lo, "fp8");
        const fmt_t *f = elem_fmt(vs);
        int32_t d = fp8_scale_exp(amax, f);
        float scale = gcoll_bits_f32((uint32_t)(d + 127) << 23);
        memcpy(out, &scale, 4);
        size_t i = 0;
        if (gcoll_simd_active() == GCOLL_SIMD_AVX2)
            i = gcoll_fl_codes_avx2(x, n, d, f, sr, (uint32_t)lo, klo, khi, out + 4);
        const uint32_t b = (uint32_t)(lo + i);
        if (vs->bits == GCOLL_FP8_E5M2)
            (sr ? fp8_e5m2_sr : fp8_e5m2_rn)(x + i, n - i, d, b, klo, khi, out + 4 + i);
        else
            (sr ? fp8_e4m3_sr : fp8_e4m3_rn)(x + i, n - i, d, b, klo, khi, out + 4 + i);
        if (d > 126 - f->emax) /* max|x| near FLT_MAX: a value rounded up may pass it */
            fp8_saturate(vs, out + 4, n, scale);
        return GCOLL_OK;
    }
    case GCOLL_VF_MXFP8:
    case GCOLL_VF_MXFP4: {
        size_t nb = (n + MX_BLOCK - 1) / MX_BLOCK, b;
        uint8_t *el = out + nb;
        const int fp4 = vs->fmt == GCOLL_VF_MXFP4;
        if (gcoll_simd_active() == GCOLL_SIMD_AVX2)
            b = gcoll_fl_mx_put_avx2(x, n, elem_fmt(vs), fp4, sr, klo, khi, out, el);
        else
            b = gcoll_fl_mx_put_gen(x, n, elem_fmt(vs), fp4, sr, klo, khi, out, el);
        if (b < nb)
            return nonfinite(x + b * MX_BLOCK, GCOLL_MIN(n - b * MX_BLOCK, (size_t)MX_BLOCK),
                             lo + b * MX_BLOCK, "mx");
        return GCOLL_OK;
    }
    default:
        return GCOLL_ERR_INTERNAL;
    }
}

/* --- check and decode ----------------------------------------------------------------- */

/* Values of the magnitude codes of the element formats, built once. */
static float lut_e4m3[128], lut_e5m2[128], lut_e2m1[8];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_fill(float *t, const fmt_t *f)
{
    for (uint32_t c = 0; c <= f->maxcode; c++) {
        uint32_t E = c >> f->m, M = c & ((1u << f->m) - 1u);
        t[c] = E ? ldexpf(1.0f + (float)M / (float)(1u << f->m), (int)E - 1 + f->emin)
                 : ldexpf((float)M, f->emin - f->m);
    }
}

static void lut_init(void)
{
    lut_fill(lut_e4m3, &FMT_E4M3);
    lut_fill(lut_e5m2, &FMT_E5M2);
    lut_fill(lut_e2m1, &FMT_E2M1);
}

static const float *elem_lut(const gcoll_vspec_t *vs)
{
    pthread_once(&lut_once, lut_init);
    if (vs->fmt == GCOLL_VF_MXFP4)
        return lut_e2m1;
    return vs->bits == GCOLL_FP8_E5M2 ? lut_e5m2 : lut_e4m3;
}

float gcoll_float_elem_value(const gcoll_vspec_t *vs, uint32_t code)
{
    unsigned sbit = vs->fmt == GCOLL_VF_MXFP4 ? 3 : 7;
    float v = elem_lut(vs)[code & ((1u << sbit) - 1u)];
    return (code >> sbit) & 1u ? -v : v;
}

gcoll_status_t gcoll_vsec_float_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n)
{
    const fmt_t *f = elem_fmt(vs);
    uint32_t bad = 0;
    switch (vs->fmt) {
    case GCOLL_VF_FP8: {
        if (n == 0)
            return GCOLL_OK;
        float scale;
        memcpy(&scale, p, 4);
        uint32_t top = 0;
        for (uint64_t i = 0; i < n; i++)
            top = GCOLL_MAX(top, (uint32_t)(p[4 + i] & 0x7fu));
        bad |= top > f->maxcode;
        /* a finite, non-negative scale that keeps every decoded value finite */
        if (!bad &&
            !(scale >= 0.0f && (double)elem_lut(vs)[top] * scale <= 3.4028234663852886e38)) {
            GCOLL_WARN("compress: malformed message: fp8 scale %g", (double)scale);
            return GCOLL_ERR_INVALID;
        }
        break;
    }
    case GCOLL_VF_MXFP8:
    case GCOLL_VF_MXFP4: {
        uint64_t nb = (n + MX_BLOCK - 1) / MX_BLOCK;
        /* no encoder writes a scale above 2^(127 - emax) (max|x| < 2^128); beyond it a
         * block would decode to Inf. 0xFF (NaN) is beyond it too. */
        const uint32_t smax = 254u - (uint32_t)f->emax;
        for (uint64_t b = 0; b < nb; b++)
            if (p[b] > smax) {
                GCOLL_WARN("compress: malformed message: mx scale code %u of block %llu "
                           "(at most %u)",
                           p[b], (unsigned long long)b, smax);
                return GCOLL_ERR_INVALID;
            }
        const uint8_t *el = p + nb;
        if (vs->fmt == GCOLL_VF_MXFP8) {
            for (uint64_t i = 0; i < n; i++)
                bad |= (el[i] & 0x7fu) > f->maxcode;
        } else if (n & 1) {
            bad |= el[n / 2] >> 4; /* the spare nibble must be zero */
        }
        break;
    }
    case GCOLL_VF_F16:
    case GCOLL_VF_BF16:
    default:
        return GCOLL_ERR_INTERNAL;
    }
    if (bad) {
        GCOLL_WARN("compress: malformed message: a NaN/Inf element code or a non-zero spare "
                   "nibble");
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

static inline void put1(float *o, float v, int mode)
{
    if (mode == GCOLL_DECODE_SET)
        *o = v;
    else if (mode == GCOLL_DECODE_ADD)
        *o += v;
    else
        *o -= v;
}

/* 2^(s - 127) for an E8M0 code s <= 254 (s = 0: the subnormal 2^-127). */
static inline float e8m0(uint32_t s)
{
    return s ? gcoll_bits_f32(s << 23) : gcoll_bits_f32(0x00400000u);
}

/* Decoded value = element * scale, the decoder's only rounding (exact: both are powers of
 * two times a few bits, and no product leaves the float range). */
void gcoll_vsec_float_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n,
                                  size_t start, size_t m, float *out, int mode)
{
    const float *lut = elem_lut(vs);
    if (m == 0) /* an empty fp8 section has no scale to read (a fuzzer found it) */
        return;
    if (vs->fmt == GCOLL_VF_FP8) {
        float scale;
        memcpy(&scale, p, 4);
        const uint8_t *c = p + 4 + start;
        size_t i = 0;
        if (gcoll_simd_active() == GCOLL_SIMD_AVX2) {
            gcoll_fl_apply8_avx2(c, 0, m / 8, elem_fmt(vs), scale, out, mode);
            i = m / 8 * 8;
        }
        for (; i < m; i++) {
            float v = lut[c[i] & 0x7fu] * scale;
            put1(out + i, c[i] & 0x80u ? -v : v, mode);
        }
        return;
    }
    uint64_t nb = (n + MX_BLOCK - 1) / MX_BLOCK;
    const uint8_t *el = p + nb;
    const int fp4 = vs->fmt == GCOLL_VF_MXFP4;
    const int avx2 = gcoll_simd_active() == GCOLL_SIMD_AVX2;
    for (size_t i = start; i < start + m;) {
        size_t b = i / MX_BLOCK, stop = GCOLL_MIN(start + m, (b + 1) * MX_BLOCK);
        const float scale = e8m0(p[b]);
        if (avx2 && !(fp4 && (i & 1)) && stop - i >= 8) {
            size_t g = (stop - i) / 8;
            gcoll_fl_apply8_avx2(fp4 ? el + i / 2 : el + i, fp4, g, elem_fmt(vs), scale,
                                 out + (i - start), mode);
            i += 8 * g;
        }
        for (; i < stop; i++) {
            uint32_t c = fp4 ? (el[i / 2] >> ((i & 1) * 4)) & 0xfu : el[i];
            uint32_t sb = fp4 ? 0x8u : 0x80u;
            float v = lut[c & (sb - 1u)] * scale;
            put1(out + (i - start), c & sb ? -v : v, mode);
        }
    }
}
