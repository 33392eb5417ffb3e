/* rng.h: small deterministic generators for random-k indices, QSGD rounding and sampling. */
#ifndef GCOLL_COMPRESS_RNG_H
#define GCOLL_COMPRESS_RNG_H

#include <stdint.h>

/* SplitMix64 (Steele, Lea, Flood 2014): a sequential generator and a 64-bit mixer. */
static inline uint64_t gcoll_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t gcoll_rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return gcoll_mix64(*state);
}

/* Uniform integer in [0, bound) by Lemire's multiply-shift with rejection (exact). */
static inline uint64_t gcoll_rng_below(uint64_t *state, uint64_t bound)
{
    __uint128_t m = (__uint128_t)gcoll_rng_next(state) * bound;
    uint64_t lo = (uint64_t)m;
    if (lo < bound) {
        uint64_t t = (0 - bound) % bound;
        while (lo < t) {
            m = (__uint128_t)gcoll_rng_next(state) * bound;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* Counter-based 32-bit hash (lowbias32 by C. Wellons) used as a per-element random
 * stream: element i of a message draws hash32(i ^ key_lo) ^ key_hi style values, so
 * the stream vectorizes and needs no state. */
static inline uint32_t gcoll_hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* Uniform float in [0, 1) from 24 random bits. */
static inline float gcoll_u01(uint32_t r)
{
    return (float)(r >> 8) * (1.0f / 16777216.0f);
}

#endif /* GCOLL_COMPRESS_RNG_H */
