/* check_adapt.c: adaptation across processes: the gcoll_adapt controller on
 * gcoll_compressed_allreduce (the same decisions on every rank; the noise scale of
 * synthetic gradients of known signal and noise), the bit width of a quantizer, joined
 * controllers' budget split against one computed from the gradients, and the
 * streamed top-k kept under the bucketer's adaptation, bit-identical to an unadapted call
 * at the same density. */
#include "check.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* N(0, 1) from (rank, step, i): each rank's batch noise, independent across ranks. */
static double gauss(int r, int step, size_t i)
{
    uint64_t h = mix(((uint64_t)r << 48) ^ ((uint64_t)step << 32) ^ i);
    double u1 = ((double)(h >> 11) + 0.5) / (double)(1ull << 53);
    double u2 = ((double)(mix(h) >> 11) + 0.5) / (double)(1ull << 53);
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Every rank must hold the same value: MIN and MAX over ranks agree. */
static int same_everywhere(double x)
{
    double lo = x, hi = x;
    return gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) == GCOLL_OK &&
           gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) == GCOLL_OK && lo == hi;
}

/* g_i = G + sb xi_i, |G_c| = a: B_noise = sb^2 / a^2 per-rank batches. With the smoothing's
 * half-life far past the run (GCOLL_ADAPT_STAT_HALF_LIFE, set by the script) the estimate
 * is the mean of T per-step estimates on M = 16 sampled coordinates (GCOLL_SNR_SAMPLE),
 * whose relative sds are sqrt(2 / (M (P-1) T)) for tr(Sigma) and, for |G|^2,
 * sqrt((4 a^2 sb^2 / P + 2 sb^4 / (P (P-1))) / (M T)) / a^2 (test_adapt_stat.c). */
#define M 16.0
static int check_ctl(const char *spec, int T)
{
    const size_t n = 50000;
    const double a = 0.01, sb = 0.02;
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *s = NULL;
    gcoll_adapt_t *ad = NULL;
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    checks++;
    if (!g || !out || gcoll_compressor_create(spec, &c) != GCOLL_OK ||
        gcoll_state_create(c, n, &s) != GCOLL_OK ||
        gcoll_adapt_create(comm, "snr+stage+phase", &ad) != GCOLL_OK ||
        gcoll_adapt_attach(ad, s) != GCOLL_OK) {
        FAIL("%s: controller setup: %s", spec, gcoll_comm_last_error(comm));
        goto out;
    }
    /* attaching twice is refused with a message, not a crash */
    if (gcoll_adapt_attach(ad, s) != GCOLL_ERR_INVALID)
        FAIL("%s: a second attach was accepted", spec);
    gcoll_adapt_stats_t st = {0};
    for (int step = 0; step < T; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = (float)(((i & 1) ? a : -a) + sb * gauss(rank, step, i));
        if (gcoll_compressed_allreduce(comm, s, g, out, n, GCOLL_AVG) != GCOLL_OK) {
            FAIL("%s step %d: %s", spec, step, gcoll_comm_last_error(comm));
            goto out;
        }
        gcoll_adapt_stats(ad, &st);
        if (!same_everywhere(st.density) || !same_everywhere((double)st.bits) ||
            !same_everywhere(st.noise_scale) || !same_everywhere(st.stage))
            FAIL("%s step %d: ranks decided differently (density %g, bits %u)", spec, step,
                 st.density, st.bits);
    }
    double P = size, bn = sb * sb / (a * a);
    double rel = 4.5 * (sqrt(2 / (M * (P - 1) * T)) +
                        sqrt((4 * a * a * sb * sb / P + 2 * pow(sb, 4) / (P * (P - 1))) / (M * T)) /
                            (a * a));
    if (size > 1 && fabs(st.noise_scale / bn - 1) > rel)
        FAIL("%s: noise scale %g per-rank batches, closed form %g (tolerance %.3g)", spec,
             st.noise_scale, bn, rel);
    if (size == 1 && st.noise_share >= 0)
        FAIL("%s: one rank has no noise estimate, got share %g", spec, st.noise_share);
    printf("rank %d: %s: controller decided alike on every rank over %d steps: density %g, "
           "bits %u, noise scale %.4g (closed form %.4g), noise share %.3f\n",
           rank, spec, T, st.density, st.bits, st.noise_scale, bn, st.noise_share);
out:
    gcoll_adapt_destroy(ad);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(g);
    free(out);
    return failures;
}

/* gcoll_adapt_join: three top-k 1% tensors of different sizes and signal scales under one
 * budget. Every rank decides alike; after the run the members' k add up to the spec's
 * total, each within 2% of the split computed here from the gradients themselves:
 * k_j = lambda sqrt(n_j E_j), E_j = n_j (a_j^2 + sb^2) the expected squared norm (the
 * sampled estimate's relative sd is about 2 sb / a_j / sqrt(16 P T), under 0.3% here). */
#define NJ 3
static int check_budget(int T)
{
    const size_t n[NJ] = {20000, 5000, 30000};
    const double amp[NJ] = {0.02, 0.01, 0.005}, sb = 0.002;
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *s[NJ] = {0};
    gcoll_adapt_t *ad[NJ] = {0};
    float *g = malloc(n[2] * sizeof(float)), *out = malloc(n[2] * sizeof(float));
    checks++;
    if (!g || !out || gcoll_compressor_create("topk:density=0.01", &c) != GCOLL_OK) {
        FAIL("budget: setup");
        goto out;
    }
    for (int j = 0; j < NJ; j++)
        if (gcoll_state_create(c, n[j], &s[j]) != GCOLL_OK ||
            gcoll_adapt_create(comm, "budget", &ad[j]) != GCOLL_OK ||
            gcoll_adapt_attach(ad[j], s[j]) != GCOLL_OK ||
            (j > 0 && gcoll_adapt_join(ad[j], ad[0]) != GCOLL_OK)) {
            FAIL("budget: controller %d: %s", j, gcoll_comm_last_error(comm));
            goto out;
        }
    /* joining twice, or a controller without the budget rule, is refused */
    gcoll_adapt_t *other = NULL;
    if (gcoll_adapt_join(ad[1], ad[2]) != GCOLL_ERR_INVALID)
        FAIL("budget: a second join was accepted");
    if (gcoll_adapt_create(comm, "snr", &other) == GCOLL_OK &&
        gcoll_adapt_join(other, ad[0]) != GCOLL_ERR_INVALID)
        FAIL("budget: a controller without the budget rule (and unattached) joined");
    gcoll_adapt_destroy(other);
    double d[NJ] = {0};
    for (int step = 0; step < T; step++)
        for (int j = 0; j < NJ; j++) {
            for (size_t i = 0; i < n[j]; i++)
                g[i] = (float)(((i & 1) ? amp[j] : -amp[j]) + sb * gauss(rank, step * NJ + j, i));
            gcoll_adapt_stats_t st = {0};
            if (gcoll_compressed_allreduce(comm, s[j], g, out, n[j], GCOLL_AVG) != GCOLL_OK ||
                gcoll_adapt_stats(ad[j], &st) != GCOLL_OK) {
                FAIL("budget step %d tensor %d: %s", step, j, gcoll_comm_last_error(comm));
                goto out;
            }
            d[j] = st.density;
            if (!same_everywhere(st.density))
                FAIL("budget step %d tensor %d: ranks decided differently (%g)", step, j, d[j]);
        }
    double w[NJ], wsum = 0;
    long total = 0, got = 0;
    for (int j = 0; j < NJ; j++) {
        w[j] = sqrt((double)n[j] * (double)n[j] * (amp[j] * amp[j] + sb * sb));
        wsum += w[j];
        total += (long)ceil(0.01 * (double)n[j]);
    }
    for (int j = 0; j < NJ; j++) {
        long k = lround(d[j] * (double)n[j]);
        double want = (double)total * w[j] / wsum;
        got += k;
        if (fabs((double)k - want) > 0.02 * want + 1)
            FAIL("budget: tensor %d (n %zu): k %ld, the split by energy gives %.1f", j, n[j], k,
                 want);
    }
    if (got != total)
        FAIL("budget: the members' k add up to %ld, the spec's total is %ld", got, total);
    printf("rank %d: budget over %d joined controllers: densities %g %g %g, k summed %ld of %ld\n",
           rank, NJ, d[0], d[1], d[2], got, total);
out:
    for (int j = 0; j < NJ; j++) {
        gcoll_adapt_destroy(ad[j]);
        gcoll_state_destroy(s[j]);
    }
    gcoll_compressor_destroy(c);
    free(g);
    free(out);
    return failures;
}

/* The bucketer under GCOLL_ADAPT (bandwidth, its bounds pinned to the spec's density by
 * the script) against gcoll_compressed_allreduce of an unadapted state, both top-k of a
 * tensor long enough for the streamed scheme (GCOLL_TOPK_STREAM set by the script):
 * bit-identical results at every step. */
static int check_stream(int T)
{
    const size_t n = 40000;
    const char *spec = "topk:density=0.01";
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 1, .op = GCOLL_AVG, .default_spec = spec};
    gcoll_bucketer_t *b = NULL;
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *s = NULL;
    float *g = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    int id;
    checks++;
    if (!g || !ref || gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK ||
        gcoll_bucketer_add_tensor(b, "w", g, n, GCOLL_FLOAT32, NULL, &id) != GCOLL_OK ||
        gcoll_compressor_create(spec, &c) != GCOLL_OK || gcoll_state_create(c, n, &s) != GCOLL_OK) {
        FAIL("stream: setup: %s", gcoll_comm_last_error(comm));
        goto out;
    }
    const char *scheme = gcoll_compressed_scheme(comm, c, n, 0, NULL);
    if (size > 1 && (!scheme || strcmp(scheme, "streamed sparse") != 0))
        FAIL("stream: the reference takes '%s', not the streamed scheme", scheme);
    long diff = 0;
    for (int step = 0; step < T; step++) {
        for (size_t i = 0; i < n; i++)
            ref[i] = (float)gauss(rank, step, i);
        memcpy(g, ref, n * sizeof(float));
        if (gcoll_compressed_allreduce(comm, s, ref, ref, n, GCOLL_AVG) != GCOLL_OK ||
            gcoll_bucketer_ready(b, id) != GCOLL_OK || gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("stream step %d: %s", step, gcoll_comm_last_error(comm));
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&g[i], &ref[i], sizeof(float)) != 0;
        if (gcoll_bucketer_density(b, 0) != 0.01)
            FAIL("stream step %d: density %g, pinned at 0.01", step, gcoll_bucketer_density(b, 0));
    }
    if (diff)
        FAIL("stream: %ld elements differ from the unadapted call", diff);
    else
        printf("rank %d: adapted bucketer bit-identical to the unadapted call over %d steps "
               "(reference scheme: %s)\n",
               rank, T, scheme);
out:
    gcoll_bucketer_destroy(b);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(g);
    free(ref);
    return failures;
}

int run_adapt_ctl(void)
{
    check_ctl("topk:density=0.01", 60);
    check_ctl("randomk:density=0.01", 20);
    check_ctl("qsgd:bits=4", 20);
    check_budget(10);
    return failures;
}

int run_adapt_stream(void)
{
    return check_stream(8);
}
