/* compress_test_util.h: helpers shared by the codec unit tests (include after cmocka.h):
 * a seeded generator, gradient-like data, and encode-with-checks. */
#ifndef GCOLL_COMPRESS_TEST_UTIL_H
#define GCOLL_COMPRESS_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"

/* Every test that touches kernels runs under both kernel sets. */
static const gcoll_simd_t simd_levels[] GCOLL_UNUSED = {GCOLL_SIMD_GENERIC, GCOLL_SIMD_AVX2};
#define FOR_EACH_SIMD(lvl)                                                                         \
    for (size_t lvl##_i = 0; lvl##_i < 2 && (gcoll_simd_set(simd_levels[lvl##_i]), 1); lvl##_i++)

static uint64_t rng_s = 12345;
static GCOLL_UNUSED uint32_t rnd32(void)
{
    rng_s = rng_s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_s >> 32);
}
static GCOLL_UNUSED float rndf(void)
{
    return ((float)rnd32() / 4294967296.0f) * 2.0f - 1.0f;
}

/* Gradient-like data with a spread of magnitudes, some exact ties and zeros. */
static GCOLL_UNUSED void fill(float *x, size_t n, uint64_t seed)
{
    rng_s = seed * 7919 + 1;
    for (size_t i = 0; i < n; i++) {
        float v = rndf();
        float mag = powf(10.0f, (float)(rnd32() % 6) - 4.0f);
        x[i] = v * mag;
        if (rnd32() % 50 == 0)
            x[i] = 0.0f;
        if (rnd32() % 97 == 0)
            x[i] = 0.5f; /* ties */
    }
}

static GCOLL_UNUSED gcoll_compressor_t *mk(const char *spec)
{
    gcoll_compressor_t *c = NULL;
    gcoll_status_t st = gcoll_compressor_create(spec, &c);
    if (st != GCOLL_OK)
        fail_msg("spec '%s' rejected", spec);
    return c;
}

static GCOLL_UNUSED uint8_t *encode_alloc(gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                          const float *x, size_t n, size_t *len)
{
    size_t cap = gcoll_compressor_bound(c, n);
    assert_true(cap >= 48);
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    assert_int_equal(gcoll_encode(c, s, x, n, buf, cap, len), GCOLL_OK);
    assert_true(*len <= cap);
    return buf;
}

#endif /* GCOLL_COMPRESS_TEST_UTIL_H */
