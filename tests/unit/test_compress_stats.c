/* test_compress_stats.c: unbiasedness of random-k and QSGD, with tolerances derived from the
 * variance. */
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

#define N 64
#define TRIALS 20000
#define ZMAX 5.0 /* per-element bound, in standard errors */

static gcoll_compressor_t *mk(const char *spec)
{
    gcoll_compressor_t *c = NULL;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK)
        fail_msg("spec '%s' rejected", spec);
    return c;
}

static void fill(float *x, size_t n)
{
    uint64_t s = 4242;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * (float)(1 + i % 5);
    }
}

/* Mean of TRIALS decodes of x, each from a fresh step of a state without feedback. */
static void mean_of_trials(const char *spec, const float *x, double *mean, double *sq)
{
    gcoll_compressor_t *c = mk(spec);
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, N, &s), GCOLL_OK);
    assert_null(gcoll_state_residual(s));
    size_t cap = gcoll_compressor_bound(c, N), len;
    uint8_t *b = malloc(cap);
    float d[N];
    memset(mean, 0, N * sizeof(double));
    if (sq)
        memset(sq, 0, N * sizeof(double));
    for (int t = 0; t < TRIALS; t++) {
        assert_int_equal(gcoll_encode(c, s, x, N, b, cap, &len), GCOLL_OK);
        assert_int_equal(gcoll_decode(c, b, len, d, N, 0), GCOLL_OK);
        for (int i = 0; i < N; i++) {
            mean[i] += d[i];
            if (sq)
                sq[i] += (double)d[i] * d[i];
        }
    }
    for (int i = 0; i < N; i++)
        mean[i] /= TRIALS;
    free(b);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
}

/* Counts elements whose sample mean is more than ZMAX standard errors from want, and
 * returns the chi-square sum of z^2 (about N for an unbiased estimator). */
static int count_outliers(const double *mean, const double *want, const double *var, double slack,
                          double *chi2)
{
    int bad = 0;
    *chi2 = 0;
    for (int i = 0; i < N; i++) {
        double se = sqrt(var[i] / TRIALS);
        double dev = fabs(mean[i] - want[i]);
        if (se == 0) {
            bad += dev > slack;
            continue;
        }
        double z = dev / se;
        *chi2 += z * z;
        bad += dev > ZMAX * se + slack;
    }
    return bad;
}

/* Random-k with unbiased=1 sends x_i * n/k with probability k/n: E = x_i and
 * Var = x_i^2 (n/k - 1). */
static void test_randomk_unbiased(void **unused)
{
    (void)unused;
    float x[N];
    double want[N], var[N], mean[N], chi2;
    fill(x, N);
    const double nk = 8.0; /* density 0.125 */
    for (int i = 0; i < N; i++) {
        want[i] = x[i];
        var[i] = (double)x[i] * x[i] * (nk - 1.0);
    }
    mean_of_trials("randomk:density=0.125,seed=5,unbiased=1,ef=0", x, mean, NULL);
    int bad = count_outliers(mean, want, var, 1e-6, &chi2);
    if (bad)
        fail_msg("random-k: %d of %d means off by more than %g standard errors", bad, N, ZMAX);
    /* chi-square with N degrees of freedom: mean N, sd sqrt(2N); allow 5 sd */
    assert_true(chi2 < N + 5.0 * sqrt(2.0 * N));
    /* the same test rejects the biased variant, so it can fail */
    mean_of_trials("randomk:density=0.125,seed=5,unbiased=0,ef=0", x, mean, NULL);
    assert_true(count_outliers(mean, want, var, 1e-6, &chi2) > N / 2);
}

/* Each index is chosen with probability k/n: inclusion counts are Binomial(T, k/n). */
static void test_randomk_uniform_inclusion(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("randomk:density=0.125,seed=11");
    const size_t n = 64, k = 8;
    uint32_t idx[8];
    double cnt[64] = {0};
    for (uint64_t t = 0; t < TRIALS; t++) {
        assert_int_equal(gcoll_randomk_indices(gcoll_randomk_key(c, t, 0), n, k, idx, NULL),
                         GCOLL_OK);
        for (size_t j = 0; j < k; j++)
            cnt[idx[j]]++;
    }
    double p = (double)k / n, mu = TRIALS * p, sd = sqrt(TRIALS * p * (1 - p));
    for (size_t i = 0; i < n; i++)
        if (fabs(cnt[i] - mu) > ZMAX * sd)
            fail_msg("index %zu chosen %g times, expected %g +- %g", i, cnt[i], mu, sd);
    gcoll_compressor_destroy(c);
}

/* QSGD (Alistarh et al. 2017): x_i -> norm * sign * l/s with l = floor(r) + Bernoulli(frac r),
 * r = |x_i| s / norm, so E = x_i and Var = (norm/s)^2 p (1 - p), p = frac(r). */
static void qsgd_check(unsigned bits, unsigned bucket)
{
    float x[N];
    double want[N], var[N], mean[N], sq[N], chi2;
    fill(x, N);
    const double s = (double)((1u << (bits - 1)) - 1);
    double maxnorm = 0;
    for (unsigned lo = 0; lo < N; lo += bucket) {
        double nrm = 0;
        for (unsigned i = lo; i < lo + bucket && i < N; i++)
            nrm += (double)x[i] * x[i];
        nrm = sqrt(nrm);
        maxnorm = fmax(maxnorm, nrm);
        for (unsigned i = lo; i < lo + bucket && i < N; i++) {
            double r = fabs((double)x[i]) * s / nrm, p = r - floor(r);
            want[i] = x[i];
            var[i] = (nrm / s) * (nrm / s) * p * (1 - p);
        }
    }
    char spec[64];
    snprintf(spec, sizeof(spec), "qsgd:bits=%u,bucket=%u,ef=0", bits, bucket);
    mean_of_trials(spec, x, mean, sq);
    /* float rounding of the norm and of l * norm / s: a few ulps of the norm */
    double slack = 1e-6 * maxnorm;
    double chi2b;
    int bad = count_outliers(mean, want, var, slack, &chi2);
    if (bad)
        fail_msg("%s: %d of %d means off by more than %g standard errors", spec, bad, N, ZMAX);
    assert_true(chi2 < N + 5.0 * sqrt(2.0 * N));
    /* the observed variance matches the model (within 20%: it is itself estimated) */
    for (int i = 0; i < N; i++) {
        double v = sq[i] / TRIALS - mean[i] * mean[i];
        if (var[i] > 1e-3 * maxnorm * maxnorm)
            assert_true(fabs(v - var[i]) <= 0.2 * var[i]);
    }
    /* a 5% bias is caught by the same criterion */
    double biased[N];
    for (int i = 0; i < N; i++)
        biased[i] = want[i] * 1.05;
    assert_true(count_outliers(mean, biased, var, slack, &chi2b) > 0);
}

static void test_qsgd_unbiased(void **unused)
{
    (void)unused;
    qsgd_check(2, 16);
    qsgd_check(4, 32);
    qsgd_check(8, 64);
}

/* Composition keeps QSGD's unbiasedness on the kept values: topk with density 1 keeps
 * every non-zero, so the mean must approach x. */
static void test_topk_qsgd_unbiased(void **unused)
{
    (void)unused;
    float x[N];
    double want[N], var[N], mean[N], chi2;
    fill(x, N);
    for (int i = 0; i < N; i++)
        want[i] = x[i];
    mean_of_trials("topk:density=1,ef=0+qsgd:bits=3,bucket=16", x, mean, NULL);
    /* the kept values are all of x, in index order, so the buckets are x's */
    for (int lo = 0; lo < N; lo += 16) {
        double b2 = 0;
        for (int i = lo; i < lo + 16; i++)
            b2 += (double)x[i] * x[i];
        double bn = sqrt(b2);
        for (int i = lo; i < lo + 16; i++) {
            double r = fabs((double)x[i]) * 3.0 / bn, p = r - floor(r);
            var[i] = (bn / 3.0) * (bn / 3.0) * p * (1 - p);
        }
    }
    int bad = count_outliers(mean, want, var, 1e-5, &chi2);
    if (bad)
        fail_msg("topk+qsgd: %d means off", bad);
}

/* Different ranks (salts) draw independent noise; the same salt and step repeat. */
static void test_qsgd_salt(void **unused)
{
    (void)unused;
    float x[N];
    fill(x, N);
    gcoll_compressor_t *c = mk("qsgd:bits=2,bucket=64,ef=0");
    gcoll_tensor_state_t *s0, *s1, *s2;
    assert_int_equal(gcoll_state_create(c, N, &s0), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N, &s1), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N, &s2), GCOLL_OK);
    gcoll_state_set_salt(s1, 1);
    size_t cap = gcoll_compressor_bound(c, N), l0, l1, l2;
    uint8_t *b0 = malloc(cap), *b1 = malloc(cap), *b2 = malloc(cap);
    assert_int_equal(gcoll_encode(c, s0, x, N, b0, cap, &l0), GCOLL_OK);
    assert_int_equal(gcoll_encode(c, s1, x, N, b1, cap, &l1), GCOLL_OK);
    assert_int_equal(gcoll_encode(c, s2, x, N, b2, cap, &l2), GCOLL_OK);
    assert_memory_equal(b0, b2, l0);
    assert_memory_not_equal(b0, b1, l0);
    free(b0);
    free(b1);
    free(b2);
    gcoll_state_destroy(s0);
    gcoll_state_destroy(s1);
    gcoll_state_destroy(s2);
    gcoll_compressor_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_randomk_unbiased), cmocka_unit_test(test_randomk_uniform_inclusion),
        cmocka_unit_test(test_qsgd_unbiased),    cmocka_unit_test(test_topk_qsgd_unbiased),
        cmocka_unit_test(test_qsgd_salt),
    };
    /* once with the generic (non-AVX2) kernels, once with what the CPU offers */
    gcoll_simd_set(GCOLL_SIMD_GENERIC);
    int rc = cmocka_run_group_tests_name("generic kernels", tests, NULL, NULL);
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    rc += cmocka_run_group_tests_name("best kernels", tests, NULL, NULL);
    return rc;
}
