/* values.c: value sections: f32/fp16/bf16 casts, q8, QSGD and sign quantizers, encode and decode.
 */
#include "compress/values.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/wire.h"

static inline float ldf(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}
static inline void stf(uint8_t *p, float f)
{
    memcpy(p, &f, 4);
}

static uint32_t qsgd_s(unsigned bits)
{
    return (1u << (bits - 1)) - 1u;
}

/* QSGD's relative variance for a bucket of m values and s levels (Alistarh et al. 2017,
 * lemma 3.1): E||Q(x) - x||^2 <= omega ||x||^2, omega = min(m / s^2, sqrt(m) / s). */
double gcoll_qsgd_omega(unsigned bits, size_t m)
{
    double s = (double)qsgd_s(bits), md = (double)m;
    return fmin(md / (s * s), sqrt(md) / s);
}

/* Packs B-bit codes (each < 2^B, one per byte) LSB-first into out, which has room bytes
 * left: eight codes fill B bytes, so a run starting at an element that is a multiple of 8
 * starts on a byte. Only the message's last run may end inside a group; its last byte
 * keeps the spare bits zero. SWAR: pairs, then quads, then the two halves are joined. */
static inline uint64_t qsgd_pack8(uint64_t v, unsigned B)
{
    v = (v & 0x00ff00ff00ff00ffull) | ((v & 0xff00ff00ff00ff00ull) >> (8 - B));
    v = (v & 0x0000ffff0000ffffull) | ((v & 0xffff0000ffff0000ull) >> (16 - 2 * B));
    return (v & 0xffffffffull) | ((v >> 32) << (4 * B));
}

static void qsgd_pack(const uint8_t *c, size_t n, unsigned B, uint8_t *out, size_t room)
{
    size_t i = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* whole groups with 8 bytes of room: one load, one store (the bytes past B are
     * rewritten by the next group) */
    for (; i + 8 <= n && room >= 8; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        v = qsgd_pack8(v, B);
        memcpy(out, &v, 8);
        out += B;
        room -= B;
    }
#endif
    for (; i < n; i += 8) {
        size_t m = GCOLL_MIN(n - i, (size_t)8), nbytes = (m * B + 7) / 8;
        uint64_t v = 0;
        for (size_t j = 0; j < m; j++)
            v |= (uint64_t)c[i + j] << (8 * j);
        v = qsgd_pack8(v, B);
        for (size_t j = 0; j < nbytes; j++)
            out[j] = (uint8_t)(v >> (8 * j));
        out += nbytes;
    }
}

/* QSGD (Alistarh et al. 2017, sec. 3.1): with s = 2^(B-1)-1 levels per sign and the
 * bucket's l2 norm, |x|/norm*s is rounded up with probability equal to its fractional
 * part, so E[decode] = x. Level and sign travel as one B-bit code in offset binary
 * (code = s + sign*level in [0, 2s]): 2^B - 1 values.
 *
 * Encodes elements [lo, lo+m) of a section of n values from x[0..m): lo starts a bucket
 * and is a multiple of 8, lo+m ends one (or is n). Codes are computed into codes[] in runs
 * of cap (a multiple of 8) and packed; with cap >= m, codes[0..m) holds them all after. */
/* The contractive form of QSGD that the encode sends when it feeds its error back: the
 * bucket's levels are spaced max|x| / s and every value is rounded to the nearest one,
 * deterministically. Each value's error is at most min(|x_j|, max / 2s) and the largest is
 * exact, so ||Q(x) - x||^2 <= (1 - delta) ||x||^2 with delta >= 1 / (1 + (m - 1) / (4 s^2))
 * for a bucket of m values, and typically near 1 - 1 / (12 s^2 r) with r = ||x||^2 / (m
 * max^2) (uniform rounding error). This is the scaled quantizer of EF-SGD (Karimireddy et
 * al. 2019; Stich et al. 2018 for the contraction); the unbiased, stochastically rounded
 * QSGD of Alistarh et al. 2017 with its l2 scale is sent without feedback. */
static void qsgd_codes_nearest(const float *x, size_t n, float f, uint32_t s, uint8_t *codes)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)(fabsf(x[i]) * f + 0.5f);
        l = l > s ? s : l;
        codes[i] = (uint8_t)(x[i] < 0 ? s - l : s + l);
    }
}

static gcoll_status_t qsgd_put_span(const gcoll_vspec_t *vs, const float *x, size_t n, size_t lo,
                                    size_t m, uint64_t key, uint8_t *out, uint8_t *codes,
                                    size_t cap)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    const uint32_t s = qsgd_s(vs->bits);
    const unsigned B = vs->bits;
    const uint32_t k_lo = (uint32_t)key, k_hi = (uint32_t)(key >> 32);
    uint8_t *packed = out + 4 * nb;
    const size_t plen = (n * B + 7) / 8;
    size_t t0 = lo, tn = 0; /* element held in codes[0], codes held */
    for (size_t i = lo; i < lo + m;) {
        size_t b = i / vs->bucket, bend = GCOLL_MIN(n, (b + 1) * (size_t)vs->bucket);
        float scale, f;
        if (vs->contract) { /* with error feedback: levels max|x| / s apart, nearest */
            scale = k->absmax(x + (i - lo), bend - i);
            if (!(scale <= 3.4028234e38f / 2)) { /* the decoder's bound on scales */
                GCOLL_WARN("compress: qsgd: non-finite value or a value beyond 1.7e38 in "
                           "bucket %zu (elements %zu..%zu)",
                           b, i, bend - 1);
                return GCOLL_ERR_INVALID;
            }
        } else {
            scale = sqrtf(k->sumsq(x + (i - lo), bend - i));
            if (!isfinite(scale)) {
                /* float squares overflow from |x| ~ 1.8e19: the norm itself may still fit */
                double nd = sqrt(k->sumsq_d(x + (i - lo), bend - i));
                if (!(nd <= 3.4028234e38 / 2)) { /* the decoder's bound on norms */
                    GCOLL_WARN("compress: qsgd: non-finite value or a norm beyond float range "
                               "in bucket %zu (elements %zu..%zu)",
                               b, i, bend - 1);
                    return GCOLL_ERR_INVALID;
                }
                scale = (float)nd;
            }
        }
        f = scale > 0 ? (float)s / scale : 0.0f;
        if (!(f <= 3.4028234e38f)) /* scale below ~2e-38, s/scale overflows: send zeros */
            scale = f = 0.0f;      /* (the residual keeps the bucket exactly: delta 0 here) */
        stf(out + 4 * b, scale);
        for (size_t j = i; j < bend;) {
            size_t piece = GCOLL_MIN(bend - j, cap - tn);
            if (vs->contract)
                qsgd_codes_nearest(x + (j - lo), piece, f, s, codes + tn);
            else
                k->qsgd_codes(x + (j - lo), piece, f, s, (uint32_t)j, k_lo, k_hi, codes + tn);
            tn += piece;
            j += piece;
            if (tn == cap) {
                qsgd_pack(codes, tn, B, packed + t0 / 8 * B, plen - t0 / 8 * B);
                t0 += tn;
                tn = 0;
            }
        }
        i = bend;
    }
    if (tn)
        qsgd_pack(codes, tn, B, packed + t0 / 8 * B, plen - t0 / 8 * B);
    return GCOLL_OK;
}

#define QSGD_RUN 4096 /* codes computed per packing run (a multiple of 8) */

static gcoll_status_t qsgd_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint64_t key,
                               uint8_t *out)
{
    uint8_t codes[QSGD_RUN];
    return qsgd_put_span(vs, x, n, 0, n, key, out, codes, QSGD_RUN);
}

/* Encodes elements [lo, lo+m) of a q8 section of n values from x[0..m); lo starts a
 * bucket, lo+m ends one (or is n). */
static gcoll_status_t q8_put_span(const gcoll_vspec_t *vs, const float *x, size_t n, size_t lo,
                                  size_t m, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    int8_t *codes = (int8_t *)(out + 4 * nb);
    for (size_t i = lo; i < lo + m;) {
        size_t b = i / vs->bucket, bend = GCOLL_MIN(n, (b + 1) * (size_t)vs->bucket);
        const float *xb = x + (i - lo);
        float mx = k->absmax(xb, bend - i);
        if (!isfinite(mx)) {
            GCOLL_WARN("compress: q8: non-finite value in bucket %zu (elements %zu..%zu)", b, i,
                       bend - 1);
            return GCOLL_ERR_INVALID;
        }
        float scale = mx / 127.0f, inv = mx > 0 ? 127.0f / mx : 0.0f;
        if (!(inv <= 3.4028234e38f)) /* subnormal max: 127/max overflows; send zeros */
            scale = inv = 0.0f;
        stf(out + 4 * b, scale);
        k->q8_put(xb, bend - i, inv, codes + i);
        i = bend;
    }
    return GCOLL_OK;
}

static gcoll_status_t q8_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint8_t *out)
{
    return q8_put_span(vs, x, n, 0, n, out);
}

/* Scale of sign for scale=l2 when the encode feeds back: ||x||_2 / sqrt(n) overshoots the
 * least-squares scale ||x||_1 / n by 1/r (r = ||x||_1 / (sqrt(n) ||x||_2)), and a scale
 * lambda ||x||_1 / n contracts iff lambda < 2 (delta = (2 lambda - lambda^2) r^2). Capped at
 * lambda = 1.5, dense inputs (r >= 2/3) keep the l2 scale and every input contracts with
 * delta >= 0.75 r^2 >= 0.75 / n (squares that underflow to 0 give the mean scale). */
#define SIGN_L2_CAP 1.5f
static float sign_l2_capped(float l2scale, float l1sum, size_t m)
{
    float mean = l1sum / (float)m, cap = SIGN_L2_CAP * mean;
    if (l2scale == 0.0f) /* squares of subnormal values underflow: lambda = 1 */
        return mean;
    return l2scale < cap ? l2scale : cap;
}

/* EF-SignSGD (Karimireddy et al. 2019): scale = ||x||_1 / n per chunk; 1-bit Adam (Tang et
 * al. 2021): scale = ||x||_2 / sqrt(n). Bit set = negative. */
static gcoll_status_t sign_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    uint8_t *bits = out + 4 * nb;
    size_t chunk = vs->bucket ? vs->bucket : n;
    for (uint64_t b = 0; b < nb; b++) {
        size_t lo = (size_t)(b * chunk), m = GCOLL_MIN(n - lo, chunk);
        float sum = k->sign_put(x + lo, m, bits + lo / 8, vs->sign_l2);
        float scale = vs->sign_l2 ? sqrtf(sum / (float)m) : sum / (float)m;
        if (vs->sign_l2 && vs->contract)
            scale = sign_l2_capped(scale, k->sign_put(x + lo, m, bits + lo / 8, 0), m);
        if (!isfinite(scale)) {
            GCOLL_WARN("compress: sign: non-finite value (or overflow) in chunk %llu "
                       "(elements %zu..%zu)",
                       (unsigned long long)b, lo, lo + m - 1);
            return GCOLL_ERR_INVALID;
        }
        stf(out + 4 * b, scale);
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_vsec_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint64_t key,
                              uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    int bad = 0;
    if (gcoll_vsec_is_float_lowp(vs))
        return gcoll_vsec_float_put(vs, x, n, 0, key, out);
    if (vs->fmt == GCOLL_VF_VQ) /* no state here: a cold codebook */
        return gcoll_vq_put(vs, x, n, NULL, out);
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        bad = k->f32_put(x, n, out);
        break;
    case GCOLL_VF_F16:
        bad = k->f16_put(x, n, out);
        break;
    case GCOLL_VF_BF16:
        bad = k->bf16_put(x, n, out);
        break;
    case GCOLL_VF_Q8:
        return q8_put(vs, x, n, out);
    case GCOLL_VF_QSGD:
        return qsgd_put(vs, x, n, key, out);
    case GCOLL_VF_SIGN:
        return sign_put(vs, x, n, out);
    default:
        return GCOLL_ERR_INTERNAL;
    }
    if (bad) {
        size_t i = k->first_bad(x, n);
        GCOLL_WARN("compress: non-finite input %g at element %zu", i < n ? (double)x[i] : 0.0, i);
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

/* Scales must be finite, non-negative and small enough that no decoded value overflows
 * (max_mult: the largest code magnitude a scale is multiplied by). */
static gcoll_status_t check_scales(const uint8_t *p, uint64_t nb, float max_mult, const char *what)
{
    const float lim = 3.4028234e38f / max_mult;
    for (uint64_t b = 0; b < nb; b++) {
        float f = ldf(p + 4 * b);
        if (!(f >= 0.0f && f <= lim)) {
            GCOLL_WARN("compress: malformed message: %s %llu is %g", what, (unsigned long long)b,
                       (double)f);
            return GCOLL_ERR_INVALID;
        }
    }
    return GCOLL_OK;
}

/* Bytes of packed codes in a QSGD section of n values. */
static size_t qsgd_plen(const gcoll_vspec_t *vs, uint64_t n)
{
    return (size_t)((n * vs->bits + 7) / 8);
}

gcoll_status_t gcoll_vsec_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        if (k->f32_bad(p, (size_t)n))
            goto nonfinite;
        return GCOLL_OK;
    case GCOLL_VF_F16:
        if (k->f16_bad(p, (size_t)n))
            goto nonfinite;
        return GCOLL_OK;
    case GCOLL_VF_BF16:
        if (k->bf16_bad(p, (size_t)n))
            goto nonfinite;
        return GCOLL_OK;
    case GCOLL_VF_Q8: {
        GCOLL_CHECK(check_scales(p, nb, 127.0f, "q8 scale"));
        const uint8_t *c = p + 4 * nb;
        uint32_t bad = 0;
        for (uint64_t i = 0; i < n; i++)
            bad |= c[i] == 0x80u;
        if (bad) {
            GCOLL_WARN("compress: malformed message: q8 code -128 (range is -127..127)");
            return GCOLL_ERR_INVALID;
        }
        return GCOLL_OK;
    }
    case GCOLL_VF_QSGD: {
        GCOLL_CHECK(check_scales(p, nb, 2.0f, "qsgd norm"));
        const uint32_t s2 = 2 * qsgd_s(vs->bits);
        const uint8_t *codes = p + 4 * nb;
        /* codes are B bits wide, so the only one above 2s = 2^B - 2 is 2^B - 1: the
         * kernel looks for it, the loop below only names the first for the log */
        if (!k->qsgd_bad(codes, qsgd_plen(vs, n), (size_t)n, vs->bits))
            return GCOLL_OK;
        for (uint64_t i = 0; i < n; i++)
            if (gcoll_qsgd_code1(codes, vs->bits, i) > s2) {
                GCOLL_WARN("compress: malformed message: qsgd code at %llu exceeds %u",
                           (unsigned long long)i, s2);
                break;
            }
        return GCOLL_ERR_INVALID;
    }
    case GCOLL_VF_SIGN:
        return check_scales(p, nb, 1.0f, "sign scale");
    case GCOLL_VF_FP8:
    case GCOLL_VF_MXFP8:
    case GCOLL_VF_MXFP4:
        return gcoll_vsec_float_check(vs, p, n);
    case GCOLL_VF_VQ:
        return gcoll_vq_check(vs, p, n);
    default:
        return GCOLL_ERR_INTERNAL;
    }
nonfinite:
    GCOLL_WARN("compress: malformed message: non-finite value in payload");
    return GCOLL_ERR_INVALID;
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

void gcoll_vsec_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n, size_t start,
                            size_t m, float *out, int mode)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        k->f32_apply(p + 4 * start, m, out, mode);
        return;
    case GCOLL_VF_F16:
        k->f16_apply(p + 2 * start, m, out, mode);
        return;
    case GCOLL_VF_BF16:
        k->bf16_apply(p + 2 * start, m, out, mode);
        return;
    case GCOLL_VF_FP8:
    case GCOLL_VF_MXFP8:
    case GCOLL_VF_MXFP4:
        gcoll_vsec_float_apply_range(vs, p, n, start, m, out, mode);
        return;
    case GCOLL_VF_VQ:
        gcoll_vq_apply_range(vs, p, n, start, m, out, mode);
        return;
    default:
        break;
    }
    size_t bucket = vs->bucket ? vs->bucket : (size_t)n;
    const uint8_t *body = p + 4 * nb;
    size_t i = start, end = start + m;
    while (i < end) {
        size_t b = i / bucket;
        size_t stop = GCOLL_MIN(end, (b + 1) * bucket);
        float scale = ldf(p + 4 * b);
        float *o = out + (i - start);
        size_t cnt = stop - i;
        if (vs->fmt == GCOLL_VF_Q8) {
            k->q8_apply((const int8_t *)(body + i), cnt, scale, o, mode);
        } else if (vs->fmt == GCOLL_VF_SIGN) {
            if (i % 8 == 0) {
                k->sign_apply(body + i / 8, cnt, scale, o, mode);
            } else {
                for (size_t j = 0; j < cnt; j++) {
                    size_t e = i + j;
                    put1(o + j, ((body[e >> 3] >> (e & 7)) & 1) ? -scale : scale, mode);
                }
            }
        } else { /* QSGD: (float)(code - s) * (scale / s), in that order */
            const uint32_t s = qsgd_s(vs->bits);
            const float f = scale / (float)s;
            k->qsgd_apply(body, qsgd_plen(vs, n), i, cnt, vs->bits, s, f, o, mode);
        }
        i = stop;
    }
}

/* --- error feedback, fused ----------------------------------------------------------- */

/*
 * Encoding with error feedback is x = e + a*g, c = Q(x), e = x - D(c). Done as three
 * whole-tensor passes (axpy, quantize, decode-subtract) it moves about twice the bytes
 * it needs; here the three steps run on one block at a time while the block is in L1,
 * using the same kernels on the same elements, so the message and e come out
 * bit-identical. Blocks hold whole scale buckets, and for QSGD a multiple of 8 elements
 * so that every block's packed codes start on a byte.
 */
#define EF_BLOCK 4096           /* elements per block: e, g and codes stay in L1 */
#define EF_MAX_BLOCK (1u << 18) /* larger buckets: the unfused passes */

static size_t gcd_size(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Elements per fused block for n values, 0 when not fused. */
static size_t ef_block(const gcoll_vspec_t *vs, size_t n)
{
    size_t unit = 8;
    switch (vs->fmt) {
    case GCOLL_VF_F32:
    case GCOLL_VF_F16:
    case GCOLL_VF_BF16:
        break;
    case GCOLL_VF_Q8:
        unit = vs->bucket;
        break;
    case GCOLL_VF_QSGD:
        unit = vs->bucket / gcd_size(vs->bucket, 8) * 8;
        break;
    default:
        return 0;
    }
    size_t blk = unit >= EF_BLOCK ? unit : unit * (EF_BLOCK / unit);
    blk = GCOLL_MIN(blk, n);
    return blk <= EF_MAX_BLOCK ? blk : 0;
}

/* Encodes elements [lo, lo+m) (whole buckets) of a section of n values from x[0..m). */
static gcoll_status_t put_span(const gcoll_vspec_t *vs, const float *x, size_t n, size_t lo,
                               size_t m, uint64_t key, uint8_t *out, uint8_t *codes)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    int bad;
    if (gcoll_vsec_is_float_lowp(vs)) /* fp16/bf16 rounded stochastically (the others: unfused) */
        return gcoll_vsec_float_put(vs, x, m, lo, key, out + 2 * lo);
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        bad = k->f32_put(x, m, out + 4 * lo);
        break;
    case GCOLL_VF_F16:
        bad = k->f16_put(x, m, out + 2 * lo);
        break;
    case GCOLL_VF_BF16:
        bad = k->bf16_put(x, m, out + 2 * lo);
        break;
    case GCOLL_VF_Q8:
        return q8_put_span(vs, x, n, lo, m, out);
    case GCOLL_VF_QSGD:
        return qsgd_put_span(vs, x, n, lo, m, key, out, codes, m);
    default:
        return GCOLL_ERR_INTERNAL;
    }
    if (bad) {
        size_t i = k->first_bad(x, m);
        GCOLL_WARN("compress: non-finite input %g at element %zu", i < m ? (double)x[i] : 0.0,
                   lo + i);
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

/* e[0..m) -= D(elements [lo, lo+m)), as gcoll_vsec_apply_range(SUB) computes it; QSGD
 * takes the codes from codes[] rather than unpacking them. */
static void sub_span(const gcoll_vspec_t *vs, const uint8_t *out, size_t n, size_t lo, size_t m,
                     const uint8_t *codes, float *e)
{
    if (vs->fmt != GCOLL_VF_QSGD) {
        gcoll_vsec_apply_range(vs, out, n, lo, m, e, GCOLL_DECODE_SUB);
        return;
    }
    const gcoll_kernels_t *k = gcoll_kernels();
    const uint32_t s = qsgd_s(vs->bits);
    for (size_t i = lo; i < lo + m;) {
        size_t b = i / vs->bucket, bend = GCOLL_MIN(lo + m, (b + 1) * (size_t)vs->bucket);
        float f = ldf(out + 4 * b) / (float)s;
        k->qsgd_sub(codes + (i - lo), bend - i, s, f, e + (i - lo));
        i = bend;
    }
}

/* Sign has one scale per chunk, often the whole message: a first pass does the axpy and
 * the scale sums (so a failure leaves e == e_old + a*g), a second packs and subtracts. */
static gcoll_status_t sign_put_ef(const gcoll_vspec_t *vs, float *e, const float *g, float a,
                                  size_t n, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    uint8_t *bits = out + 4 * nb;
    size_t chunk = vs->bucket ? vs->bucket : n;
    for (uint64_t b = 0; b < nb; b++) {
        size_t lo = (size_t)(b * chunk), m = GCOLL_MIN(n - lo, chunk);
        float acc[8] = {0};
        k->axpy_abssum(e + lo, g + lo, m, a, vs->sign_l2, acc);
        float sum = gcoll_lanes8_sum(acc);
        float scale = vs->sign_l2 ? sqrtf(sum / (float)m) : sum / (float)m;
        if (vs->sign_l2 && vs->contract) /* bits rewritten by the packing pass below */
            scale = sign_l2_capped(scale, k->sign_put(e + lo, m, bits + lo / 8, 0), m);
        if (!isfinite(scale)) {
            GCOLL_WARN("compress: sign: non-finite value (or overflow) in chunk %llu "
                       "(elements %zu..%zu)",
                       (unsigned long long)b, lo, lo + m - 1);
            k->axpy(e + lo + m, g + lo + m, n - lo - m, a);
            return GCOLL_ERR_INVALID;
        }
        stf(out + 4 * b, scale);
    }
    for (size_t lo = 0; lo < n; lo += EF_BLOCK) {
        size_t m = GCOLL_MIN(n - lo, (size_t)EF_BLOCK);
        (void)k->sign_put(e + lo, m, bits + lo / 8, vs->sign_l2);
        gcoll_vsec_apply_range(vs, out, n, lo, m, e + lo, GCOLL_DECODE_SUB);
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_vsec_put_ef(const gcoll_vspec_t *vs, float *e, const float *g, float a,
                                 size_t n, uint64_t key, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    if (n == 0)
        return gcoll_vsec_put(vs, e, 0, key, out);
    if (vs->fmt == GCOLL_VF_SIGN)
        return sign_put_ef(vs, e, g, a, n, out);
    size_t blk = ef_block(vs, n);
    if (blk == 0) { /* huge buckets: no block fits in cache anyway */
        k->axpy(e, g, n, a);
        GCOLL_CHECK(gcoll_vsec_put(vs, e, n, key, out));
        gcoll_vsec_apply_range(vs, out, n, 0, n, e, GCOLL_DECODE_SUB);
        return GCOLL_OK;
    }
    uint8_t *codes = NULL;
    if (vs->fmt == GCOLL_VF_QSGD && !(codes = malloc(blk)))
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    for (size_t lo = 0; lo < n; lo += blk) {
        size_t m = GCOLL_MIN(n - lo, blk);
        k->axpy(e + lo, g + lo, m, a);
        st = put_span(vs, e + lo, n, lo, m, key, out, codes);
        if (st != GCOLL_OK) {
            /* a finite input whose sum with the residual overflows: hand the residual back
             * as e_old + a*g (the blocks already encoded get their decoded values added
             * back, exact unless the subtraction rounded) and send nothing */
            gcoll_vsec_apply_range(vs, out, n, 0, lo, e, GCOLL_DECODE_ADD);
            k->axpy(e + lo + m, g + lo + m, n - lo - m, a);
            break;
        }
        sub_span(vs, out, n, lo, m, codes, e + lo);
    }
    free(codes);
    return st;
}
