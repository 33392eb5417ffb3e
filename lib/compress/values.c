/* values.c: value sections: f32/fp16/bf16 casts, q8, QSGD and sign quantizers, encode and decode. */
#include "values.h"

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "rng.h"
#include "wire.h"

static inline float ldf(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}
static inline void stf(uint8_t *p, float f) { memcpy(p, &f, 4); }

static uint32_t qsgd_s(unsigned bits) { return (1u << (bits - 1)) - 1u; }

/* QSGD (Alistarh et al. 2017, sec. 3.1): with s = 2^(B-1)-1 levels per sign and the
 * bucket's l2 norm, |x|/norm*s is rounded up with probability equal to its fractional
 * part, so E[decode] = x. Level and sign travel as one B-bit code in offset binary
 * (code = s + sign*level in [0, 2s]): 2^B - 1 values. */
static gcoll_status_t qsgd_put(const gcoll_vspec_t *vs, const float *x, size_t n,
                               uint64_t key, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    uint8_t *codes = out + 4 * nb;
    const uint32_t s = qsgd_s(vs->bits);
    const unsigned B = vs->bits;
    const uint32_t k_lo = (uint32_t)key, k_hi = (uint32_t)(key >> 32);
    uint64_t acc = 0;
    unsigned nbits = 0;
    size_t w = 0;
    for (uint64_t b = 0; b < nb; b++) {
        size_t lo = (size_t)(b * vs->bucket), m = GCOLL_MIN(n - lo, (size_t)vs->bucket);
        const float *xb = x + lo;
        float norm = sqrtf(k->sumsq(xb, m));
        if (!isfinite(norm)) {
            GCOLL_WARN("compress: qsgd: non-finite value in bucket %llu (elements %zu..%zu)",
                       (unsigned long long)b, lo, lo + m - 1);
            return GCOLL_ERR_INVALID;
        }
        float f = norm > 0 ? (float)s / norm : 0.0f;
        if (!(f <= 3.4028234e38f)) /* norm so small that s/norm overflows: send zeros */
            norm = f = 0.0f;
        stf(out + 4 * b, norm);
        for (size_t i = 0; i < m; i++) {
            float r = fabsf(xb[i]) * f;
            uint32_t l = (uint32_t)r;
            float frac = r - (float)l;
            uint32_t h = gcoll_hash32(gcoll_hash32((uint32_t)(lo + i) + k_lo) ^ k_hi);
            l += gcoll_u01(h) < frac;
            l = l > s ? s : l;
            uint32_t code = xb[i] < 0 ? s - l : s + l;
            acc |= (uint64_t)code << nbits;
            nbits += B;
            if (nbits >= 32) {
                gcoll_put_u32(codes + w, (uint32_t)acc);
                w += 4;
                acc >>= 32;
                nbits -= 32;
            }
        }
    }
    while (nbits > 0) {
        codes[w++] = (uint8_t)acc;
        acc >>= 8;
        nbits = nbits > 8 ? nbits - 8 : 0;
    }
    return GCOLL_OK;
}

static gcoll_status_t q8_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint8_t *out)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    uint64_t nb = gcoll_vsec_buckets(vs, n);
    int8_t *codes = (int8_t *)(out + 4 * nb);
    for (uint64_t b = 0; b < nb; b++) {
        size_t lo = (size_t)(b * vs->bucket), m = GCOLL_MIN(n - lo, (size_t)vs->bucket);
        float mx = k->absmax(x + lo, m);
        if (!isfinite(mx)) {
            GCOLL_WARN("compress: q8: non-finite value in bucket %llu (elements %zu..%zu)",
                       (unsigned long long)b, lo, lo + m - 1);
            return GCOLL_ERR_INVALID;
        }
        float scale = mx / 127.0f, inv = mx > 0 ? 127.0f / mx : 0.0f;
        if (!(inv <= 3.4028234e38f)) /* subnormal max: 127/max overflows; send zeros */
            scale = inv = 0.0f;
        stf(out + 4 * b, scale);
        k->q8_put(x + lo, m, inv, codes + lo);
    }
    return GCOLL_OK;
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
        if (!isfinite(scale)) {
            GCOLL_WARN("compress: sign: non-finite value (or overflow) in chunk %llu "
                       "(elements %zu..%zu)", (unsigned long long)b, lo, lo + m - 1);
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
        GCOLL_WARN("compress: non-finite input %g at element %zu", i < n ? (double)x[i] : 0.0,
                   i);
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
            GCOLL_WARN("compress: malformed message: %s %llu is %g", what,
                       (unsigned long long)b, (double)f);
            return GCOLL_ERR_INVALID;
        }
    }
    return GCOLL_OK;
}

static uint32_t qsgd_code_at(const uint8_t *codes, unsigned B, uint64_t j)
{
    uint64_t bit = j * B;
    const uint8_t *q = codes + bit / 8;
    unsigned sh = (unsigned)(bit % 8);
    uint32_t v = q[0];
    if (sh + B > 8)
        v |= (uint32_t)q[1] << 8;
    return (v >> sh) & ((1u << B) - 1u);
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
        for (uint64_t i = 0; i < n; i++)
            if (qsgd_code_at(p + 4 * nb, vs->bits, i) > s2) {
                GCOLL_WARN("compress: malformed message: qsgd code at %llu exceeds %u",
                           (unsigned long long)i, s2);
                return GCOLL_ERR_INVALID;
            }
        return GCOLL_OK;
    }
    case GCOLL_VF_SIGN:
        return check_scales(p, nb, 1.0f, "sign scale");
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

void gcoll_vsec_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n,
                            size_t start, size_t m, float *out, int mode)
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
        } else { /* QSGD */
            const uint32_t s = qsgd_s(vs->bits);
            const float f = scale / (float)s;
            for (size_t j = 0; j < cnt; j++) {
                int32_t lv = (int32_t)qsgd_code_at(body, vs->bits, i + j) - (int32_t)s;
                put1(o + j, (float)lv * f, mode);
            }
        }
        i = stop;
    }
}
