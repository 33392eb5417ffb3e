/* values_float_avx2.c: AVX2 kernels of the fp8 and MX value sections (values_float.c holds
 * the portable ones, which these match bit for bit: the same integer rounding, eight lanes
 * at a time). */
#include <immintrin.h>
#include <string.h>

#include "rng.h"
#include "values_float.h"

#define TARGET_AVX2 __attribute__((target("avx2")))

TARGET_AVX2 static inline __m256i hash8(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* gcoll_fl_round_code on eight lanes (magnitude codes, sign not applied). */
TARGET_AVX2 static inline __m256i round8(__m256i u, __m256i d, const gcoll_fl_fmt_t *f, int sr,
                                         __m256i rnd)
{
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i fe = _mm256_srli_epi32(a, 23);
    const __m256i z = _mm256_cmpeq_epi32(fe, _mm256_setzero_si256());
    const __m256i m24 =
        _mm256_andnot_si256(z, _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7fffff)),
                                               _mm256_set1_epi32(0x800000)));
    __m256i e = _mm256_sub_epi32(_mm256_sub_epi32(fe, _mm256_set1_epi32(127)), d);
    e = _mm256_blendv_epi8(e, _mm256_set1_epi32(f->emin - 64), z);
    e = _mm256_min_epi32(e, _mm256_set1_epi32(f->emax + 1));
    const __m256i ec = _mm256_max_epi32(e, _mm256_set1_epi32(f->emin));
    const __m256i s = _mm256_add_epi32(_mm256_sub_epi32(ec, e), _mm256_set1_epi32(23 - f->m));
    const __m256i ip = _mm256_srlv_epi32(m24, s);
    /* counts beyond 31 (negative ones included) shift everything out */
    const __m256i frac =
        _mm256_or_si256(_mm256_sllv_epi32(m24, _mm256_sub_epi32(_mm256_set1_epi32(32), s)),
                        _mm256_srlv_epi32(m24, _mm256_sub_epi32(s, _mm256_set1_epi32(32))));
    const __m256i hi = _mm256_set1_epi32((int)0x80000000u);
    const __m256i fx = _mm256_xor_si256(frac, hi);
    __m256i up;
    if (sr) { /* frac > ~rnd, unsigned */
        up = _mm256_cmpgt_epi32(fx, _mm256_xor_si256(rnd, _mm256_set1_epi32(0x7fffffff)));
    } else {
        const __m256i one = _mm256_set1_epi32(1);
        const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(ip, one), one);
        up = _mm256_or_si256(_mm256_cmpgt_epi32(fx, _mm256_setzero_si256()),
                             _mm256_and_si256(_mm256_cmpeq_epi32(frac, hi), odd));
    }
    __m256i code = _mm256_sllv_epi32(_mm256_sub_epi32(ec, _mm256_set1_epi32(f->emin)),
                                     _mm256_set1_epi32(f->m));
    code = _mm256_sub_epi32(_mm256_add_epi32(code, ip), up);
    return _mm256_min_epu32(code, _mm256_set1_epi32((int)f->maxcode));
}

/* Codes (sign applied) of x[i..i+8), elements base + i.. of the section. */
TARGET_AVX2 static inline __m256i codes8(const float *x, __m256i d, const gcoll_fl_fmt_t *f,
                                         int sbit, int sr, uint32_t idx, uint32_t klo, uint32_t khi)
{
    __m256i u = _mm256_loadu_si256((const __m256i *)x), rnd = _mm256_setzero_si256();
    if (sr) {
        __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int)(idx + klo)),
                                     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        rnd = hash8(_mm256_xor_si256(hash8(i), _mm256_set1_epi32((int)khi)));
    }
    __m256i c = round8(u, d, f, sr, rnd);
    __m256i sg = _mm256_and_si256(_mm256_srli_epi32(u, 31 - sbit), _mm256_set1_epi32(1 << sbit));
    return _mm256_or_si256(c, sg);
}

/* 32 codes of four vectors to 32 bytes in order. */
TARGET_AVX2 static inline __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3)
{
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

TARGET_AVX2 size_t gcoll_fl_mx_put_avx2(const float *x, size_t n, const gcoll_fl_fmt_t *f, int fp4,
                                        int sr, uint32_t klo, uint32_t khi, uint8_t *sc,
                                        uint8_t *el)
{
    const size_t full = n / 32;
    const int sbit = fp4 ? 3 : 7;
    for (size_t b = 0; b < full; b++) {
        const float *xb = x + 32 * b;
        const __m256i am = _mm256_set1_epi32(0x7fffffff);
        __m256i m = _mm256_max_epi32(
            _mm256_max_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)xb), am),
                             _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + 8)), am)),
            _mm256_max_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + 16)), am),
                             _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + 24)), am)));
        __m128i m4 = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0x4e));
        m4 = _mm_max_epi32(m4, _mm_shuffle_epi32(m4, 0xb1));
        uint32_t amax = (uint32_t)_mm_cvtsi128_si32(m4);
        if (amax >= 0x7f800000u)
            return b;
        uint32_t s = gcoll_fl_mx_scale_code(amax, f->emax);
        sc[b] = (uint8_t)s;
        const __m256i d = _mm256_set1_epi32((int)s - 127);
        const uint32_t i0 = (uint32_t)(32 * b);
        __m256i c0 = codes8(xb, d, f, sbit, sr, i0, klo, khi);
        __m256i c1 = codes8(xb + 8, d, f, sbit, sr, i0 + 8, klo, khi);
        __m256i c2 = codes8(xb + 16, d, f, sbit, sr, i0 + 16, klo, khi);
        __m256i c3 = codes8(xb + 24, d, f, sbit, sr, i0 + 24, klo, khi);
        __m256i bytes = pack32(c0, c1, c2, c3);
        if (!fp4) {
            _mm256_storeu_si256((__m256i *)(el + 32 * b), bytes);
        } else { /* pairs of bytes (lo, hi) to one byte lo | hi << 4 */
            __m256i w = _mm256_or_si256(
                _mm256_and_si256(bytes, _mm256_set1_epi16(0x000f)),
                _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00f0)));
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
            _mm_storeu_si128((__m128i *)(el + 16 * b), _mm256_castsi256_si128(p));
        }
    }
    if (full * 32 < n) {
        size_t r = gcoll_fl_mx_put_gen(x + 32 * full, n - 32 * full, f, fp4, sr,
                                       klo + (uint32_t)(32 * full), khi, sc + full,
                                       el + (fp4 ? 16 : 32) * full);
        if (r == 0)
            return full;
    }
    return (n + 31) / 32;
}

/* Eight decoded values of magnitude-and-sign codes c: integers to float bits for normal
 * elements, an exact int-to-float conversion for subnormal ones, then times the scale. */
TARGET_AVX2 static inline __m256 vals8(__m256i c, const gcoll_fl_fmt_t *f, int sbit, __m256 scale)
{
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32((1 << sbit) - 1));
    const __m256i E = _mm256_srlv_epi32(mag, _mm256_set1_epi32(f->m));
    const __m256i z = _mm256_cmpeq_epi32(E, _mm256_setzero_si256());
    const __m256i nb = _mm256_add_epi32(_mm256_sllv_epi32(mag, _mm256_set1_epi32(23 - f->m)),
                                        _mm256_set1_epi32((127 - 1 + f->emin) << 23));
    const __m256 sub =
        _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(gcoll_fl_pow2(f->emin - f->m)));
    __m256 v = _mm256_blendv_ps(_mm256_castsi256_ps(nb), sub, _mm256_castsi256_ps(z));
    v = _mm256_mul_ps(v, scale);
    const __m256i sg = _mm256_slli_epi32(_mm256_srli_epi32(c, sbit), 31);
    return _mm256_or_ps(v, _mm256_castsi256_ps(sg));
}

TARGET_AVX2 static inline void store8(float *o, __m256 v, int mode)
{
    if (mode == 0)
        _mm256_storeu_ps(o, v);
    else if (mode == 1)
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), v));
    else
        _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_loadu_ps(o), v));
}

TARGET_AVX2 void gcoll_fl_apply8_avx2(const uint8_t *codes, int fp4, size_t groups,
                                      const gcoll_fl_fmt_t *f, float scale, float *out, int mode)
{
    const int sbit = fp4 ? 3 : 7;
    const __m256 sv = _mm256_set1_ps(scale);
    for (size_t g = 0; g < groups; g++) {
        __m256i c;
        if (fp4) {
            uint32_t w;
            memcpy(&w, codes + 4 * g, 4);
            c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                                   _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                 _mm256_set1_epi32(0xf));
        } else {
            c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * g)));
        }
        store8(out + 8 * g, vals8(c, f, sbit, sv), mode);
    }
}

TARGET_AVX2 size_t gcoll_fl_codes_avx2(const float *x, size_t n, int32_t d, const gcoll_fl_fmt_t *f,
                                       int sr, uint32_t base, uint32_t klo, uint32_t khi,
                                       uint8_t *out)
{
    const __m256i dv = _mm256_set1_epi32(d);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint32_t b = base + (uint32_t)i;
        __m256i c0 = codes8(x + i, dv, f, 7, sr, b, klo, khi);
        __m256i c1 = codes8(x + i + 8, dv, f, 7, sr, b + 8, klo, khi);
        __m256i c2 = codes8(x + i + 16, dv, f, 7, sr, b + 16, klo, khi);
        __m256i c3 = codes8(x + i + 24, dv, f, 7, sr, b + 24, klo, khi);
        _mm256_storeu_si256((__m256i *)(out + i), pack32(c0, c1, c2, c3));
    }
    return i;
}
