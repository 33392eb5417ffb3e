/* half.h: fp16 and bf16 conversions to and from fp32, round to nearest even. */
#ifndef GCOLL_HALF_H
#define GCOLL_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t gcoll_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float gcoll_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 is the top half of an fp32; round to nearest even, keep NaN a (quiet) NaN. */
static inline uint16_t gcoll_f32_to_bf16(float f)
{
    uint32_t u = gcoll_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float gcoll_bf16_to_f32(uint16_t h)
{
    return gcoll_bits_f32((uint32_t)h << 16);
}

/* IEEE binary16 from fp32, round to nearest even, with subnormals, overflow to inf. */
static inline uint16_t gcoll_f32_to_f16(float f)
{
    uint32_t u = gcoll_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) {   /* below 2^-14: subnormal or zero */
        if (absu < 0x33000000u) /* below 2^-25 rounds to zero */
            return (uint16_t)sign;
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u); /* round mantissa to 10 bits */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static inline float gcoll_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return gcoll_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* zero or subnormal: m * 2^-24 exactly */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return gcoll_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* OCP 8-bit floats (OFP8 Formats for Deep Learning, v1.0, 2023). Decoding is exact. */
static inline float gcoll_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    /* subnormals are m * 2^-9; S.1111.111 is the only NaN ("fn": no infinities) */
    float sub = (float)m * (1.0f / 512.0f);
    uint32_t bits = (b & 0x7fu) == 0x7fu ? 0x7fc00000u
                    : e == 0             ? gcoll_f32_bits(sub)
                                         : ((e + 120u) << 23) | (m << 20);
    return gcoll_bits_f32(sign | bits);
}

static inline float gcoll_e5m2_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
    float sub = (float)m * (1.0f / 65536.0f); /* subnormals: m * 2^-16 */
    uint32_t bits = e == 0x1fu ? 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u)
                    : e == 0   ? gcoll_f32_bits(sub)
                               : ((e + 112u) << 23) | (m << 21);
    return gcoll_bits_f32(sign | bits);
}

/* |f| (bits a, not NaN) to an 8-bit code with M mantissa bits and exponent bias B,
 * rounded to nearest even, uncapped (the callers cap overflow). Branch-free so that the
 * kernels vectorise: the normal path rounds the fp32 mantissa as gcoll_f32_to_bf16 does;
 * below the smallest normal, |f| * 2^(B+M-1) (exact) is rounded to an integer by adding
 * 2^23, whose ulp is 1, in the default round-to-nearest-even mode. */
static inline uint32_t gcoll_fp8_code(uint32_t a, unsigned M, unsigned B, float sub_scale)
{
    uint32_t r = a + ((1u << (22 - M)) - 1u) + ((a >> (23 - M)) & 1u);
    uint32_t normal = (r >> (23 - M)) - ((127u - B) << M);
    uint32_t sub = gcoll_f32_bits(gcoll_bits_f32(a) * sub_scale + 8388608.0f) - 0x4b000000u;
    return a < ((128u - B) << 23) ? sub : normal;
}

/* E4M3 ("fn"): results beyond 464 (halfway from 448 to the missing 480) and infinities
 * become NaN, as PyTorch's float8_e4m3fn conversion does. */
static inline uint8_t gcoll_f32_to_e4m3(float f)
{
    uint32_t u = gcoll_f32_bits(f), a = u & 0x7fffffffu;
    uint32_t c = gcoll_fp8_code(a, 3, 7, 512.0f);
    c = a >= 0x7f800000u ? 0x7fu : c;
    return (uint8_t)(((u >> 24) & 0x80u) | (c > 0x7fu ? 0x7fu : c));
}

/* E5M2: IEEE-like; overflow rounds to infinity, NaN stays a quiet NaN. */
static inline uint8_t gcoll_f32_to_e5m2(float f)
{
    uint32_t u = gcoll_f32_bits(f), a = u & 0x7fffffffu;
    uint32_t c = gcoll_fp8_code(a, 2, 15, 65536.0f);
    c = a > 0x7f800000u ? 0x7eu : c > 0x7cu ? 0x7cu : c;
    return (uint8_t)(((u >> 24) & 0x80u) | c);
}

#endif /* GCOLL_HALF_H */
