/* kernels_avx2.c: hand-written AVX2/F16C loops (fp16 conversion, sign packing, selection, QSGD). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "compress/kernels.h"
#include "compress/rng.h"

TARGET_AVX2 int gcoll_k_f16_put_avx2(const float *x, size_t n, uint8_t *out)
{
    const __m256i expm = _mm256_set1_epi32(0x7f800000);
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i e = _mm256_and_si256(_mm256_castps_si256(v), expm);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, expm));
        v = _mm256_max_ps(_mm256_min_ps(v, hi), lo); /* saturate, as the generic kernel */
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), h);
    }
    int any = !_mm256_testz_si256(bad, bad);
    for (; i < n; i++) {
        uint32_t u = gcoll_f32_bits(x[i]);
        any |= (u & 0x7f800000u) == 0x7f800000u;
        float v = x[i] > 65504.0f ? 65504.0f : (x[i] < -65504.0f ? -65504.0f : x[i]);
        uint16_t h = gcoll_f32_to_f16(v);
        memcpy(out + 2 * i, &h, 2);
    }
    return any;
}

TARGET_AVX2 void gcoll_k_f16_apply_avx2(const uint8_t *p, size_t n, float *out, int mode)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i)));
        if (mode == GCOLL_DECODE_ADD)
            v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
        else if (mode == GCOLL_DECODE_SUB)
            v = _mm256_sub_ps(_mm256_loadu_ps(out + i), v);
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        float f = gcoll_f16_to_f32(h);
        if (mode == GCOLL_DECODE_SET)
            out[i] = f;
        else if (mode == GCOLL_DECODE_ADD)
            out[i] += f;
        else
            out[i] -= f;
    }
}

/* EF-SignSGD (Karimireddy et al. 2019) and 1-bit Adam (Tang et al. 2021) scales need
 * sum |x| or sum x^2 beside the sign bits; one pass produces both. Lane j of the
 * accumulator holds elements i + j, exactly as in the generic kernel. */
TARGET_AVX2 float gcoll_k_sign_put_avx2(const float *x, size_t n, uint8_t *bits, int l2)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    if (l2) {
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            bits[i / 8] = (uint8_t)_mm256_movemask_ps(v);
            __m256 a = _mm256_and_ps(v, absm);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(a, a));
        }
    } else {
        for (; i + 32 <= n; i += 32) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
            __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
            uint32_t b =
                (uint32_t)_mm256_movemask_ps(v0) | ((uint32_t)_mm256_movemask_ps(v1) << 8) |
                ((uint32_t)_mm256_movemask_ps(v2) << 16) | ((uint32_t)_mm256_movemask_ps(v3) << 24);
            memcpy(bits + i / 8, &b, 4);
            /* keep the generic kernel's order: one add per 8-element block */
            acc = _mm256_add_ps(acc, _mm256_and_ps(v0, absm));
            acc = _mm256_add_ps(acc, _mm256_and_ps(v1, absm));
            acc = _mm256_add_ps(acc, _mm256_and_ps(v2, absm));
            acc = _mm256_add_ps(acc, _mm256_and_ps(v3, absm));
        }
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            bits[i / 8] = (uint8_t)_mm256_movemask_ps(v);
            acc = _mm256_add_ps(acc, _mm256_and_ps(v, absm));
        }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    if (i < n) {
        unsigned b = 0;
        for (int j = 0; i + (size_t)j < n; j++) {
            b |= (gcoll_f32_bits(x[i + j]) >> 31) << j;
            float a = x[i + j] < 0 ? -x[i + j] : x[i + j];
            lanes[j] += l2 ? a * a : a;
        }
        bits[i / 8] = (uint8_t)b;
    }
    return gcoll_lanes8_sum(lanes);
}

TARGET_AVX2 void gcoll_k_sign_apply_avx2(const uint8_t *bits, size_t n, float scale, float *out,
                                         int mode)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sgn = _mm256_set1_epi32((int)0x80000000u);
    const __m256 sv = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_set1_epi32(bits[i / 8]);
        __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(b, sel), sel);
        __m256 v = _mm256_xor_ps(sv, _mm256_castsi256_ps(_mm256_and_si256(m, sgn)));
        if (mode == GCOLL_DECODE_ADD)
            v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
        else if (mode == GCOLL_DECODE_SUB)
            v = _mm256_sub_ps(_mm256_loadu_ps(out + i), v);
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) {
        float f = ((bits[i >> 3] >> (i & 7)) & 1) ? -scale : scale;
        if (mode == GCOLL_DECODE_SET)
            out[i] = f;
        else if (mode == GCOLL_DECODE_ADD)
            out[i] += f;
        else
            out[i] -= f;
    }
}

/* Software prefetch distances (floats) for the streaming passes over large tensors. With
 * two ranks per core the hardware prefetchers lose the streams at every context switch:
 * top-k 0.1% + q8 on 4 ranks and 25M floats (loopback, 2 cores), 68.3-69.7 ms per
 * allreduce without, 62.9-65.8 with both (3 runs each, alternating); the fused pass's 1 KiB
 * ahead measured best of 1, 2 and 4 KiB. */
#define PF_STREAM 256
#define PF_SCAN 512

/* First NaN/Inf (exponent all ones), 256 elements per test: the unsigned max of the
 * exponent bits over four independent lanes, one compare per block. The auto-vectorized
 * body ran at about half the streaming-read rate (9.5 vs 6.5 ms for 100 MB here). */
TARGET_AVX2 size_t gcoll_k_first_bad_avx2(const float *x, size_t n)
{
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        if (i + PF_SCAN + 256 <= n)
            for (size_t q = 0; q < 256; q += 16)
                _mm_prefetch((const char *)(x + i + PF_SCAN + q), _MM_HINT_T0);
        __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
        for (size_t j = i; j < i + 256; j += 32) {
            const __m256i *p = (const __m256i *)(const void *)(x + j);
            m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), em));
            m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), em));
            m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_loadu_si256(p + 2), em));
            m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_loadu_si256(p + 3), em));
        }
        __m256i m = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
        __m256i hit = _mm256_cmpeq_epi32(m, em);
        if (!_mm256_testz_si256(hit, hit))
            break;
    }
    for (; i < n; i++)
        if ((gcoll_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u)
            return i;
    return n;
}

/* Non-temporal stores from the first 32-byte boundary of dst on; sfence orders them
 * before any later store or the caller's hand-off of the buffer to another thread. */
TARGET_AVX2 void gcoll_k_stream_copy_avx2(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & 31u) != 0) {
        dst[i] = src[i];
        i++;
    }
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++)
        dst[i] = src[i];
    _mm_sfence();
}

/* Selection output shared by the collect kernels: x[i], element base + i, is taken (its
 * index and value stored while there is room, and then, with zero_at, zero_at[i] zeroed;
 * counted always; *bad set if it is NaN/Inf). */
static inline void take(const float *x, size_t i, size_t base, uint32_t *idx, float *val,
                        size_t cap, size_t *cnt, int *bad, float *zero_at)
{
    if ((gcoll_f32_bits(x[i]) & 0x7fffffffu) >= 0x7f800000u)
        *bad = 1;
    if (*cnt < cap) {
        idx[*cnt] = (uint32_t)(base + i);
        val[*cnt] = x[i];
        if (zero_at)
            zero_at[i] = 0.0f;
    }
    (*cnt)++;
}

/* take() for every set bit j of mask: x[j] (and zero_at[j]) is element base + j, so x may
 * be the block's copy as well as the array at base. */
static inline void take_mask(const float *x, size_t base, uint32_t mask, uint32_t *idx, float *val,
                             size_t cap, size_t *cnt, int *bad, float *zero_at)
{
    while (mask) {
        unsigned j = (unsigned)__builtin_ctz(mask);
        mask &= mask - 1;
        take(x, j, base, idx, val, cap, cnt, bad, zero_at);
    }
}

/* Streams through x 32 floats at a time; only blocks holding a hit leave the vector
 * loop, so the cost is close to a streaming read when hits are rare. */
TARGET_AVX2 size_t gcoll_k_collect_ge_avx2(const float *x, size_t n, uint32_t thr, uint32_t *idx,
                                           float *val, size_t cap, int *bad)
{
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i t1 = _mm256_set1_epi32((int)(thr - 1u)); /* thr >= 1 */
    size_t cnt = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        if (i + PF_STREAM + 32 <= n) {
            _mm_prefetch((const char *)(x + i + PF_STREAM), _MM_HINT_T0);
            _mm_prefetch((const char *)(x + i + PF_STREAM + 16), _MM_HINT_T0);
        }
        __m256i a0 =
            _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), absm);
        __m256i a1 =
            _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8)), absm);
        __m256i a2 =
            _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i + 16)), absm);
        __m256i a3 =
            _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i + 24)), absm);
        __m256i g0 = _mm256_cmpgt_epi32(a0, t1), g1 = _mm256_cmpgt_epi32(a1, t1);
        __m256i g2 = _mm256_cmpgt_epi32(a2, t1), g3 = _mm256_cmpgt_epi32(a3, t1);
        __m256i any = _mm256_or_si256(_mm256_or_si256(g0, g1), _mm256_or_si256(g2, g3));
        if (_mm256_testz_si256(any, any))
            continue;
        uint32_t mask = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g0)) |
                        ((uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g1)) << 8) |
                        ((uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g2)) << 16) |
                        ((uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g3)) << 24);
        take_mask(x + i, i, mask, idx, val, cap, &cnt, bad, NULL);
    }
    for (; i < n; i++)
        if ((gcoll_f32_bits(x[i]) & 0x7fffffffu) >= thr)
            take(x, i, 0, idx, val, cap, &cnt, bad, NULL);
    return cnt;
}

/* q8: round to nearest even by cvtps (MXCSR default), saturating packs, clamp to -127;
 * identical to the generic kernel's magic-number rounding for |v| <= 127.x. */
TARGET_AVX2 void gcoll_k_q8_put_avx2(const float *x, size_t n, float inv, int8_t *codes)
{
    const __m256 iv = _mm256_set1_ps(inv);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lo = _mm256_set1_epi8(-127);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), iv));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), iv));
        __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), iv));
        __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
        __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), perm);
        _mm256_storeu_si256((__m256i *)(void *)(codes + i), _mm256_max_epi8(q, lo));
    }
    const float magic = 12582912.0f;
    for (; i < n; i++) {
        float r = (x[i] * inv + magic) - magic;
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        codes[i] = (int8_t)(int)r;
    }
}

/* bf16: the generic kernel's rounding and saturation, 16 values per iteration. */
TARGET_AVX2 int gcoll_k_bf16_put_avx2(const float *x, size_t n, uint8_t *out)
{
    const __m256i expm = _mm256_set1_epi32(0x7f800000), absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i satlim = _mm256_set1_epi32(0x7f7f7fff), c7fff = _mm256_set1_epi32(0x7fff);
    const __m256i one = _mm256_set1_epi32(1), sgn = _mm256_set1_epi32(0x8000);
    const __m256i maxf = _mm256_set1_epi32(0x7f7f);
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8 * h));
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(u, expm), expm));
            __m256i hi = _mm256_srli_epi32(u, 16);
            __m256i rr = _mm256_srli_epi32(
                _mm256_add_epi32(u, _mm256_add_epi32(c7fff, _mm256_and_si256(hi, one))), 16);
            __m256i sat = _mm256_or_si256(_mm256_and_si256(hi, sgn), maxf);
            __m256i m = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), satlim);
            r[h] = _mm256_blendv_epi8(rr, sat, m);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(out + 2 * i), p);
    }
    int any = !_mm256_testz_si256(bad, bad);
    for (; i < n; i++) {
        uint32_t u = gcoll_f32_bits(x[i]);
        any |= (u & 0x7f800000u) == 0x7f800000u;
        uint16_t r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        uint16_t sat = (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
        uint16_t h = (u & 0x7fffffffu) >= 0x7f7f8000u ? sat : r;
        memcpy(out + 2 * i, &h, 2);
    }
    return any;
}

TARGET_AVX2 static inline __m256i hash32_x8(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* QSGD codes for eight elements: the generic kernel's arithmetic lane for lane (a multiply,
 * a truncation, exact conversions and compares, the same hashed stream per element). */
TARGET_AVX2 static inline __m256i qsgd_codes_x8(const float *x, __m256 fv, __m256i sv, __m256i idx,
                                                __m256i khi)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 u24 = _mm256_set1_ps(1.0f / 16777216.0f);
    __m256 v = _mm256_loadu_ps(x);
    __m256 r = _mm256_mul_ps(_mm256_and_ps(v, absm), fv);
    __m256i l = _mm256_cvttps_epi32(r); /* 0 <= r < 2^31: same as the unsigned cast */
    __m256 frac = _mm256_sub_ps(r, _mm256_cvtepi32_ps(l));
    __m256i h = hash32_x8(_mm256_xor_si256(hash32_x8(idx), khi));
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), u24);
    l = _mm256_sub_epi32(l, _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ)));
    l = _mm256_min_epu32(l, sv);
    __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_blendv_epi8(_mm256_add_epi32(sv, l), _mm256_sub_epi32(sv, l), neg);
}

TARGET_AVX2 void gcoll_k_qsgd_codes_avx2(const float *x, size_t n, float f, uint32_t s,
                                         uint32_t base, uint32_t klo, uint32_t khi, uint8_t *codes)
{
    const __m256 fv = _mm256_set1_ps(f);
    const __m256i sv = _mm256_set1_epi32((int)s), kh = _mm256_set1_epi32((int)khi);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(base + (uint32_t)i + klo)), lane);
        const __m256i eight = _mm256_set1_epi32(8);
        __m256i a = qsgd_codes_x8(x + i, fv, sv, idx, kh);
        idx = _mm256_add_epi32(idx, eight);
        __m256i b = qsgd_codes_x8(x + i + 8, fv, sv, idx, kh);
        idx = _mm256_add_epi32(idx, eight);
        __m256i c = qsgd_codes_x8(x + i + 16, fv, sv, idx, kh);
        idx = _mm256_add_epi32(idx, eight);
        __m256i d = qsgd_codes_x8(x + i + 24, fv, sv, idx, kh);
        /* codes <= 254: unsigned saturation never bites */
        __m256i ab = _mm256_packus_epi32(a, b), cd = _mm256_packus_epi32(c, d);
        __m256i q = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), perm);
        _mm256_storeu_si256((__m256i *)(void *)(codes + i), q);
    }
    for (; i < n; i++) {
        float r = fabsf(x[i]) * f;
        uint32_t l = (uint32_t)r;
        float frac = r - (float)l;
        uint32_t h = gcoll_hash32(gcoll_hash32(base + (uint32_t)i + klo) ^ khi);
        l += gcoll_u01(h) < frac;
        l = l > s ? s : l;
        codes[i] = (uint8_t)(x[i] < 0 ? s - l : s + l);
    }
}

/* dst[i] = e[i] + a*g[i], taken when |dst[i]| bits >= thr (the kernels' scalar ends) */
static inline void axpy_take_scalar(float *dst, const float *e, const float *g, float a,
                                    uint32_t thr, size_t i, uint32_t *idx, float *val, size_t cap,
                                    size_t *cnt, int *bad, int zero)
{
    dst[i] = e[i] + a * g[i];
    if ((gcoll_f32_bits(dst[i]) & 0x7fffffffu) >= thr)
        take(dst, i, 0, idx, val, cap, cnt, bad, zero ? dst : NULL);
}

/* collect_ge over dst = e + a*g, the update stored as it streams by (multiply then add,
 * as the generic kernel: no FMA). In place (nt == 0) the blocks are stored, then the hits
 * taken from them. Out of place (nt, dst not overlapping e) the stores are non-temporal
 * from dst's first 32-byte boundary on, as dst is written whole and not read again in the
 * pass (a plain store would first read each line of dst: a third more memory traffic than
 * updating e in place); a block holding a hit goes through a stack copy, where the taken
 * lanes are read and zeroed, so that no plain store or load touches a line the stream is
 * writing. */
TARGET_AVX2 static inline __attribute__((always_inline)) size_t
axpy_collect_ge_body(float *dst, const float *e, const float *g, size_t n, float a, uint32_t thr,
                     uint32_t *idx, float *val, size_t cap, int *bad, int zero, const int nt)
{
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i t1 = _mm256_set1_epi32((int)(thr - 1u)); /* thr >= 1 */
    const __m256 av = _mm256_set1_ps(a);
    size_t cnt = 0, i = 0;
    float blk[16];
    for (; nt && i < n && ((uintptr_t)(dst + i) & 31u) != 0; i++)
        axpy_take_scalar(dst, e, g, a, thr, i, idx, val, cap, &cnt, bad, zero);
    for (; i + 16 <= n; i += 16) {
        if (i + PF_STREAM < n) {
            _mm_prefetch((const char *)(g + i + PF_STREAM), _MM_HINT_T0);
            _mm_prefetch((const char *)(e + i + PF_STREAM), _MM_HINT_T0);
        }
        __m256 x0 =
            _mm256_add_ps(_mm256_loadu_ps(e + i), _mm256_mul_ps(av, _mm256_loadu_ps(g + i)));
        __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(e + i + 8),
                                  _mm256_mul_ps(av, _mm256_loadu_ps(g + i + 8)));
        if (!nt) {
            _mm256_storeu_ps(dst + i, x0);
            _mm256_storeu_ps(dst + i + 8, x1);
        }
        __m256i g0 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(x0), absm), t1);
        __m256i g1 = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(x1), absm), t1);
        __m256i any = _mm256_or_si256(g0, g1);
        if (!_mm256_testz_si256(any, any)) {
            uint32_t mask = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g0)) |
                            ((uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(g1)) << 8);
            if (!nt) {
                take_mask(dst + i, i, mask, idx, val, cap, &cnt, bad, zero ? dst + i : NULL);
            } else {
                _mm256_storeu_ps(blk, x0);
                _mm256_storeu_ps(blk + 8, x1);
                take_mask(blk, i, mask, idx, val, cap, &cnt, bad, zero ? blk : NULL);
                x0 = _mm256_loadu_ps(blk);
                x1 = _mm256_loadu_ps(blk + 8);
            }
        }
        if (nt) {
            _mm256_stream_ps(dst + i, x0);
            _mm256_stream_ps(dst + i + 8, x1);
        }
    }
    if (nt)
        _mm_sfence();
    for (; i < n; i++)
        axpy_take_scalar(dst, e, g, a, thr, i, idx, val, cap, &cnt, bad, zero);
    return cnt;
}

TARGET_AVX2 size_t gcoll_k_axpy_collect_ge_avx2(float *dst, const float *e, const float *g,
                                                size_t n, float a, uint32_t thr, uint32_t *idx,
                                                float *val, size_t cap, int *bad, int zero)
{
    if (dst != e)
        return axpy_collect_ge_body(dst, e, g, n, a, thr, idx, val, cap, bad, zero, 1);
    return axpy_collect_ge_body(dst, e, g, n, a, thr, idx, val, cap, bad, zero, 0);
}

/* QSGD decode. Eight B-bit codes sit in the low 8B bits of group g's 8-byte word; one
 * broadcast, a byte shuffle putting bytes b, b+1 of code k (b = kB/8) in dword k, a
 * per-lane shift by kB%8 and a mask give the eight codes as int32. (code - s) converts
 * exactly and the multiply by f is the scalar decoder's single rounding, so the result is
 * the generic kernel's bit for bit. */
typedef struct {
    __m256i shuf, shift, mask;
} qsgd_unpacker_t;

TARGET_AVX2 static inline qsgd_unpacker_t qsgd_unpacker(unsigned B)
{
    uint8_t sb[32];
    int32_t sh[8];
    for (unsigned k = 0; k < 8; k++) {
        unsigned b = k * B / 8, at = (k % 4) * 4 + (k / 4) * 16;
        sb[at] = (uint8_t)b;
        sb[at + 1] = b + 1 < 8 ? (uint8_t)(b + 1) : 0x80;
        sb[at + 2] = sb[at + 3] = 0x80;
        sh[k] = (int32_t)(k * B % 8);
    }
    qsgd_unpacker_t u;
    u.shuf = _mm256_loadu_si256((const __m256i *)(const void *)sb);
    u.shift = _mm256_loadu_si256((const __m256i *)(const void *)sh);
    u.mask = _mm256_set1_epi32((int)((1u << B) - 1u));
    return u;
}

TARGET_AVX2 static inline __m256i qsgd_unpack_x8(const qsgd_unpacker_t *u, uint64_t v)
{
    __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)v), u->shuf);
    return _mm256_and_si256(_mm256_srlv_epi32(w, u->shift), u->mask);
}

TARGET_AVX2 static inline void qsgd_put8(float *o, __m256 v, int mode)
{
    if (mode == GCOLL_DECODE_ADD)
        v = _mm256_add_ps(_mm256_loadu_ps(o), v);
    else if (mode == GCOLL_DECODE_SUB)
        v = _mm256_sub_ps(_mm256_loadu_ps(o), v);
    _mm256_storeu_ps(o, v);
}

static inline void qsgd_put1(float *o, float v, int mode)
{
    if (mode == GCOLL_DECODE_SET)
        *o = v;
    else if (mode == GCOLL_DECODE_ADD)
        *o += v;
    else
        *o -= v;
}

TARGET_AVX2 void gcoll_k_qsgd_apply_avx2(const uint8_t *p, size_t plen, size_t i0, size_t n,
                                         unsigned B, uint32_t s, float f, float *out, int mode)
{
    const int32_t si = (int32_t)s;
    size_t j = 0, head = GCOLL_MIN(n, (8 - i0 % 8) % 8);
    for (; j < head; j++)
        qsgd_put1(out + j, (float)((int32_t)gcoll_qsgd_code1(p, B, i0 + j) - si) * f, mode);
    const qsgd_unpacker_t u = qsgd_unpacker(B);
    const __m256i sv = _mm256_set1_epi32(si);
    const __m256 fv = _mm256_set1_ps(f);
    size_t g = (i0 + j) / 8;
    /* whole groups whose 8-byte load stays inside the stream */
    for (; j + 32 <= n && (g + 3) * B + 8 <= plen; j += 32, g += 4) {
        uint64_t w[4];
        memcpy(w, p + g * B, 8);
        memcpy(w + 1, p + (g + 1) * B, 8);
        memcpy(w + 2, p + (g + 2) * B, 8);
        memcpy(w + 3, p + (g + 3) * B, 8);
        for (int t = 0; t < 4; t++) {
            __m256i c = _mm256_sub_epi32(qsgd_unpack_x8(&u, w[t]), sv);
            qsgd_put8(out + j + 8 * t, _mm256_mul_ps(_mm256_cvtepi32_ps(c), fv), mode);
        }
    }
    for (; j + 8 <= n; j += 8, g++) {
        __m256i c = _mm256_sub_epi32(qsgd_unpack_x8(&u, gcoll_qsgd_group(p, plen, g, B)), sv);
        qsgd_put8(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(c), fv), mode);
    }
    for (; j < n; j++)
        qsgd_put1(out + j, (float)((int32_t)gcoll_qsgd_code1(p, B, i0 + j) - si) * f, mode);
}

TARGET_AVX2 int gcoll_k_qsgd_bad_avx2(const uint8_t *p, size_t plen, size_t n, unsigned B)
{
    const qsgd_unpacker_t u = qsgd_unpacker(B);
    __m256i bad = _mm256_setzero_si256();
    size_t g = 0;
    for (; 8 * g + 32 <= n && (g + 3) * B + 8 <= plen; g += 4) {
        uint64_t w[4];
        memcpy(w, p + g * B, 8);
        memcpy(w + 1, p + (g + 1) * B, 8);
        memcpy(w + 2, p + (g + 2) * B, 8);
        memcpy(w + 3, p + (g + 3) * B, 8);
        __m256i a = _mm256_or_si256(_mm256_cmpeq_epi32(qsgd_unpack_x8(&u, w[0]), u.mask),
                                    _mm256_cmpeq_epi32(qsgd_unpack_x8(&u, w[1]), u.mask));
        __m256i b = _mm256_or_si256(_mm256_cmpeq_epi32(qsgd_unpack_x8(&u, w[2]), u.mask),
                                    _mm256_cmpeq_epi32(qsgd_unpack_x8(&u, w[3]), u.mask));
        bad = _mm256_or_si256(bad, _mm256_or_si256(a, b));
    }
    for (; 8 * g + 8 <= n; g++) {
        __m256i c = qsgd_unpack_x8(&u, gcoll_qsgd_group(p, plen, g, B));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(c, u.mask));
    }
    int any = !_mm256_testz_si256(bad, bad);
    for (size_t i = 8 * g; i < n; i++)
        any |= gcoll_qsgd_code1(p, B, i) == (1u << B) - 1u;
    return any;
}
