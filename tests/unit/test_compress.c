/* test_compress.c: spec parsing, codec round trips, generic vs AVX2 kernels, selection, pairs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/wire.h"
#include "base/half.h"

#include "compress_test_util.h"

/* --- spec parsing -------------------------------------------------------------------- */

static void test_spec_valid(void **unused)
{
    (void)unused;
    static const char *ok[] = {
        "none",
        "fp16",
        "bf16",
        "q8",
        "q8:bucket=64",
        "sign",
        "sign:scale=l2,chunk=64",
        "qsgd:bits=2,bucket=16",
        "qsgd:bits=8",
        "topk:density=0.001",
        "topk:k=10",
        "topk:density=0.01,select=sample",
        "topk:density=0.01,select=reuse,reuse_steps=5",
        "randomk:density=0.01,seed=7",
        "randomk:density=0.5,seed=1,unbiased=1,ef=0",
        "threshold:tau=0.01",
        "topk:density=0.01+q8",
        "topk:density=0.01+qsgd:bits=4",
        "topk:density=0.01,clip=1+fp16",
        "fp16:clip=2.5,ef=0",
        "none:ef=0",
        "dgc:density=0.001,momentum=0.9,warmup_steps=100,schedule=linear",
        "dgc:density=0.01,momentum=0.5,warmup_steps=4,schedule=step,select=exact",
        "topk:density=0.1+q8:bucket=32,clip=3",
        "threshold:tau=0.5+bf16",
        "topk:density=0.01,warmup_steps=8,schedule=exp",
        "fp16:clip=90", /* canonical "9e01": an exponent's '+' is not a separator */
        "topk:density=1e+0,clip=1e+20+q8",
        "fp16:clip_value=0.5",
        "topk:density=0.1,clip=2,clip_value=1e-3+q8",
        "randomk:density=0.1,ef=0",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++) {
        gcoll_compressor_t *c = mk(ok[i]), *c2 = NULL;
        /* the canonical form parses back to itself */
        const char *canon = gcoll_compressor_spec(c);
        assert_int_equal(gcoll_compressor_create(canon, &c2), GCOLL_OK);
        assert_string_equal(canon, gcoll_compressor_spec(c2));
        gcoll_compressor_destroy(c2);
        gcoll_compressor_destroy(c);
    }
    gcoll_compressor_t *c = mk("topk:density=0.01+q8");
    unsigned f = gcoll_compressor_flags(c);
    assert_true((f & GCOLL_CODEC_SPARSE) && (f & GCOLL_CODEC_QUANTIZED));
    assert_false(f & GCOLL_CODEC_RANDOMK);
    gcoll_compressor_destroy(c);
    c = mk("randomk:density=0.1,seed=1");
    assert_true(gcoll_compressor_flags(c) & GCOLL_CODEC_RANDOMK);
    gcoll_compressor_destroy(c);
    c = mk("none");
    assert_true(gcoll_compressor_flags(c) & GCOLL_CODEC_LOSSLESS);
    gcoll_compressor_destroy(c);
    c = mk("dgc:density=0.01");
    assert_true(gcoll_compressor_flags(c) & GCOLL_CODEC_NEEDS_STATE);
    gcoll_compressor_destroy(c);
    c = mk("none:clip_value=4");
    assert_false(gcoll_compressor_flags(c) & GCOLL_CODEC_LOSSLESS);
    gcoll_compressor_destroy(c);
    /* random-k's form follows ef: contractive (unscaled) with it, unbiased (n/k) without */
    c = mk("randomk:density=0.1");
    assert_non_null(strstr(gcoll_compressor_spec(c), "unbiased=0"));
    gcoll_compressor_destroy(c);
    c = mk("randomk:density=0.1,ef=0");
    assert_non_null(strstr(gcoll_compressor_spec(c), "unbiased=1"));
    gcoll_compressor_destroy(c);
}

static void test_spec_errors(void **unused)
{
    (void)unused;
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"", "empty"},
        {"topk", "density"},
        {"topk:density=0", "density=0"},
        {"topk:density=1.5", "density=1.5"},
        {"topk:density=abc", "density=abc"},
        {"topk:density=0.1,k=5", "exactly one"},
        {"topk:density=0.1,density=0.2", "twice"},
        {"topk:density=0.1,select=best", "select=best"},
        {"topk:density=0.1,reuse_steps=3", "reuse_steps"},
        {"topk:density=0.1,bogus=1", "bogus"},
        {"topk:density=0.1,", "not key=value"},
        {"topk:", "empty option"},
        {"foo", "foo"},
        {"randomk:seed=1", "density"},
        {"randomk:density=0.1,unbiased=2", "unbiased=2"},
        {"randomk:density=0.1,seed=-1", "seed=-1"},
        {"threshold", "tau"},
        {"threshold:tau=-1", "tau=-1"},
        {"threshold:tau=2E-223", "tau=2E-223"}, /* underflows a float: fuzzer finding */
        {"qsgd:bits=1", "bits=1"},
        {"qsgd:bits=9", "bits=9"},
        {"qsgd:bucket=0", "bucket=0"},
        {"sign:scale=max", "scale=max"},
        {"sign:chunk=12", "chunk=12"},
        {"fp16:clip=0", "clip=0"},
        {"fp16:clip_value=0", "clip_value=0"},
        {"fp16:clip_value=-1", "clip_value=-1"},
        {"fp16:clip_value=1,clip_value=2", "twice"},
        {"topk:density=0.1,clip_value=1+q8:clip_value=2", "twice"},
        {"randomk:density=0.1,unbiased=1", "not a contraction"},
        {"fp16:ef=2", "ef=2"},
        {"none+q8", "sparsifier"},
        {"topk:density=0.1+none", "+none"},
        {"topk:density=0.1+q8+fp16", "at most one"},
        {"dgc:density=0.01,ef=0", "ef=0"},
        {"dgc:momentum=1.0", "momentum=1.0"},
        {"dgc:momentum=0.999999999099", "as a float"}, /* rounds to 1.0f (fuzzer) */
        {"dgc:schedule=cosine,warmup_steps=3", "schedule=cosine"},
        {"topk:density=0.1 ", "white space"},
        {"topk:k=5,warmup_steps=3", "warmup_steps"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        char err[256];
        gcoll_compressor_t *c = (gcoll_compressor_t *)0x1;
        assert_int_equal(gcoll_compressor_check(bad[i].spec, err, sizeof(err)), GCOLL_ERR_INVALID);
        assert_int_equal(gcoll_compressor_create(bad[i].spec, &c), GCOLL_ERR_INVALID);
        assert_ptr_equal(c, (gcoll_compressor_t *)0x1); /* output untouched */
        if (!strstr(err, bad[i].needle))
            fail_msg("error for '%s' does not name '%s': %s", bad[i].spec, bad[i].needle, err);
    }
    assert_int_equal(gcoll_compressor_create(NULL, NULL), GCOLL_ERR_INVALID);
}

/* --- dense round trips ----------------------------------------------------------------- */

static void test_roundtrip_dense(void **unused)
{
    (void)unused;
    const size_t n = 4099; /* odd: exercises the kernels' tails */
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    fill(x, n, 1);
    /* fp16 edge cases: subnormals, rounding ties, overflow to the largest finite */
    x[0] = 65504.0f;
    x[1] = 1e-7f;
    x[2] = 5.96e-8f;
    x[3] = -2.0e-5f;
    x[4] = 1.0f + 1.0f / 2048.0f; /* tie: rounds to even */
    x[5] = 65519.0f;
    x[6] = -1e6f;   /* beyond fp16: saturates to -65504 */
    x[7] = 3.4e38f; /* rounds up to Inf in bf16: saturates to its largest finite */
    FOR_EACH_SIMD(lvl)
    {
        size_t len;
        gcoll_compressor_t *c = mk("none");
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(len, 48 + 4 * n);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        assert_memory_equal(d, x, n * sizeof(float));
        free(b);
        gcoll_compressor_destroy(c);

        c = mk("fp16");
        b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(len, 48 + 2 * n);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t i = 0; i < n; i++) {
            float want =
                gcoll_f16_to_f32(gcoll_f32_to_f16(fmaxf(-65504.0f, fminf(x[i], 65504.0f))));
            if (memcmp(&want, &d[i], 4))
                fail_msg("fp16 %zu: %a -> %a, want %a", i, (double)x[i], (double)d[i],
                         (double)want);
            if (fabsf(x[i]) >= 6.1e-5f && fabsf(x[i]) <= 65504.0f)
                assert_true(fabsf(d[i] - x[i]) <= fabsf(x[i]) * (1.0f / 2048.0f));
        }
        free(b);
        gcoll_compressor_destroy(c);

        c = mk("bf16");
        b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t i = 0; i < n; i++) {
            float want = i == 7 ? 3.38953139e38f : gcoll_bf16_to_f32(gcoll_f32_to_bf16(x[i]));
            assert_memory_equal(&want, &d[i], 4);
            assert_true(fabsf(d[i] - x[i]) <= fabsf(x[i]) * (1.0f / 256.0f));
        }
        free(b);
        gcoll_compressor_destroy(c);

        c = mk("q8:bucket=100");
        b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(len, 48 + 4 * ((n + 99) / 100) + n);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t lo = 0; lo < n; lo += 100) {
            float mx = 0;
            for (size_t i = lo; i < lo + 100 && i < n; i++)
                mx = fmaxf(mx, fabsf(x[i]));
            float bound = mx / 127.0f * 0.5f * 1.0001f + 1e-30f;
            for (size_t i = lo; i < lo + 100 && i < n; i++)
                if (!(fabsf(d[i] - x[i]) <= bound))
                    fail_msg("q8 %zu: %g -> %g, bound %g", i, (double)x[i], (double)d[i],
                             (double)bound);
        }
        free(b);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
    free(d);
}

/* Subnormal-only buckets: 127/max and s/norm overflow; the encoders send zeros (found by
 * the encode fuzzer as undefined float-to-int conversions of NaN). */
static void test_tiny_values(void **unused)
{
    (void)unused;
    static const char *specs[] = {"q8:bucket=4", "qsgd:bits=3,bucket=4", "sign", "fp16",
                                  "topk:density=0.5+q8:bucket=2"};
    float x[8] = {1e-45f, -1e-45f, 0.0f, 2e-45f, 1e-40f, 0.0f, -3e-45f, 1e-44f}, d[8];
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, 8, &s), GCOLL_OK);
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, 8, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, 8, 0), GCOLL_OK);
        for (int i = 0; i < 8; i++) {
            assert_true(isfinite(d[i]) && fabsf(d[i]) <= 1e-38f);
            assert_true(isfinite(gcoll_state_residual(s)[i]));
        }
        free(b);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
}

/* Sign: value = +-scale with the input's sign; scale per chunk is mean |x| or
 * ||x||_2 / sqrt(m), checked against a double-precision reference. */
static void test_sign_scale(void **unused)
{
    (void)unused;
    const size_t n = 1000;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    fill(x, n, 2);
    static const char *specs[] = {"sign", "sign:scale=l2", "sign:chunk=64",
                                  "sign:scale=l2,chunk=128"};
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < 4; sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        size_t len;
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        size_t chunk = c->vs.bucket ? c->vs.bucket : n;
        for (size_t lo = 0; lo < n; lo += chunk) {
            size_t m = lo + chunk > n ? n - lo : chunk;
            double s1 = 0, s2 = 0;
            for (size_t i = lo; i < lo + m; i++) {
                s1 += fabs((double)x[i]);
                s2 += (double)x[i] * x[i];
            }
            double want = c->vs.sign_l2 ? sqrt(s2 / (double)m) : s1 / (double)m;
            for (size_t i = lo; i < lo + m; i++) {
                assert_true(fabs(fabs((double)d[i]) - want) <= 1e-5 * want);
                assert_int_equal(signbit(d[i]) != 0, signbit(x[i]) != 0);
            }
        }
        free(b);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
    free(d);
}

/* Generic and AVX2 kernels must produce identical messages and decodes. */
static void test_simd_equivalence(void **unused)
{
    (void)unused;
    static const char *specs[] = {"none",
                                  "fp16",
                                  "bf16",
                                  "q8:bucket=37",
                                  "sign",
                                  "sign:scale=l2,chunk=64",
                                  "qsgd:bits=3,bucket=33",
                                  "topk:density=0.05",
                                  "topk:density=0.02+q8",
                                  "threshold:tau=0.3",
                                  "topk:density=0.01,select=sample"};
    const size_t sizes[] = {1, 7, 8, 31, 33, 1000, 65537};
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++)
        for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
            size_t n = sizes[z];
            float *x = malloc(n * sizeof(float));
            float *d0 = malloc(n * sizeof(float)), *d1 = malloc(n * sizeof(float));
            fill(x, n, 3 + z);
            gcoll_compressor_t *c = mk(specs[sp]);
            size_t cap = gcoll_compressor_bound(c, n), l0, l1;
            uint8_t *b0 = malloc(cap), *b1 = malloc(cap);
            gcoll_tensor_state_t *s0, *s1; /* states make QSGD's noise repeatable */
            assert_int_equal(gcoll_state_create(c, n, &s0), GCOLL_OK);
            assert_int_equal(gcoll_state_create(c, n, &s1), GCOLL_OK);
            gcoll_simd_set(GCOLL_SIMD_GENERIC);
            assert_int_equal(gcoll_encode(c, s0, x, n, b0, cap, &l0), GCOLL_OK);
            assert_int_equal(gcoll_decode(c, b0, l0, d0, n, 0), GCOLL_OK);
            gcoll_simd_set(GCOLL_SIMD_AVX2);
            assert_int_equal(gcoll_encode(c, s1, x, n, b1, cap, &l1), GCOLL_OK);
            assert_int_equal(gcoll_decode(c, b1, l1, d1, n, 0), GCOLL_OK);
            if (l0 != l1 || memcmp(b0, b1, l0))
                fail_msg("%s n=%zu: generic and avx2 messages differ", specs[sp], n);
            assert_memory_equal(d0, d1, n * sizeof(float));
            assert_memory_equal(gcoll_state_residual(s0), gcoll_state_residual(s1),
                                n * sizeof(float));
            gcoll_state_destroy(s0);
            gcoll_state_destroy(s1);
            gcoll_compressor_destroy(c);
            free(b0);
            free(b1);
            free(x);
            free(d0);
            free(d1);
        }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
}

/* --- selection ----------------------------------------------------------------------- */

typedef struct {
    float a;
    uint32_t i;
} ai_t;
static int by_mag_desc(const void *p, const void *q)
{
    const ai_t *x = p, *y = q;
    if (x->a != y->a)
        return x->a > y->a ? -1 : 1;
    return x->i < y->i ? -1 : 1;
}

static void test_topk_exact(void **unused)
{
    (void)unused;
    const size_t sizes[] = {1, 10, 1000, 100003};
    const double dens[] = {0.001, 0.01, 0.3, 1.0};
    FOR_EACH_SIMD(lvl)
    for (size_t z = 0; z < 4; z++)
        for (size_t dd = 0; dd < 4; dd++) {
            size_t n = sizes[z];
            float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
            fill(x, n, 10 + z);
            char spec[64];
            snprintf(spec, sizeof(spec), "topk:density=%g", dens[dd]);
            gcoll_compressor_t *c = mk(spec);
            size_t k = gcoll_codec_k(c, n, 0), len;
            uint8_t *b = encode_alloc(c, NULL, x, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            ai_t *r = malloc(n * sizeof(ai_t));
            for (size_t i = 0; i < n; i++)
                r[i] = (ai_t){fabsf(x[i]), (uint32_t)i};
            qsort(r, n, sizeof(ai_t), by_mag_desc);
            char *want = calloc(n, 1);
            for (size_t j = 0; j < k; j++)
                if (r[j].a > 0)
                    want[r[j].i] = 1;
            for (size_t i = 0; i < n; i++) {
                float exp = want[i] ? x[i] : 0.0f;
                if (memcmp(&exp, &d[i], 4))
                    fail_msg("%s n=%zu: element %zu is %g, want %g", spec, n, i, (double)d[i],
                             (double)exp);
            }
            free(want);
            free(r);
            free(b);
            free(x);
            free(d);
            gcoll_compressor_destroy(c);
        }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
}

/* Sampled selection sends 0.9k..k of the largest: nothing unsent is larger than what
 * was sent. */
/* The NaN/Inf scan returns the first non-finite element (or n) under both kernel sets:
 * sizes around its 256-element blocks, NaN, +-Inf, one or two bad values, at the edges. */
static void test_first_bad(void **unused)
{
    (void)unused;
    static const size_t sizes[] = {0, 1, 7, 255, 256, 257, 511, 1000, 4099};
    const float bads[] = {NAN, INFINITY, -INFINITY, -NAN};
    float *x = malloc(4099 * sizeof(float));
    FOR_EACH_SIMD(lvl)
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        fill(x, n, 5 + si);
        for (size_t i = 0; i < n; i++) /* large finite values must not count */
            x[i] = i % 5 == 0 ? 3.0e38f * (i % 2 ? -1.0f : 1.0f) : x[i];
        assert_int_equal(gcoll_kernels()->first_bad(x, n), n);
        size_t at[] = {0, n / 3, n / 2, n > 0 ? n - 1 : 0, 255, 256};
        for (size_t ai = 0; ai < sizeof(at) / sizeof(at[0]); ai++) {
            if (at[ai] >= n)
                continue;
            float keep = x[at[ai]];
            x[at[ai]] = bads[ai % 4];
            assert_int_equal(gcoll_kernels()->first_bad(x, n), at[ai]);
            if (at[ai] + 1 < n) { /* a second one later does not change the answer */
                float k2 = x[n - 1];
                x[n - 1] = bads[(ai + 1) % 4];
                assert_int_equal(gcoll_kernels()->first_bad(x, n), at[ai]);
                x[n - 1] = k2;
            }
            x[at[ai]] = keep;
        }
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
}

static void test_topk_sample(void **unused)
{
    (void)unused;
    const size_t n = 200000;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    FOR_EACH_SIMD(lvl)
    for (int trial = 0; trial < 4; trial++) {
        fill(x, n, 20 + (uint64_t)trial);
        for (size_t i = 0; i < n; i++) /* continuous values: the sample sees no ties */
            x[i] = x[i] == 0.5f ? 0.5f * rndf() : x[i];
        gcoll_compressor_t *c =
            mk(trial % 2 ? "topk:density=0.001,select=sample" : "topk:density=0.01,select=sample");
        size_t k = gcoll_codec_k(c, n, 0), len, nnz;
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        assert_int_equal(gcoll_decode_info(b, len, NULL, &nnz), GCOLL_OK);
        assert_true(nnz <= k && nnz >= k - k / 10);
        float min_sent = INFINITY, max_unsent = 0;
        for (size_t i = 0; i < n; i++) {
            if (d[i] != 0) {
                assert_true(d[i] == x[i]);
                min_sent = fminf(min_sent, fabsf(x[i]));
            } else {
                max_unsent = fmaxf(max_unsent, fabsf(x[i]));
            }
        }
        assert_true(min_sent >= max_unsent);
        free(b);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
    free(d);
}

static void test_threshold(void **unused)
{
    (void)unused;
    const size_t n = 10000;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    fill(x, n, 30);
    const char *specs[] = {"threshold:tau=0.05", "threshold:tau=0.0000001"};
    for (int t = 0; t < 2; t++) {
        gcoll_compressor_t *c = mk(specs[t]);
        size_t len;
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(d[i] == (fabsf(x[i]) >= c->tau ? x[i] : 0.0f));
        /* the dense fallback never costs more than a dense message */
        assert_true(len <= 48 + 4 * n);
        free(b);
        gcoll_compressor_destroy(c);
    }
    free(x);
    free(d);
}

static void test_randomk(void **unused)
{
    (void)unused;
    const size_t n = 5000;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    fill(x, n, 40);
    gcoll_compressor_t *c = mk("randomk:density=0.02,seed=9");
    gcoll_compressor_t *c2 = mk("randomk:density=0.02,seed=9");
    gcoll_compressor_t *c3 = mk("randomk:density=0.02,seed=9,unbiased=1,ef=0");
    size_t k = gcoll_codec_k(c, n, 0);
    assert_int_equal(k, 100);
    uint32_t *i1 = malloc(k * 4), *i2 = malloc(k * 4), *pi = malloc(k * 4);
    float *pv = malloc(k * 4);
    /* same (seed, step, offset) -> same indices on every "rank" */
    assert_int_equal(gcoll_randomk_indices(gcoll_randomk_key(c, 3, 0), n, k, i1, NULL), GCOLL_OK);
    assert_int_equal(gcoll_randomk_indices(gcoll_randomk_key(c2, 3, 0), n, k, i2, NULL), GCOLL_OK);
    assert_memory_equal(i1, i2, k * 4);
    for (size_t j = 1; j < k; j++)
        assert_true(i1[j] > i1[j - 1]);
    assert_true(i1[k - 1] < n);
    assert_int_equal(gcoll_randomk_indices(gcoll_randomk_key(c, 4, 0), n, k, i2, NULL), GCOLL_OK);
    assert_memory_not_equal(i1, i2, k * 4); /* another step, other indices */
    /* only values travel: header + 4k bytes */
    size_t len, nnz;
    uint8_t *b = encode_alloc(c, NULL, x, n, &len);
    assert_int_equal(len, 48 + 4 * k);
    assert_int_equal(gcoll_decode_pairs(c, b, len, n, pi, pv, k, &nnz), GCOLL_OK);
    assert_int_equal(gcoll_randomk_indices(gcoll_randomk_key(c, 0, 0), n, k, i1, NULL), GCOLL_OK);
    assert_memory_equal(pi, i1, k * 4);
    for (size_t j = 0; j < k; j++)
        assert_true(pv[j] == x[pi[j]]);
    free(b);
    b = encode_alloc(c3, NULL, x, n, &len);
    assert_int_equal(gcoll_decode_pairs(c3, b, len, n, pi, pv, k, &nnz), GCOLL_OK);
    for (size_t j = 0; j < k; j++)
        assert_true(pv[j] == x[pi[j]] * 50.0f);
    /* every index is reachable: k = n gives all of them */
    assert_int_equal(gcoll_randomk_indices(77, 64, 64, i1, NULL), GCOLL_OK);
    for (uint32_t j = 0; j < 64; j++)
        assert_int_equal(i1[j], j);
    assert_int_equal(gcoll_randomk_indices(77, 10, 11, i1, NULL), GCOLL_ERR_INVALID);
    free(b);
    free(i1);
    free(i2);
    free(pi);
    free(pv);
    free(x);
    free(d);
    gcoll_compressor_destroy(c);
    gcoll_compressor_destroy(c2);
    gcoll_compressor_destroy(c3);
}

/* Accumulating a sparse message adds its values and leaves every other element alone. */
static void test_decode_accumulate_and_pairs(void **unused)
{
    (void)unused;
    const size_t n = 50000;
    float *x = malloc(n * 4), *d = malloc(n * 4), *ref = malloc(n * 4);
    fill(x, n, 90);
    gcoll_compressor_t *c = mk("topk:density=0.002");
    size_t len, nnz, k = gcoll_codec_k(c, n, 0);
    uint8_t *b = encode_alloc(c, NULL, x, n, &len);
    for (size_t i = 0; i < n; i++)
        d[i] = ref[i] = (float)i;
    assert_int_equal(gcoll_decode(c, b, len, d, n, 1), GCOLL_OK);
    uint32_t *pi = malloc(k * 4);
    float *pv = malloc(k * 4);
    assert_int_equal(gcoll_decode_pairs(c, b, len, n, pi, pv, k - 1, &nnz), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_decode_pairs(c, b, len, n, pi, pv, k, &nnz), GCOLL_OK);
    assert_int_equal(nnz, k);
    for (size_t j = 0; j < nnz; j++) {
        ref[pi[j]] += pv[j];
        assert_true(pv[j] == x[pi[j]]);
    }
    assert_memory_equal(d, ref, n * 4);
    /* pairs -> message -> pairs (as the sparse allreduce re-sends merged chunks) */
    uint8_t *b2 = malloc(gcoll_codec_pairs_bound(c, nnz, n));
    size_t len2, nnz2;
    assert_int_equal(
        gcoll_codec_encode_pairs(c, pi, pv, nnz, n, b2, gcoll_codec_pairs_bound(c, nnz, n), &len2),
        GCOLL_OK);
    uint32_t *qi = malloc(k * 4);
    float *qv = malloc(k * 4);
    assert_int_equal(gcoll_decode_pairs(c, b2, len2, n, qi, qv, k, &nnz2), GCOLL_OK);
    assert_int_equal(nnz2, nnz);
    assert_memory_equal(qi, pi, nnz * 4);
    assert_memory_equal(qv, pv, nnz * 4);
    if (nnz > 2) { /* unsorted or duplicated pairs are refused */
        uint32_t t = pi[0];
        pi[0] = pi[1];
        pi[1] = t;
        assert_int_equal(gcoll_codec_encode_pairs(c, pi, pv, nnz, n, b2, len2, &len2),
                         GCOLL_ERR_INVALID);
    }
    free(b);
    free(b2);
    free(pi);
    free(pv);
    free(qi);
    free(qv);
    free(x);
    free(d);
    free(ref);
    gcoll_compressor_destroy(c);
}

/* --- QSGD decoding ------------------------------------------------------------------- */

static const size_t qdec_sizes[] = {0, 1, 7, 8, 9, 63, 65, 4097, 20011};
#define N_QDEC_SIZES (sizeof(qdec_sizes) / sizeof(*qdec_sizes))

/* Independent of values.c and the kernels: code j is bits [jB, jB + B) of the stream,
 * LSB first, read one bit at a time. */
static uint32_t ref_code(const uint8_t *p, unsigned B, size_t j)
{
    uint32_t v = 0;
    for (unsigned b = 0; b < B; b++) {
        size_t bit = j * B + b;
        v |= (uint32_t)((p[bit / 8] >> (bit % 8)) & 1u) << b;
    }
    return v;
}
static void ref_pack(const uint32_t *codes, size_t n, unsigned B, uint8_t *p)
{
    memset(p, 0, (n * B + 7) / 8);
    for (size_t j = 0; j < n; j++)
        for (unsigned b = 0; b < B; b++) {
            size_t bit = j * B + b;
            p[bit / 8] |= (uint8_t)(((codes[j] >> b) & 1u) << (bit % 8));
        }
}
/* the decoded value: level (code - s) times scale / s, the scale divided first */
static float ref_value(uint32_t code, uint32_t s, float scale)
{
    float f = scale / (float)s;
    return (float)((int32_t)code - (int32_t)s) * f;
}
static float ref_apply(float o, float v, int mode)
{
    return mode == GCOLL_DECODE_SET ? v : mode == GCOLL_DECODE_ADD ? o + v : o - v;
}

/* The qsgd_apply kernels, generic and AVX2, against the scalar formula bit for bit, from
 * every start offset modulo 8, on a stream in an exact-size allocation (so a read past
 * its end shows under ASan/valgrind); qsgd_bad finds a lone 2^B - 1 code and only
 * within the first n codes. */
static void test_qsgd_decode_kernels(void **unused)
{
    (void)unused;
    const size_t nmax = 20011;
    uint32_t *codes = malloc(nmax * 4);
    float *o0 = malloc(nmax * 4), *ref = malloc(nmax * 4), *got = malloc(nmax * 4);
    for (unsigned B = 2; B <= 8; B++) {
        const uint32_t s = (1u << (B - 1)) - 1u, top = (1u << B) - 1u;
        const float scale = 0.75f + (float)B / 3.0f, f = scale / (float)s;
        for (size_t zi = 0; zi < N_QDEC_SIZES; zi++) {
            size_t n = qdec_sizes[zi], plen = (n * B + 7) / 8;
            uint8_t *p = malloc(plen ? plen : 1);
            for (size_t j = 0; j < n; j++)
                codes[j] = j < 2 * s + 1 ? (uint32_t)j : rnd32() % (2 * s + 1);
            ref_pack(codes, n, B, p);
            for (size_t j = 0; j < n; j++)
                o0[j] = rndf() * 4.0f;
            for (size_t i0 = 0; i0 < GCOLL_MIN(n + 1, (size_t)9); i0++)
                for (int mode = 0; mode <= 2; mode++) {
                    size_t m = n - i0;
                    for (size_t j = 0; j < m; j++)
                        ref[j] =
                            ref_apply(o0[j], ref_value(ref_code(p, B, i0 + j), s, scale), mode);
                    FOR_EACH_SIMD(lvl)
                    {
                        memcpy(got, o0, m * 4);
                        gcoll_kernels()->qsgd_apply(p, plen, i0, m, B, s, f, got, mode);
                        if (m && memcmp(got, ref, m * 4))
                            fail_msg("qsgd_apply %s B=%u n=%zu i0=%zu mode %d differs",
                                     gcoll_simd_name(gcoll_simd_active()), B, n, i0, mode);
                    }
                }
            FOR_EACH_SIMD(lvl)
            {
                const gcoll_kernels_t *k = gcoll_kernels();
                assert_false(k->qsgd_bad(p, plen, n, B));
                if (n == 0)
                    continue;
                size_t at[] = {0, n / 2, n - 1};
                for (size_t a = 0; a < 3; a++) {
                    uint32_t keep = codes[at[a]];
                    codes[at[a]] = top;
                    ref_pack(codes, n, B, p);
                    assert_true(k->qsgd_bad(p, plen, n, B));
                    /* the codes before it alone are clean */
                    assert_false(k->qsgd_bad(p, plen, at[a], B));
                    codes[at[a]] = keep;
                }
                ref_pack(codes, n, B, p);
            }
            free(p);
        }
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(codes), free(o0), free(ref), free(got);
}

/* Whole messages: gcoll_decode in every mode equals the scalar formula over the message
 * bytes (norms, then the packed codes) under both kernel sets; a code of 2^B - 1 makes
 * it fail with out untouched. */
static void test_qsgd_decode_messages(void **unused)
{
    (void)unused;
    static const char *specs[] = {"qsgd:bits=4,bucket=512",  "qsgd:bits=8,bucket=512",
                                  "qsgd:bits=3,bucket=33",   "qsgd:bits=5,bucket=7",
                                  "qsgd:bits=2,bucket=4096", "qsgd:bits=7,bucket=8"};
    const size_t nmax = 20011;
    float *x = malloc(nmax * 4), *o0 = malloc(nmax * 4), *ref = malloc(nmax * 4);
    float *got = malloc(nmax * 4);
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        const unsigned B = c->vs.bits;
        const uint32_t s = (1u << (B - 1)) - 1u;
        for (size_t zi = 0; zi < N_QDEC_SIZES; zi++) {
            size_t n = qdec_sizes[zi], len;
            fill(x, n, 200 + zi);
            for (size_t j = 0; j < n; j++)
                o0[j] = rndf();
            uint8_t *msg = encode_alloc(c, NULL, x, n, &len);
            size_t nb = n ? (n + c->vs.bucket - 1) / c->vs.bucket : 0;
            const uint8_t *norms = msg + GCOLL_WIRE_HDR, *body = norms + 4 * nb;
            assert_int_equal(len, GCOLL_WIRE_HDR + 4 * nb + (n * B + 7) / 8);
            for (int mode = 0; mode <= 2; mode++) {
                for (size_t j = 0; j < n; j++) {
                    float scale;
                    memcpy(&scale, norms + 4 * (j / c->vs.bucket), 4);
                    ref[j] = ref_apply(o0[j], ref_value(ref_code(body, B, j), s, scale), mode);
                }
                FOR_EACH_SIMD(lvl)
                {
                    memcpy(got, o0, n * 4);
                    assert_int_equal(gcoll_codec_decode(c, msg, len, got, n, mode), GCOLL_OK);
                    if (n && memcmp(got, ref, n * 4))
                        fail_msg("%s n=%zu mode %d (%s): decode differs", specs[sp], n, mode,
                                 gcoll_simd_name(gcoll_simd_active()));
                }
            }
            if (n) { /* the last code, then the first, set to 2^B - 1 */
                size_t at[] = {n - 1, 0};
                for (size_t a = 0; a < 2; a++) {
                    uint8_t *bad = malloc(len);
                    memcpy(bad, msg, len);
                    size_t bit = at[a] * B;
                    for (unsigned b = 0; b < B; b++, bit++)
                        bad[GCOLL_WIRE_HDR + 4 * nb + bit / 8] |= (uint8_t)(1u << (bit % 8));
                    FOR_EACH_SIMD(lvl)
                    {
                        memcpy(got, o0, n * 4);
                        assert_int_equal(gcoll_codec_decode(c, bad, len, got, n, GCOLL_DECODE_ADD),
                                         GCOLL_ERR_INVALID);
                        assert_memory_equal(got, o0, n * 4);
                    }
                    free(bad);
                }
            }
            free(msg);
        }
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x), free(o0), free(ref), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_valid),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_roundtrip_dense),
        cmocka_unit_test(test_sign_scale),
        cmocka_unit_test(test_tiny_values),
        cmocka_unit_test(test_simd_equivalence),
        cmocka_unit_test(test_topk_exact),
        cmocka_unit_test(test_topk_sample),
        cmocka_unit_test(test_first_bad),
        cmocka_unit_test(test_threshold),
        cmocka_unit_test(test_randomk),
        cmocka_unit_test(test_decode_accumulate_and_pairs),
        cmocka_unit_test(test_qsgd_decode_kernels),
        cmocka_unit_test(test_qsgd_decode_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
