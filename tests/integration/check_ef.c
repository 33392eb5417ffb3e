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

/* ---- the bound error feedback gives the running mean ---------------------------------
 *
 * Worker i sends c = C(x), x = e + g_i, and keeps e' = x - c, so its messages sum to
 * T g_i - e_T. If RMS ||C(x) - x|| <= q ||x|| (q = sqrt(1 - delta), the contraction in
 * expectation: Stich et al. 2018, Karimireddy et al. 2019), Minkowski's inequality gives
 * RMS ||e'|| <= q (RMS ||e|| + ||input||), so every residual stays below
 * A ||input||, A = q / (1 - q). What leaves a residual is at most beta ||x|| in RMS
 * (||C(x)|| <= beta ||x||), so it feeds the next residual at most
 * gamma = beta (1 + A) times that input. The mean of T results then misses the exact
 * mean by (the residuals left after T steps) / T:
 *   sparsifiers, random-k (exact sums of what was sent): avg_i ||e_i|| / T
 *   all-to-all (quantizers): worker residuals plus the server's, whose input is the
 *     average of the workers' messages: (A + A gamma) avg_i ||g_i|| / T
 *   ring: hop h re-compresses the partial sum of h gradients, its input at most
 *     I_h = gamma I_(h-1) + max ||g_i||; residuals of the P-1 hops / P plus the
 *     server's, whose input is (gamma I_(P-1) + max ||g_i||) / P.
 * For the stochastic codecs (QSGD, random-k) the bound is on the RMS; one run's residual
 * norm concentrates near it over thousands of elements (QSGD 2-bit on one rank came
 * within 7% of it, above): their bound takes a 1.5x margin.
 * Every delta and beta below is derived in docs/compressors.md ("Error feedback"). */
typedef struct {
    const char *spec;
    double delta, beta; /* 0 < delta <= 1 (1: exact); beta */
    double tau;         /* threshold: |e_i| < tau elementwise, ||e|| <= tau sqrt(n) */
} ef_case_t;

/* q8's bucket of m values: |Q(x)_i - x_i| <= max/254, so 1 - delta = m / (4 127^2). */
static double d_q8(double m)
{
    return 1.0 - m / (4.0 * 127.0 * 127.0);
}
/* QSGD's contractive form, s levels max/s apart on buckets of m values, nearest: every
 * error is at most min(|x_i|, max/2s) and the largest value is exact, so
 * 1 - delta <= max over r of min(1 - r, (m - 1) r / 4s^2) (r = max^2/||x||^2). */
static double d_qsgd(int bits, double m)
{
    double s = (double)((1 << (bits - 1)) - 1);
    return 1.0 / (1.0 + (m - 1.0) / (4.0 * s * s));
}
/* ||C(x)|| <= ||x|| + ||C(x) - x|| */
static double b_qsgd(int bits, double m)
{
    return 1.0 + sqrt(1.0 - d_qsgd(bits, m));
}

/* fp8 with its power-of-two scale S (max|x| > maxval S / 2): a normal element's squared
 * relative error at most r2, a subnormal one's error at most h S, so with n of them
 * 1 - delta <= r2 + n (h / (maxval / 2))^2 (n: the whole tensor's 4000, an upper bound). */
#define D_FP8(r2, h, half_max) ((r2) + 4000.0 * ((h) / (half_max)) * ((h) / (half_max)))
/* MX: a block's largest element a >= 2^emax X, every normal element's squared relative
 * error at most r2 (spacing or clamp), a subnormal one's at most (h a)^2: 31 of them. */
#define D_MX(r2, h) ((r2) + 31.0 * (h) * (h))

static double ef_bound(const ef_case_t *k, int quant, int ring, int stoch, size_t count,
                       double gavg, double gmax, double gbar, long steps)
{
    if (k->tau > 0) /* threshold: each residual elementwise below tau */
        return k->tau * sqrt((double)count) / ((double)steps * gbar);
    double q = sqrt(fmax(0.0, 1.0 - k->delta)), A = q / (1.0 - q);
    double gamma = k->beta * (1.0 + A), left;
    if (!quant || size == 1) {
        left = A * gavg;
    } else if (!ring) {
        left = A * gavg + A * gamma * gavg;
    } else {
        double in = gmax, hops = 0;
        for (int h = 1; h < size; h++) {
            hops += A * in;
            in = gamma * in + gmax;
        }
        left = hops / size + A * in / size;
    }
    /* 1e-5: the float rounding of the results themselves */
    return (stoch ? 1.5 : 1.0) * left / ((double)steps * gbar) + 1e-5;
}

/* Runs STEPS allreduces of spec; the relative error of the mean, or -1 on failure. */
static double ef_run(const char *spec, long steps, size_t count, int same, double *gn)
{
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *st = NULL;
    double rel = -1;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK ||
        gcoll_state_create(c, count, &st) != GCOLL_OK) {
        FAIL("efmean: bad spec '%s'", spec);
        gcoll_compressor_destroy(c);
        return -1;
    }
    float *g = malloc((count + 1) * sizeof(float)), *out = malloc((count + 1) * sizeof(float));
    double *sum = calloc(count + 1, sizeof(double)), *want = calloc(count + 1, sizeof(double));
    gn[0] = gn[1] = 0; /* average and largest ||g_i|| */
    for (int r = 0; r < size; r++) {
        double n2 = 0;
        fixed_grad(same ? 0 : r, count, g);
        for (size_t i = 0; i < count; i++) {
            want[i] += g[i] / (double)size;
            n2 += (double)g[i] * g[i];
        }
        gn[0] += sqrt(n2) / size;
        gn[1] = fmax(gn[1], sqrt(n2));
    }
    fixed_grad(same ? 0 : rank, count, g);
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
    double e2 = 0, w2 = 0;
    for (size_t i = 0; i < count; i++) {
        double d = sum[i] / (double)steps - want[i];
        e2 += d * d;
        w2 += want[i] * want[i];
    }
    gn[2] = sqrt(w2);
    rel = sqrt(e2 / w2);
    double lo = rel, hi = rel;
    if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
        gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK || lo != hi)
        FAIL("efmean '%s': results differ between ranks (%g..%g)", spec, lo, hi);
out:
    free(g);
    free(out);
    free(sum);
    free(want);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    return rel;
}

/* efmean [SPEC STEPS COUNT [SAME]]: with a spec, print the relative l2 distance between
 * the mean of STEPS compressed allreduces (AVG) of each rank's fixed gradient and the
 * exact mean (SAME=1: every rank has rank 0's gradient). Without: every codec with error
 * feedback, 200 steps of 4000 floats, each against the bound its delta gives. */
int run_efmean(int argc, char **argv)
{
    double gn[3];
    if (argc > 4) {
        long steps = atol(argv[3]);
        size_t count = strtoul(argv[4], NULL, 10);
        double t0 = now(), rel = ef_run(argv[2], steps, count, argc > 5 && atoi(argv[5]), gn);
        if (rel >= 0)
            printf("efmean %s: %d rank(s), %ld steps of %zu floats: relative l2 error of the "
                   "mean %.3g, %.2f s\n",
                   argv[2], size, steps, count, rel, now() - t0);
        return failures;
    }
    const long T = 200; /* the bounds scale as 1/T: fewer steps, same test */
    const size_t n = 4000;
    const ef_case_t cases[] = {
        {"none", 1, 1, 0},
        {"fp16", 1 - 0x1p-22, 1 + 0x1p-11, 0}, /* unit roundoff 2^-11, in range */
        {"bf16", 1 - 0x1p-16, 1 + 0x1p-8, 0},
        {"q8", d_q8(1024), 1 + sqrt(1 - d_q8(1024)), 0},
        {"qsgd:bits=8", d_qsgd(8, 512), b_qsgd(8, 512), 0},
        {"qsgd:bits=4", d_qsgd(4, 512), b_qsgd(4, 512), 0},
        {"qsgd:bits=2", d_qsgd(2, 512), b_qsgd(2, 512), 0},
        {"qsgd:bits=4,bucket=64", d_qsgd(4, 64), b_qsgd(4, 64), 0},
        {"sign", 1.0 / 64, 1, 0}, /* chunks of 64: ||x||_1^2 >= ||x||_2^2 */
        {"sign:chunk=8", 1.0 / 8, 1, 0},
        {"sign:scale=l2,chunk=8", 0.75 / 8, 1.5, 0},
        {"topk:density=0.25", 0.25, 1, 0}, /* the k largest hold >= k/n of ||x||^2 */
        {"topk:density=0.01", 0.01, 1, 0},
        {"topk:density=0.25,select=sample", 0, 1, 0}, /* sampled k: no delta, below */
        {"topk:density=0.25+q8", 0.25 * d_q8(1000), 1 + sqrt(1 - d_q8(1000)), 0},
        {"topk:density=0.25+qsgd", 0.25 * d_qsgd(4, 512), b_qsgd(4, 512), 0},
        {"topk:density=0.25+sign", 0.25 / 1000, 1, 0},
        {"randomk:density=0.25,seed=5", 0.25, 0.5, 0}, /* E: k/n of ||x||^2 kept */
        {"threshold:tau=1", 0, 0, 1},
        {"dgc:density=0.25,momentum=0,select=exact", 0.25, 1, 0},
        /* the narrow floats (docs/compressors.md, "fp8 and MX"): 1 - delta is the largest
         * squared relative error of a normal element (half a spacing, or MX's clamp at the
         * largest normal) plus the subnormal elements' share; stochastic rounding has the
         * same bound in expectation (p (1 - p) <= 1/4 of a spacing squared) */
        {"bf16:round=stochastic", 1 - 0x1p-16, 1 + 0x1p-8, 0},
        {"fp16:round=stochastic", 1 - 0x1p-22, 1 + 0x1p-11, 0},
        {"fp8:format=e4m3", 1 - D_FP8(0x1p-8, 0x1p-10, 224.0), 1 + 0x1p-4, 0},
        {"fp8:format=e5m2,round=stochastic", 1 - D_FP8(0x1p-6, 0x1p-17, 28672.0), 1 + 0x1p-3, 0},
        {"mxfp8:format=e4m3", 1 - D_MX(0x1p-6, 0x1p-18), 1 + 0x1p-3, 0},
        {"mxfp8:format=e5m2", 1 - D_MX(0x1p-6, 0x1p-32), 1 + 0x1p-3, 0},
        {"mxfp4", 1 - D_MX(0x1p-4, 0x1p-4), 1.5, 0},
        {"mxfp4:round=stochastic", 1 - D_MX(0x1p-4, 0x1p-4), 1.5, 0},
        /* rowsparse: lossless, or the top rows by norm: at least d of ||x||^2 kept */
        {"rowsparse:dim=50", 1, 1, 0},
        {"rowsparse:dim=50,density=0.3", 0.3, 1, 0},
    };
    for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); j++) {
        const ef_case_t *k = &cases[j];
        if (k->delta == 0 && k->tau == 0)
            continue; /* select=sample has no k to derive delta from; listed for the docs */
        gcoll_compressor_t *c = NULL;
        if (gcoll_compressor_create(k->spec, &c) != GCOLL_OK) {
            FAIL("efmean: bad spec '%s'", k->spec);
            continue;
        }
        unsigned fl = gcoll_compressor_flags(c);
        int quant = !(fl & GCOLL_CODEC_SPARSE);
        int stoch = (fl & (GCOLL_CODEC_STOCHASTIC | GCOLL_CODEC_RANDOMK)) != 0;
        const char *scheme = gcoll_compressed_scheme(comm, c, n, 0, NULL);
        int ring = scheme && !strcmp(scheme, "ring");
        gcoll_compressor_destroy(c);
        double t0 = now();
        checks++;
        double rel = ef_run(k->spec, T, n, 0, gn);
        if (rel < 0)
            continue;
        double b = ef_bound(k, quant, ring, stoch, n, gn[0], gn[1], gn[2], T);
        if (rank == 0)
            printf("efmean %-42s %d rank(s)%s: error of the mean %.3g, bound %.3g, %.2f s\n",
                   k->spec, size, ring && quant ? " (ring)" : "", rel, b, now() - t0);
        fflush(stdout); /* a run stopped by its timeout still shows how far it came */
        if (!(rel <= b))
            FAIL("efmean '%s': error of the mean %.3g above the bound %.3g from delta %.4g",
                 k->spec, rel, b, k->delta);
    }
    return failures;
}

/* onestep SPEC COUNT: the relative l2 error of one compressed allreduce (AVG) of each
 * rank's fixed gradient, fresh state, against the exact mean, and the scheme it ran by:
 * "onestep SPEC: P rank(s), SCHEME, relative error E" (test-ef.sh compares 2 and 4 ranks:
 * with the fp32 reduction of the narrow float formats the error does not grow with P). */
int run_onestep(int argc, char **argv)
{
    if (argc < 4) {
        FAIL("usage: onestep SPEC COUNT");
        return failures;
    }
    const char *spec = argv[2];
    size_t count = strtoul(argv[3], NULL, 10);
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *st = NULL;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK ||
        gcoll_state_create(c, count, &st) != GCOLL_OK) {
        FAIL("onestep: bad spec '%s'", spec);
        gcoll_compressor_destroy(c);
        return failures;
    }
    const char *scheme = gcoll_compressed_scheme(comm, c, count, 0, NULL);
    float *g = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
    double *want = calloc(count, sizeof(double));
    for (int r = 0; r < size; r++) {
        fixed_grad(r, count, g);
        for (size_t i = 0; i < count; i++)
            want[i] += g[i] / (double)size;
    }
    fixed_grad(rank, count, g);
    gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, count, GCOLL_AVG);
    if (rc != GCOLL_OK) {
        FAIL("onestep '%s': %s (%s)", spec, gcoll_status_string(rc), gcoll_comm_last_error(comm));
    } else {
        double e2 = 0, w2 = 0;
        for (size_t i = 0; i < count; i++) {
            double d = out[i] - want[i];
            e2 += d * d;
            w2 += want[i] * want[i];
        }
        double rel = sqrt(e2 / w2), lo = rel, hi = rel;
        if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
            gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK || lo != hi)
            FAIL("onestep '%s': results differ between ranks (%g..%g)", spec, lo, hi);
        if (rank == 0)
            printf("onestep %s: %d rank(s), %s, relative error %.6g\n", spec, size,
                   scheme ? scheme : "?", rel);
    }
    free(g);
    free(out);
    free(want);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    return failures;
}

/* ---- clipping inside the collective ------------------------------------------------- */

/* clip mode: one compressed allreduce (AVG) per spec of each rank's fixed gradient
 * (||g_r|| ~ 89), against the average of the gradients clipped here: clamped to [-V, V]
 * (clip_value=V), then scaled to l2 norm <= C (clip=C) over the whole tensor, whatever
 * chunks the scheme encodes. fp16 rounds twice (worker, server): 2^-11 of the values
 * rounded each time; top-k at density 1 sends f32 values: float rounding only. */
int run_clip(void)
{
    static const struct {
        const char *spec;
        double C, V, u; /* clip, clip_value (0: off), unit roundoff of the values */
    } cases[] = {
        {"fp16:clip=10", 10, 0, 0x1p-11},
        {"fp16:clip_value=3", 0, 3, 0x1p-11},
        {"fp16:clip=10,clip_value=3", 10, 3, 0x1p-11},
        {"bf16:clip=50,ef=0", 50, 0, 0x1p-8},
        {"topk:density=1,clip=10", 10, 0, 0x1p-23},
        {"topk:density=1,clip=10,clip_value=2", 10, 2, 0x1p-23},
    };
    const size_t n = 4000;
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
    double *cl = malloc(n * sizeof(double));
    for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); j++) {
        memset(want, 0, n * sizeof(double));
        memset(mag, 0, n * sizeof(double));
        for (int r = 0; r < size; r++) {
            fixed_grad(r, n, g);
            double n2 = 0;
            for (size_t i = 0; i < n; i++) {
                double v = g[i], V = cases[j].V;
                cl[i] = V > 0 ? fmin(V, fmax(-V, v)) : v;
                n2 += cl[i] * cl[i];
            }
            double f = cases[j].C > 0 && sqrt(n2) > cases[j].C ? cases[j].C / sqrt(n2) : 1;
            for (size_t i = 0; i < n; i++) {
                want[i] += cl[i] * f / size;
                mag[i] += fabs(cl[i] * f) / size;
            }
        }
        gcoll_compressor_t *c = NULL;
        gcoll_tensor_state_t *st = NULL;
        checks++;
        if (gcoll_compressor_create(cases[j].spec, &c) != GCOLL_OK ||
            gcoll_state_create(c, n, &st) != GCOLL_OK) {
            FAIL("clip: bad spec '%s'", cases[j].spec);
            gcoll_compressor_destroy(c);
            continue;
        }
        fixed_grad(rank, n, g);
        gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, n, GCOLL_AVG);
        if (rc != GCOLL_OK) {
            FAIL("clip '%s': %s", cases[j].spec, gcoll_status_string(rc));
        } else {
            const double u = cases[j].u * 1.01;
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < n; i++) {
                /* worker rounding of each value, server rounding of their average */
                double tol = u * mag[i] + u * (fabs(want[i]) + u * mag[i]) + 1e-6 * mag[i] + 1e-30;
                if (!(fabs(out[i] - want[i]) <= tol) && bad++ == 0)
                    first = i;
            }
            if (bad)
                FAIL("clip '%s': %zu of %zu values off the whole tensor's clipping, first at "
                     "%zu: got %g want %g",
                     cases[j].spec, bad, n, first, out[first], want[first]);
            else if (rank == 0)
                printf("clip %s: %d rank(s), %s scheme: matches the clipped average\n",
                       cases[j].spec, size, gcoll_compressed_scheme(comm, c, n, 0, NULL));
        }
        gcoll_state_destroy(st);
        gcoll_compressor_destroy(c);
    }
    /* all-zero and huge-value gradients through every scheme: zeros come back exactly;
     * one 1e30 (its float square overflows) goes through, finite, near its mean */
    static const char *const edge[] = {
        "qsgd:bits=4",        "qsgd:bits=2,ef=0", "sign", "q8", "fp16", "topk:density=0.01+qsgd",
        "randomk:density=0.5"};
    for (size_t j = 0; j < sizeof(edge) / sizeof(edge[0]); j++) {
        gcoll_compressor_t *c = NULL;
        gcoll_tensor_state_t *st = NULL;
        checks++;
        if (gcoll_compressor_create(edge[j], &c) != GCOLL_OK ||
            gcoll_state_create(c, n, &st) != GCOLL_OK) {
            FAIL("edge: bad spec '%s'", edge[j]);
            gcoll_compressor_destroy(c);
            continue;
        }
        memset(g, 0, n * sizeof(float));
        gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, n, GCOLL_AVG);
        for (size_t i = 0; rc == GCOLL_OK && i < n; i++)
            if (out[i] != 0.0f) {
                FAIL("'%s': all-zero gradient gave %g at %zu", edge[j], out[i], i);
                break;
            }
        g[5] = 1e30f; /* not where random-k's first step must look: any result is fine */
        gcoll_status_t rc2 = gcoll_compressed_allreduce(comm, st, g, out, n, GCOLL_AVG);
        if (rc != GCOLL_OK || rc2 != GCOLL_OK)
            FAIL("'%s': all-zero or huge-value gradient failed: %s / %s (%s)", edge[j],
                 gcoll_status_string(rc), gcoll_status_string(rc2), gcoll_comm_last_error(comm));
        else
            for (size_t i = 0; i < n; i++)
                if (!isfinite(out[i]) || fabs(out[i]) > 2e30) {
                    FAIL("'%s': huge-value gradient gave %g at %zu", edge[j], out[i], i);
                    break;
                }
        gcoll_state_destroy(st);
        gcoll_compressor_destroy(c);
    }
    free(g);
    free(out);
    free(want);
    free(mag);
    free(cl);
    return failures;
}

/* ---- memory of the feedback state ----------------------------------------------------- */

#include <sys/resource.h>

/* rss SPEC COUNT STEPS: STEPS compressed allreduces (AVG) of COUNT floats; prints this
 * process's peak resident set (what the gradient, the output and the codec's state and
 * scratch took; the docs' memory table). SPEC "dense": gcoll_allreduce instead. */
int run_rss(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: coll_check rss SPEC COUNT STEPS\n");
        return 1;
    }
    const char *spec = argv[2];
    size_t count = strtoul(argv[3], NULL, 10);
    long steps = atol(argv[4]);
    int dense = !strcmp(spec, "dense");
    float *g = malloc((count + 1) * sizeof(float)), *out = malloc((count + 1) * sizeof(float));
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *st = NULL;
    checks++;
    if (!g || !out ||
        (!dense && (gcoll_compressor_create(spec, &c) != GCOLL_OK ||
                    gcoll_state_create(c, count, &st) != GCOLL_OK))) {
        FAIL("rss: bad spec '%s' or no memory", spec);
        goto out;
    }
    fixed_grad(rank, count, g);
    double t0 = now();
    for (long t = 0; t < steps; t++) {
        gcoll_status_t rc = dense ? gcoll_allreduce(comm, g, out, count, GCOLL_FLOAT32, GCOLL_AVG)
                                  : gcoll_compressed_allreduce(comm, st, g, out, count, GCOLL_AVG);
        if (rc != GCOLL_OK) {
            FAIL("rss '%s': %s", spec, gcoll_status_string(rc));
            goto out;
        }
    }
    double dt = (now() - t0) / (double)steps;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("rss %s: %zu floats (%.0f MiB), rank %d of %d: peak RSS %.0f MiB, %.1f ms per step\n",
           spec, count, count * 4.0 / 1048576.0, rank, size, (double)ru.ru_maxrss / 1024.0,
           dt * 1e3);
out:
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    free(g);
    free(out);
    return failures;
}
