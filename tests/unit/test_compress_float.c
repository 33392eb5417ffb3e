/* test_compress_float.c: fp8 / OCP MX value formats and stochastic rounding of fp16/bf16:
 * rounding against brute-force references, MX block bounds and sizes, unbiasedness,
 * malformed messages, both kernel builds, error feedback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "compress_test_util.h"
#include "gcoll.h"

/* Element formats, spelled out independently of the codec: value of a magnitude code. */
typedef struct {
    int m, bias, ebits;
    unsigned maxcode;
} efmt_t;
static const efmt_t E4M3 = {3, 7, 4, 0x7e}, E5M2 = {2, 15, 5, 0x7b}, E2M1 = {1, 1, 2, 0x7};

static double ref_val(const efmt_t *f, unsigned c)
{
    unsigned E = c >> f->m, M = c & ((1u << f->m) - 1u);
    if (E == 0)
        return ldexp((double)M, 1 - f->bias - f->m);
    return ldexp(1.0 + (double)M / (double)(1u << f->m), (int)E - f->bias);
}

/* Nearest code to |v| by search, ties to the even code (largest normal if beyond it). */
static unsigned ref_nearest(const efmt_t *f, double v)
{
    unsigned best = 0;
    for (unsigned c = 1; c <= f->maxcode; c++) {
        double dc = fabs(ref_val(f, c) - v), db = fabs(ref_val(f, best) - v);
        if (dc < db || (dc == db && (c & 1u) == 0))
            best = c;
    }
    return best;
}

static void test_spec_names(void **unused)
{
    (void)unused;
    static const char *const in[] = {"bf16:round=stochastic",
                                     "fp16:round=stochastic",
                                     "fp8:format=e4m3,round=nearest",
                                     "fp8:format=e5m2,round=stochastic",
                                     "mxfp8:format=e4m3",
                                     "mxfp8:format=e5m2",
                                     "mxfp4",
                                     "bf16",
                                     "topk:density=0.1+fp8:format=e5m2"};
    static const char *const canon[] = {"bf16:round=stochastic,ef=1",
                                        "fp16:round=stochastic,ef=1",
                                        "fp8:format=e4m3,round=nearest,ef=1",
                                        "fp8:format=e5m2,round=stochastic,ef=1",
                                        "mxfp8:format=e4m3,round=nearest,ef=1",
                                        "mxfp8:format=e5m2,round=nearest,ef=1",
                                        "mxfp4:round=nearest,ef=1",
                                        "bf16:ef=1",
                                        "topk:density=0.1,select=exact+fp8:format=e5m2,round="
                                        "nearest,ef=1"};
    for (size_t i = 0; i < sizeof(in) / sizeof(*in); i++) {
        gcoll_compressor_t *c = mk(in[i]);
        assert_string_equal(gcoll_compressor_spec(c), canon[i]);
        gcoll_compressor_t *c2 = mk(canon[i]); /* the canonical form parses back */
        assert_string_equal(gcoll_compressor_spec(c2), canon[i]);
        gcoll_compressor_destroy(c2);
        gcoll_compressor_destroy(c);
    }
    static const char *const bad[] = {"fp8:format=e3m4",     "mxfp4:format=e4m3",
                                      "q8:round=stochastic", "fp8:round=up",
                                      "mxfp8:bucket=16",     "fp8:format=e4m3,format=e5m2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        assert_int_equal(gcoll_compressor_check(bad[i], NULL, 0), GCOLL_ERR_INVALID);
    gcoll_compressor_t *c = mk("fp8:round=stochastic");
    assert_true(gcoll_compressor_flags(c) & GCOLL_CODEC_STOCHASTIC);
    gcoll_compressor_destroy(c);
}

/* Bytes of the value section after the 48-byte header. */
static size_t payload(gcoll_compressor_t *c, const float *x, size_t n)
{
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, x, n, &len);
    free(b);
    return len - 48;
}

/* MX v1.0: X = 2^(floor(log2 max|V|) - emax_elem); each element the nearest of V / X in the
 * element format, clamped at its largest normal; 8.25 / 4.25 bits a value. */
static void test_mx_blocks(void **unused)
{
    (void)unused;
    struct {
        const char *spec;
        const efmt_t *f;
        int emax;
    } fm[] = {
        {"mxfp8:format=e4m3", &E4M3, 8}, {"mxfp8:format=e5m2", &E5M2, 15}, {"mxfp4", &E2M1, 2}};
    const size_t n = 32 * 40;
    float *x = malloc(n * 4), *d = malloc(n * 4);
    fill(x, n, 3);
    x[5] = 500.0f;  /* amax 500 = 1.95 * 2^8: elements beyond 1.75 * 2^emax clamp */
    x[64] = 1e-39f; /* a block of float subnormals and zeros */
    for (size_t i = 65; i < 96; i++)
        x[i] = 0.0f;
    x[100] = -3.0e38f; /* the largest scales */
    FOR_EACH_SIMD(lvl)
    {
        for (size_t k = 0; k < 3; k++) {
            gcoll_compressor_t *c = mk(fm[k].spec);
            const int fp4 = fm[k].f == &E2M1;
            assert_int_equal(payload(c, x, n), n / 32 + (fp4 ? n / 2 : n)); /* 8.25 / 4.25 */
            assert_int_equal(payload(c, x, 31), 1 + (fp4 ? 16 : 31));
            size_t len;
            uint8_t *b = encode_alloc(c, NULL, x, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            for (size_t blk = 0; blk < n / 32; blk++) {
                float amax = 0;
                for (size_t i = 0; i < 32; i++)
                    amax = fmaxf(amax, fabsf(x[32 * blk + i]));
                int e;
                (void)frexpf(amax, &e); /* amax = f 2^e, f in [0.5, 1): floor(log2) = e - 1 */
                int want = amax >= 1.17549435e-38f ? e - 1 - fm[k].emax : -127;
                if (want < -127)
                    want = -127;
                assert_int_equal((int)b[48 + blk], want + 127);
                double X = ldexp(1.0, want);
                for (size_t i = 0; i < 32; i++) {
                    size_t j = 32 * blk + i;
                    double v = fabs((double)x[j]) / X;
                    if (fabsf(x[j]) < 1.17549435e-38f)
                        v = 0; /* float subnormals count as zero */
                    double ref = ref_val(fm[k].f, ref_nearest(fm[k].f, v)) * X;
                    if (x[j] < 0)
                        ref = -ref;
                    if ((double)d[j] != ref)
                        fail_msg("%s element %zu: %g decodes to %g, want %g", fm[k].spec, j,
                                 (double)x[j], (double)d[j], ref);
                    assert_true(fabs((double)d[j]) <= ref_val(fm[k].f, fm[k].f->maxcode) * X);
                }
            }
            /* the clamped element: 500 / 2^0 beyond 448 */
            if (fm[k].f == &E4M3)
                assert_true(d[5] == 448.0f);
            free(b);
            gcoll_compressor_destroy(c);
        }
    }
    free(x);
    free(d);
}

/* fp8: a power-of-two scale with max|x| / scale <= the largest normal, the smallest such;
 * elements the nearest E4M3 / E5M2 value. */
static void test_fp8_nearest(void **unused)
{
    (void)unused;
    const size_t n = 3001;
    float *x = malloc(n * 4), *d = malloc(n * 4);
    fill(x, n, 9);
    FOR_EACH_SIMD(lvl)
    {
        for (int k = 0; k < 2; k++) {
            const efmt_t *f = k ? &E5M2 : &E4M3;
            gcoll_compressor_t *c = mk(k ? "fp8:format=e5m2" : "fp8:format=e4m3");
            size_t len;
            uint8_t *b = encode_alloc(c, NULL, x, n, &len);
            assert_int_equal(len, 48 + 4 + n);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            float scale;
            memcpy(&scale, b + 48, 4);
            float amax = 0;
            for (size_t i = 0; i < n; i++)
                amax = fmaxf(amax, fabsf(x[i]));
            double fmax = ref_val(f, f->maxcode);
            int e;
            assert_true(frexpf(scale, &e) == 0.5f); /* a power of two */
            assert_true(amax / (double)scale <= fmax && amax / (double)scale > fmax / 2);
            for (size_t i = 0; i < n; i++) {
                double ref = ref_val(f, ref_nearest(f, fabs((double)x[i]) / scale)) * scale;
                if (x[i] < 0)
                    ref = -ref;
                if ((double)d[i] != ref)
                    fail_msg("fp8 %d element %zu: %g -> %g, want %g", k, i, (double)x[i],
                             (double)d[i], ref);
            }
            free(b);
            gcoll_compressor_destroy(c);
        }
    }
    free(x);
    free(d);
}

/* Stochastic rounding is unbiased: the mean of N encodings of x is x within 4.5 standard
 * errors, each value's variance computed from the two neighbours it rounds between
 * (p (1 - p) (hi - lo)^2, from the decoded values actually seen). Stateless encodes draw
 * fresh noise each call. The seeds are fixed (the generator is deterministic). */
static void test_unbiased(void **unused)
{
    (void)unused;
    static const char *specs[] = {"bf16:round=stochastic",
                                  "fp16:round=stochastic",
                                  "fp8:format=e4m3,round=stochastic",
                                  "fp8:format=e5m2,round=stochastic",
                                  "mxfp8:format=e4m3,round=stochastic",
                                  "mxfp8:format=e5m2,round=stochastic",
                                  "mxfp4:round=stochastic"};
    const size_t n = 64;
    const int N = 4000;
    float x[64], d[64];
    double sum[64], lo[64], hi[64];
    /* magnitudes in [0.05, 1): every value rounds up often enough in N draws to see both
     * neighbours, even mxfp4's (spacing 0.125 below 0.25 in a block whose largest is 1) */
    rng_s = 17;
    for (size_t i = 0; i < n; i++) {
        float u = rndf();
        x[i] = copysignf(0.05f + 0.95f * fabsf(u), u);
    }
    /* each MX block's largest is 1, so no element lies beyond the largest normal, where
     * the standard's clamp (not the rounding) decides: 1 and 0.99 in one E4M3 block give
     * X = 2^-8, while 0.99 alone would give X = 2^-9 and clamp 0.99 to 448 X = 0.875 */
    x[0] = x[32] = 1.0f;
    FOR_EACH_SIMD(lvl)
    {
        for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
            gcoll_compressor_t *c = mk(specs[sp]);
            for (size_t i = 0; i < n; i++) {
                sum[i] = 0;
                lo[i] = INFINITY;
                hi[i] = -INFINITY;
            }
            for (int t = 0; t < N; t++) {
                size_t len;
                uint8_t *b = encode_alloc(c, NULL, x, n, &len);
                assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
                for (size_t i = 0; i < n; i++) {
                    sum[i] += d[i];
                    lo[i] = fmin(lo[i], d[i]);
                    hi[i] = fmax(hi[i], d[i]);
                }
                free(b);
            }
            int rounded = 0;
            for (size_t i = 0; i < n; i++) {
                double mean = sum[i] / N, w = hi[i] - lo[i];
                if (w == 0 && fabs(x[i] - lo[i]) <= 15.0 / N * 2.5 * fabs(x[i]))
                    continue; /* rounded one way N times: p < 15 / N (chance below 3e-7), the
                               * spacing is at most 2.5 |x| here (mxfp4 below 0.25) */
                if (!(lo[i] <= x[i] && x[i] <= hi[i])) /* only the two neighbours */
                    fail_msg("%s element %zu: %.9g outside [%.9g, %.9g]", specs[sp], i,
                             (double)x[i], lo[i], hi[i]);
                double p = w > 0 ? (x[i] - lo[i]) / w : 0;
                double se = sqrt(p * (1 - p) / N) * w;
                rounded += w > 0;
                if (!(fabs(mean - x[i]) <= 4.5 * se + 1e-7 * fabs(x[i])))
                    fail_msg("%s element %zu: mean %.9g of %d encodings, x %.9g, se %.3g",
                             specs[sp], i, mean, N, (double)x[i], se);
            }
            assert_true(rounded > (int)n / 2); /* the test saw rounding happen */
            gcoll_compressor_destroy(c);
        }
    }
}

/* The two kernel builds write the same bytes (integer arithmetic only). */
static void test_simd_same(void **unused)
{
    (void)unused;
    static const char *specs[] = {"bf16:round=stochastic",
                                  "fp16:round=stochastic",
                                  "fp8",
                                  "fp8:format=e5m2,round=stochastic",
                                  "mxfp8:format=e4m3",
                                  "mxfp8:format=e5m2,round=stochastic",
                                  "mxfp4",
                                  "mxfp4:round=stochastic"};
    const size_t n = 10007;
    float *x = malloc(n * 4);
    fill(x, n, 5);
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s[2];
        uint8_t *b[2];
        size_t len[2];
        for (int k = 0; k < 2; k++) {
            gcoll_simd_set(k ? GCOLL_SIMD_AVX2 : GCOLL_SIMD_GENERIC);
            assert_int_equal(gcoll_state_create(c, n, &s[k]), GCOLL_OK);
            b[k] = encode_alloc(c, s[k], x, n, &len[k]);
        }
        assert_int_equal(len[0], len[1]);
        assert_memory_equal(b[0], b[1], len[0]);
        for (int k = 0; k < 2; k++) {
            free(b[k]);
            gcoll_state_destroy(s[k]);
        }
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
}

/* Truncated and corrupted messages are refused, out untouched. */
static void test_malformed(void **unused)
{
    (void)unused;
    const size_t n = 67;
    float x[67], d[67];
    fill(x, n, 21);
    struct {
        const char *spec;
        size_t at;   /* payload byte to corrupt */
        uint8_t val; /* with */
    } cases[] = {
        {"fp8:format=e4m3", 4 + 3, 0x7f},   /* E4M3 NaN */
        {"fp8:format=e4m3", 4 + 3, 0xff},   /* -NaN */
        {"fp8:format=e5m2", 4 + 9, 0x7c},   /* E5M2 Inf */
        {"fp8:format=e4m3", 3, 0x7f},       /* scale NaN (f32 high byte + ...) */
        {"mxfp8:format=e4m3", 1, 0xff},     /* E8M0 NaN */
        {"mxfp8:format=e4m3", 0, 247},      /* scale that decodes to Inf: 2^120 * 448 */
        {"mxfp8:format=e5m2", 3 + 5, 0x7d}, /* E5M2 NaN */
        {"mxfp4", 2, 0xff},                 /* E8M0 NaN */
        {"mxfp4", 3 + 33, 0x10},            /* the spare nibble of the odd tail */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(*cases); k++) {
        gcoll_compressor_t *c = mk(cases[k].spec);
        size_t len;
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t cut = 0; cut < len; cut += 7)
            assert_int_equal(gcoll_decode(c, b, cut, d, n, 0), GCOLL_ERR_INVALID);
        assert_int_equal(gcoll_decode(c, b, len - 1, d, n, 0), GCOLL_ERR_INVALID);
        float keep[67];
        memcpy(keep, d, sizeof(d));
        b[48 + cases[k].at] = cases[k].val;
        if (gcoll_decode(c, b, len, d, n, 0) != GCOLL_ERR_INVALID)
            fail_msg("%s: corrupted byte %zu = 0x%02x accepted", cases[k].spec, cases[k].at,
                     cases[k].val);
        assert_memory_equal(keep, d, sizeof(d));
        free(b);
        gcoll_compressor_destroy(c);
    }
}

/* Values near FLT_MAX: fp8's scale 2^120 with an element rounded up to 2^128 would decode to
 * Inf; the encoder saturates instead, and the decoder refuses a code that overflows (fuzzer
 * findings), and an empty section reads no scale. */
static void test_huge(void **unused)
{
    (void)unused;
    static const char *specs[] = {"fp8:format=e4m3",
                                  "fp8:format=e4m3,round=stochastic",
                                  "fp8:format=e5m2,round=stochastic",
                                  "mxfp8:format=e4m3",
                                  "mxfp8:format=e5m2,round=stochastic",
                                  "mxfp4:round=stochastic"};
    float x[3] = {3.4028234e38f, -3.39e38f, 1.0f}, d[3];
    FOR_EACH_SIMD(lvl)
    {
        for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
            gcoll_compressor_t *c = mk(specs[sp]);
            for (int t = 0; t < 50; t++) {
                size_t len;
                uint8_t *b = encode_alloc(c, NULL, x, 3, &len);
                assert_int_equal(gcoll_decode(c, b, len, d, 3, 0), GCOLL_OK);
                for (int i = 0; i < 3; i++)
                    assert_true(isfinite(d[i]));
                assert_true(d[0] > 2.5e38f && d[1] < -2.5e38f);
                if (sp == 0) { /* the largest code at this scale overflows: refused */
                    b[48 + 4] = 0x7e;
                    assert_int_equal(gcoll_decode(c, b, len, d, 3, 0), GCOLL_ERR_INVALID);
                }
                free(b);
            }
            size_t len;
            uint8_t *b = encode_alloc(c, NULL, x, 0, &len);
            assert_int_equal(len, 48);
            assert_int_equal(gcoll_decode(c, b, len, d, 0, 0), GCOLL_OK);
            free(b);
            gcoll_compressor_destroy(c);
        }
    }
}

/* Error feedback: D(c) + e_new == e_old + g (to float rounding of the subtraction), the
 * round-to-nearest forms contract (||e_new|| <= ||e_old + g||: nearest is never further than
 * zero), and over 1000 steps of fresh gradients the mean of what was sent converges to the
 * mean gradient: their difference is e_T / T exactly, with e_T bounded by one step's
 * quantization error. */
static void test_ef_mean(void **unused)
{
    (void)unused;
    static const char *specs[] = {"fp8:format=e4m3",
                                  "fp8:format=e5m2,round=stochastic",
                                  "mxfp8:format=e4m3",
                                  "mxfp8:format=e5m2",
                                  "mxfp4",
                                  "mxfp4:round=stochastic",
                                  "bf16:round=stochastic",
                                  "fp16:round=stochastic"};
    const size_t n = 512;
    const int T = 1000;
    float *g = malloc(n * 4), *d = malloc(n * 4), *x = malloc(n * 4);
    double *sg = malloc(n * 8), *sd = malloc(n * 8);
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        const int nearest = strstr(specs[sp], "stochastic") == NULL;
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        memset(sg, 0, n * 8);
        memset(sd, 0, n * 8);
        double gmax = 0;
        for (int t = 0; t < T; t++) {
            fill(g, n, 1000 + (uint64_t)t);
            const float *e = gcoll_state_residual(s);
            double xn = 0, en = 0;
            for (size_t i = 0; i < n; i++) {
                x[i] = e[i] + g[i];
                xn += (double)x[i] * x[i];
                gmax = fmax(gmax, fabs(g[i]));
            }
            size_t len;
            uint8_t *b = encode_alloc(c, s, g, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            e = gcoll_state_residual(s);
            for (size_t i = 0; i < n; i++) {
                en += (double)e[i] * e[i];
                sg[i] += g[i];
                sd[i] += d[i];
            }
            if (nearest && !(en <= xn * (1 + 1e-6)))
                fail_msg("%s step %d: ||e_new||^2 %g > ||e_old + g||^2 %g", specs[sp], t, en, xn);
            free(b);
        }
        /* mean sent - mean gradient = (e_0 - e_T) / T; e_T is one quantization's error,
         * below the largest |x| (at most twice the largest gradient once it settles) */
        const float *e = gcoll_state_residual(s);
        for (size_t i = 0; i < n; i++) {
            double diff = fabs(sd[i] / T - sg[i] / T);
            assert_true(fabs(e[i]) <= 2.0 * gmax);
            if (!(diff <= 2.0 * gmax / T))
                fail_msg("%s element %zu: mean sent %g, mean gradient %g", specs[sp], i, sd[i] / T,
                         sg[i] / T);
        }
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    free(g);
    free(d);
    free(x);
    free(sg);
    free(sd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_names),  cmocka_unit_test(test_mx_blocks),
        cmocka_unit_test(test_fp8_nearest), cmocka_unit_test(test_unbiased),
        cmocka_unit_test(test_simd_same),   cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_ef_mean),     cmocka_unit_test(test_huge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
