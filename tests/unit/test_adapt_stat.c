/* test_adapt_stat.c: the statistical adaptation rules: the noise-scale estimator against
 * its closed form on synthetic gradients (1-8 ranks), the budget split's exact sums, the
 * bit width on a bandwidth trace, the stage and phase ramps, the rule names. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "adapt/adapt.h"
#include "adapt/adapt_stat.h"
#include "compress/compress.h"

static uint64_t rng = 12345;
static double uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng >> 11) + 0.5) / (double)(1ull << 53);
}
static double gauss(void) /* Box-Muller */
{
    return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform());
}

/* Gradients g_i = G + xi_i on P ranks, G of constant magnitude a (so that the sampled
 * coordinates see |G|^2 exactly), xi_i ~ N(0, sb^2) per element (the noise of one rank's
 * batch). The estimator on the sampled coordinates (m of n, scaled by n / m):
 *   S  = (n/m) sb^2 / (P-1) chi^2_{m(P-1)}:  E = n sb^2, Var = 2 n^2 sb^4 / (m (P-1))
 *   G2 = |G|^2 + (n/m)(2 G_S . xibar + ...): E = n a^2,
 *        Var = (n/m)^2 (4 m a^2 sb^2 / P + 2 m sb^4 / (P (P-1)))
 * Averaged over T steps, each within 4.5 standard deviations (fixed seed). */
static void snr_case(int P, size_t n, double a, double sb, int T)
{
    size_t idx[GCOLL_SNR_SAMPLE];
    double vals[8 * GCOLL_SNR_SAMPLE];
    double sum_g2 = 0, sum_s = 0;
    gcoll_snr_t e;
    gcoll_snr_init(&e, 1e9); /* a half-life past T: close to the plain mean */
    for (int t = 0; t < T; t++) {
        size_t m = gcoll_snr_sample_idx(n, (uint64_t)t, 7, idx);
        assert_int_equal(m, n < GCOLL_SNR_SAMPLE ? n : GCOLL_SNR_SAMPLE);
        for (size_t i = 0; i < m; i++) {
            assert_true(idx[i] < n);
            double G = (idx[i] & 1) ? a : -a;
            for (int r = 0; r < P; r++)
                vals[(size_t)r * m + i] = G + sb * gauss();
        }
        double loc, glob, g2, s;
        gcoll_snr_from_samples(P, m, m, vals, (double)n / (double)m, &loc, &glob);
        int ok = gcoll_snr_estimate(P, loc, glob, &g2, &s);
        gcoll_snr_update(&e, P, loc, glob);
        if (P < 2) {
            assert_int_equal(ok, 0);
            continue;
        }
        assert_int_equal(ok, 1);
        sum_g2 += g2;
        sum_s += s;
    }
    if (P < 2) { /* one batch size: no estimate, and the rules fall back to the spec */
        assert_true(gcoll_snr_noise_share(&e, P) < 0);
        assert_true(gcoll_snr_noise_scale(&e) == 0);
        gcoll_adapt_sig_t g;
        gcoll_sig_init(&g, GCOLL_AR_SNR, 0.001, 0.1, 0.01, 0, 20);
        gcoll_sig_update(&g, 1, 1.0, 1.0);
        assert_true(fabs(gcoll_sig_need_density(&g, 1) - 0.01) < 1e-15);
        return;
    }
    double m = (double)(n < GCOLL_SNR_SAMPLE ? n : GCOLL_SNR_SAMPLE), nn = (double)n;
    double s_true = nn * sb * sb, g2_true = nn * a * a;
    double sd_s = sqrt(2 * nn * nn * pow(sb, 4) / (m * (P - 1)) / T);
    double sd_g2 =
        (nn / m) *
        sqrt((4 * m * a * a * sb * sb / P + 2 * m * pow(sb, 4) / ((double)P * (P - 1))) / T);
    double mean_s = sum_s / T, mean_g2 = sum_g2 / T;
    if (fabs(mean_s - s_true) > 4.5 * sd_s || fabs(mean_g2 - g2_true) > 4.5 * sd_g2)
        fail_msg("P=%d n=%zu: S %g (true %g, sd %g), |G|^2 %g (true %g, sd %g)", P, n, mean_s,
                 s_true, sd_s, mean_g2, g2_true, sd_g2);
    /* the smoothed ratio: B_noise = S / |G|^2 = sb^2 / a^2 per-rank batches, and the noise
     * share nu / (1 + nu), nu = B_noise / P; by the delta method its relative error is
     * about the sum of the two relative sds */
    double bn = sb * sb / (a * a), rel = 4.5 * (sd_s / s_true + sd_g2 / g2_true);
    double est = gcoll_snr_noise_scale(&e);
    if (fabs(est / bn - 1) > rel)
        fail_msg("P=%d: noise scale %g, closed form %g (tolerance %.3g)", P, est, bn, rel);
    double nu = bn / P, phi = gcoll_snr_noise_share(&e, P);
    assert_true(fabs(phi - nu / (1 + nu)) <= rel * nu / ((1 + nu) * (1 + nu)) + 1e-12);
}

static void test_snr_closed_form(void **state)
{
    (void)state;
    for (int P = 1; P <= 8; P++) {
        snr_case(P, 100000, 0.01, 0.02, 400); /* noise-dominated, sampled */
        snr_case(P, 20, 0.05, 0.02, 400);     /* small tensor: every coordinate */
    }
}

static void test_sample_unbiased(void **state)
{
    (void)state;
    /* over steps, every coordinate is sampled about as often (the offsets are uniform) */
    enum { N = 1000, T = 20000 };
    static unsigned hits[N];
    size_t idx[GCOLL_SNR_SAMPLE];
    memset(hits, 0, sizeof(hits));
    for (int t = 0; t < T; t++) {
        size_t m = gcoll_snr_sample_idx(N, (uint64_t)t, 3, idx);
        for (size_t i = 0; i < m; i++)
            hits[idx[i]]++;
    }
    /* stride N / m: the first stride * m coordinates, each with probability 1 / stride */
    const int stride = N / GCOLL_SNR_SAMPLE;
    double p = 1.0 / stride, mean = T * p, sd = sqrt(T * p * (1 - p));
    for (int i = 0; i < stride * GCOLL_SNR_SAMPLE; i++)
        if (fabs(hits[i] - mean) > 5 * sd)
            fail_msg("coordinate %d sampled %u times, expected %.0f +- %.0f", i, hits[i], mean, sd);
}

static void test_budget_sums(void **state)
{
    (void)state;
    rng = 99;
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + (int)(uniform() * 20);
        double w[20];
        uint64_t lo[20], hi[20], k[20], slo = 0, shi = 0;
        for (int j = 0; j < n; j++) {
            w[j] = trial % 7 == 0 && j == 0 ? 0 : uniform() * 100;
            lo[j] = 1 + (uint64_t)(uniform() * 50);
            hi[j] = lo[j] + (uint64_t)(uniform() * 5000);
            slo += lo[j];
            shi += hi[j];
        }
        uint64_t total = (uint64_t)(uniform() * 1.2 * (double)shi);
        uint64_t want = total < slo ? slo : total > shi ? shi : total;
        uint64_t got = gcoll_budget_split(n, w, lo, hi, total, k), sum = 0;
        assert_int_equal(got, want);
        for (int j = 0; j < n; j++) {
            assert_true(k[j] >= lo[j] && k[j] <= hi[j]);
            sum += k[j];
        }
        assert_int_equal(sum, want);
    }
    /* unclamped: proportional to the weights, within one element */
    double w[3] = {1, 2, 5};
    uint64_t lo[3] = {1, 1, 1}, hi[3] = {1000, 1000, 1000}, k[3];
    gcoll_budget_split(3, w, lo, hi, 800, k);
    assert_int_equal(k[0], 100);
    assert_int_equal(k[1], 200);
    assert_int_equal(k[2], 500);
    /* through densities, as the codec rounds them (k = ceil(d n)): the total k is kept */
    size_t count[4] = {401408, 512, 131072, 2560};
    double energy[4] = {4.0, 0.5, 1.0, 3.0}, d[4] = {0.01, 0.01, 0.01, 0.01};
    uint64_t before = 0, after = 0;
    for (int j = 0; j < 4; j++)
        before += (uint64_t)ceil(d[j] * (double)count[j] * (1 - 1e-12));
    gcoll_adapt_budget(4, count, energy, 0.001, 0.1, d);
    for (int j = 0; j < 4; j++) {
        assert_true(d[j] >= 0.001 - 1e-12 && d[j] <= 0.1 + 1e-12);
        after += (uint64_t)ceil(d[j] * (double)count[j] * (1 - 1e-12));
    }
    assert_int_equal(after, before);
    /* more energy per element, more density: fc2.bias's 0.5 over 512 beats fc1's */
    assert_true(d[1] > d[0]);
}

/* One step of a bucket of 2^22 values quantized at `bits`: its wire time on a link of
 * rate bytes/s with 5% noise; a 20 ms window. */
static void test_bits_trace(void **state)
{
    (void)state;
    const double n = 4194304, window = 0.02;
    const struct {
        double rate;
        int steps;
        unsigned want;
    } phases[] = {{1.25e9, 10, 8}, {6e7, 10, 2}, {1.25e8, 10, 4}, {1.25e9, 10, 8}};
    unsigned bits = 8;
    rng = 5;
    for (int ph = 0; ph < 4; ph++) {
        for (int s = 0; s < phases[ph].steps; s++) {
            double wire = n * bits / 8 / (phases[ph].rate * (1 + 0.05 * (2 * uniform() - 1)));
            bits = gcoll_pick_bits(8, wire, bits, window);
            if (s >= 1 && bits != phases[ph].want)
                fail_msg("phase %d step %d: %u bits, expected %u", ph, s, bits, phases[ph].want);
        }
    }
    /* the statistical need caps it too: a need of 5 bits gives 4 on a fast link */
    assert_int_equal(gcoll_pick_bits(5, 1e-6, 8, window), 4);
    assert_int_equal(gcoll_pick_bits(gcoll_bits_need(0), 1e-6, 8, window), 2);
    assert_int_equal(gcoll_pick_bits(gcoll_bits_need(1), 1e-6, 8, 0), 8);
    /* the width edits give valid specs: q8 narrows to QSGD levels and comes back to q8 */
    gcoll_compressor_t *c;
    assert_int_equal(gcoll_compressor_create("q8", &c), GCOLL_OK);
    assert_true(gcoll_adapt_is_quant(c));
    gcoll_adapt_set_bits(c, 4, 1);
    char err[256];
    assert_int_equal(gcoll_compressor_check(c->spec, err, sizeof(err)), GCOLL_OK);
    assert_int_equal(gcoll_adapt_bits_of(c), 4);
    gcoll_adapt_set_bits(c, 8, 1);
    assert_int_equal(c->vs.fmt, GCOLL_VF_Q8);
    gcoll_compressor_destroy(c);
}

static void test_stage_and_phase(void **state)
{
    (void)state;
    gcoll_stage_t st;
    gcoll_stage_init(&st, 5);
    double prev = 1;
    for (int t = 0; t < 200; t++) {
        /* a norm that rises, then falls, with noise: the stage never rises */
        double g = (t < 20 ? 1 + 0.05 * t : 2 * exp(-(t - 20) / 60.0)) * (1 + 0.2 * gauss());
        double s = gcoll_stage_update(&st, g * g);
        assert_true(s <= prev && s > 0);
        prev = s;
    }
    assert_true(prev < 0.3);
    /* ACCORDION as a ramp: one critical step does not jump to the maximum */
    double p = gcoll_phase_boost(0, 1);
    assert_true(fabs(p - GCOLL_PHASE_RAMP) < 1e-12);
    double d = gcoll_adapt_combine(0, 0.001, 0.1, p);
    assert_true(d > 0.001 && d < 0.1);
    for (int i = 0; i < 3; i++)
        p = gcoll_phase_boost(p, 1);
    assert_true(fabs(gcoll_adapt_combine(0, 0.001, 0.1, p) - 0.1) < 1e-12);
    p = gcoll_phase_boost(p, 0);
    assert_true(gcoll_adapt_combine(0, 0.001, 0.1, p) < 0.1);
    /* min(bandwidth cap, need) */
    assert_true(gcoll_adapt_combine(0.002, 0.05, 0.1, 0) == 0.002);
    assert_true(gcoll_adapt_combine(0.09, 0.05, 0.1, 0) == 0.05);
    /* the need's log-scale rule */
    assert_true(fabs(gcoll_adapt_interp(0.001, 0.1, 0.5) - 0.01) < 1e-12);
}

static void test_rules(void **state)
{
    (void)state;
    unsigned m = 99;
    assert_int_equal(gcoll_adapt_rules_parse("snr+bandwidth", &m), 0);
    assert_int_equal(m, GCOLL_AR_SNR | GCOLL_AR_BANDWIDTH);
    assert_int_equal(gcoll_adapt_rules_parse("both", &m), 0);
    assert_int_equal(m, GCOLL_AR_BANDWIDTH | GCOLL_AR_PHASE);
    assert_int_equal(gcoll_adapt_rules_parse("off", &m), 0);
    assert_int_equal(m, 0);
    assert_int_equal(gcoll_adapt_rules_parse("stage,budget", &m), 0);
    assert_int_equal(m, GCOLL_AR_STAGE | GCOLL_AR_BUDGET);
    assert_int_equal(gcoll_adapt_rules_parse("snr+", &m), -1);
    assert_int_equal(gcoll_adapt_rules_parse("noise", &m), -1);
    assert_int_equal(gcoll_adapt_rules_parse("", &m), -1);
    char buf[64];
    gcoll_adapt_rules_name(GCOLL_AR_SNR | GCOLL_AR_BANDWIDTH, buf, sizeof(buf));
    assert_string_equal(buf, "bandwidth+snr");
    /* public names match */
    assert_int_equal(GCOLL_ADAPT_SNR, GCOLL_AR_SNR);
    assert_int_equal(GCOLL_ADAPT_BUDGET, GCOLL_AR_BUDGET);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snr_closed_form), cmocka_unit_test(test_sample_unbiased),
        cmocka_unit_test(test_budget_sums),     cmocka_unit_test(test_bits_trace),
        cmocka_unit_test(test_stage_and_phase), cmocka_unit_test(test_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
