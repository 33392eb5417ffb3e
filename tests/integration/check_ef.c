/* check_ef.c: coll_check's efmean mode: the running mean of many compressed allreduces of
 * one fixed gradient per rank against the exact mean (error feedback's promise). */
#include "check.h"

/* splitmix64, then Box-Muller: rank r's fixed gradient, N(0,1) with every 100th element
 * x10 (a few large coordinates, as real gradients have), the same on every run. */
static uint64_t mix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fixed_grad(int r, size_t n, float *g)
{
    uint64_t st = 0x5eed0000ull + (uint64_t)r;
    for (size_t i = 0; i < n; i++) {
        double u1 = ((double)(mix(&st) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = (double)(mix(&st) >> 11) / 9007199254740992.0;
        double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        g[i] = (float)(i % 100 == 0 ? 10.0 * z : z);
    }
}

/* efmean SPEC STEPS COUNT BOUND [SAME]: STEPS compressed allreduces (AVG) of rank r's fixed
 * gradient; the relative l2 distance between the mean of the results and the exact mean
 * of the ranks' gradients must stay below BOUND (0: only print it). SAME=1: every rank
 * has rank 0's gradient. Every rank prints the distance; results must agree bit for bit
 * between ranks, which the allreduce of the distance checks. */
int run_efmean(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: coll_check efmean SPEC STEPS COUNT BOUND [SAME]\n");
        return 1;
    }
    const char *spec = argv[2];
    long steps = atol(argv[3]);
    size_t count = strtoul(argv[4], NULL, 10);
    double bound = atof(argv[5]);
    int same = argc > 6 && atoi(argv[6]);
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *st = NULL;
    checks++;
    if (steps < 1 || gcoll_compressor_create(spec, &c) != GCOLL_OK ||
        gcoll_state_create(c, count, &st) != GCOLL_OK) {
        FAIL("efmean: bad spec '%s' or steps %ld", spec, steps);
        return failures;
    }
    float *g = malloc((count + 1) * sizeof(float)), *out = malloc((count + 1) * sizeof(float));
    double *sum = calloc(count + 1, sizeof(double)), *want = calloc(count + 1, sizeof(double));
    for (int r = 0; r < size; r++) {
        fixed_grad(same ? 0 : r, count, g);
        for (size_t i = 0; i < count; i++)
            want[i] += g[i] / (double)size;
    }
    fixed_grad(same ? 0 : rank, count, g);
    double t0 = now();
    for (long t = 0; t < steps; t++) {
        gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, count, GCOLL_AVG);
        if (rc != GCOLL_OK) {
            FAIL("efmean '%s' step %ld: %s (%s)", spec, t, gcoll_status_string(rc),
                 gcoll_comm_last_error(comm));
            goto out;
        }
        for (size_t i = 0; i < count; i++)
            sum[i] += out[i];
    }
    double e2 = 0, w2 = 0, r2 = 0;
    for (size_t i = 0; i < count; i++) {
        double d = sum[i] / (double)steps - want[i];
        e2 += d * d;
        w2 += want[i] * want[i];
    }
    const float *res = gcoll_state_residual(st);
    for (size_t i = 0; res && i < count; i++)
        r2 += (double)res[i] * res[i];
    double rel = sqrt(e2 / w2), lo = rel, hi = rel;
    if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
        gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK || lo != hi)
        FAIL("efmean '%s': results differ between ranks (%g..%g)", spec, lo, hi);
    printf("efmean %s: %d rank(s), %ld steps of %zu floats: relative l2 error of the mean "
           "%.3g (bound %g), worker residual %.3g x ||g||, %.2f s\n",
           spec, size, steps, count, rel, bound, sqrt(r2 / w2), now() - t0);
    if (bound > 0 && !(rel < bound))
        FAIL("efmean '%s': relative error of the mean %.3g not below %g", spec, rel, bound);
out:
    free(g);
    free(out);
    free(sum);
    free(want);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    return failures;
}
