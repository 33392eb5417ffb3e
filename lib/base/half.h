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

#endif /* GCOLL_HALF_H */
