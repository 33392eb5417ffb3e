/* gcoll-overlap-bench: simulates a backward pass (a real compute loop per layer, not a
 * sleep) over ResNet-50's 161 gradient tensors (or N layers of C floats) and calls ready()
 * as each finishes, to measure how much of the communication the bucketer hides behind
 * compute, and how soon after backward the first layer's reduced gradient is ready. */
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcoll.h"

typedef struct {
    char name[48];
    size_t count;
} layer_t;

static layer_t layers[200];
static int nlayers;

static void add(const char *name, size_t count)
{
    snprintf(layers[nlayers].name, sizeof(layers[0].name), "%s", name);
    layers[nlayers++].count = count;
}

/* ResNet-50 (He et al. 2016) in forward order: 53 convolutions, 53 batch norms (weight and
 * bias), and the classifier: 161 tensors, 25.5M parameters. */
static void resnet50(void)
{
    char n[48];
    add("conv1.weight", 7 * 7 * 3 * 64);
    add("bn1.weight", 64);
    add("bn1.bias", 64);
    static const int blocks[4] = {3, 4, 6, 3}, mid[4] = {64, 128, 256, 512};
    int in = 64;
    for (int s = 0; s < 4; s++) {
        int out = mid[s] * 4;
        for (int b = 0; b < blocks[s]; b++) {
            int cin = b == 0 ? in : out;
            size_t conv[3] = {(size_t)cin * mid[s], (size_t)9 * mid[s] * mid[s],
                              (size_t)mid[s] * out};
            int ch[3] = {mid[s], mid[s], out};
            for (int k = 0; k < 3; k++) {
                snprintf(n, sizeof(n), "layer%d.%d.conv%d.weight", s + 1, b, k + 1);
                add(n, conv[k]);
                snprintf(n, sizeof(n), "layer%d.%d.bn%d.weight", s + 1, b, k + 1);
                add(n, (size_t)ch[k]);
                snprintf(n, sizeof(n), "layer%d.%d.bn%d.bias", s + 1, b, k + 1);
                add(n, (size_t)ch[k]);
            }
            if (b == 0) {
                snprintf(n, sizeof(n), "layer%d.0.downsample.weight", s + 1);
                add(n, (size_t)cin * out);
                snprintf(n, sizeof(n), "layer%d.0.downsample.bn.weight", s + 1);
                add(n, (size_t)out);
                snprintf(n, sizeof(n), "layer%d.0.downsample.bn.bias", s + 1);
                add(n, (size_t)out);
            }
        }
        in = out;
    }
    add("fc.weight", 2048 * 1000);
    add("fc.bias", 1000);
}

/* N layers of C floats each, forward order. */
static void uniform_model(int n, size_t count)
{
    char name[48];
    for (int l = 0; l < n; l++) {
        snprintf(name, sizeof(name), "layer%d.weight", l);
        add(name, count);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Real arithmetic for the given time: the stand-in for a layer's backward kernel. */
static volatile float sink;
static void compute(double seconds)
{
    double end = now() + seconds;
    float x = 1.0f;
    while (now() < end)
        for (int i = 0; i < 2000; i++)
            x = x * 0.9999f + 0.0001f;
    sink = x;
}

typedef enum { MODE_COMPUTE, MODE_COMM, MODE_OVERLAP, MODE_AFTER } mode_t_;

/* Overlapped mode: after the end of backward, the time until the first layer's gradient
 * (registered last) is reduced, and until every bucket is (summed over iterations). */
static double first_sum, all_sum;
static int first_n;

/* One iteration; returns its time. */
static double iteration(gcoll_bucketer_t *b, float **g, const int *id, mode_t_ mode,
                        double compute_s, size_t total, gcoll_status_t *st)
{
    double t0 = now();
    *st = GCOLL_OK;
    /* backward: last layer first (registration order) */
    for (int k = 0; k < nlayers; k++) {
        int l = nlayers - 1 - k;
        if (mode != MODE_COMM)
            compute(compute_s * (double)layers[l].count / (double)total);
        /* every element: a mostly-zero gradient would cap what top-k can select */
        for (size_t i = 0; i < layers[l].count; i++)
            g[l][i] = (float)((i * 7 + (size_t)k) % 13) * 0.01f - 0.06f;
        if (mode == MODE_OVERLAP && *st == GCOLL_OK)
            *st = gcoll_bucketer_ready(b, id[k]);
    }
    if (mode == MODE_COMM || mode == MODE_AFTER)
        for (int k = 0; k < nlayers && *st == GCOLL_OK; k++)
            *st = gcoll_bucketer_ready(b, id[k]);
    if (mode == MODE_OVERLAP && *st == GCOLL_OK) {
        double t_end = now();
        *st = gcoll_bucketer_wait_tensor(b, id[nlayers - 1]);
        double t_first = now();
        if (*st == GCOLL_OK)
            *st = gcoll_bucketer_wait(b);
        first_sum += t_first - t_end;
        all_sum += now() - t_end;
        first_n++;
        return now() - t0;
    }
    if (mode != MODE_COMPUTE && *st == GCOLL_OK)
        *st = gcoll_bucketer_wait(b);
    return now() - t0;
}

static void usage(void)
{
    printf("usage: gcoll-overlap-bench [-c COMPUTE_MS|match] [-n ITERS] [-z SPEC] "
           "[-s STEPS] [-C CPU]\n"
           "       [-m resnet50|NxCOUNT] [-L]\n"
           "  -m NxCOUNT: N layers of COUNT floats instead of ResNet-50 (e.g. 24x250000)\n"
           "  -c match: compute for as long as the communication alone takes (measured\n"
           "  first, the slowest rank's best)\n"
           "  -L: list each tensor (forward order), its size and the compressor spec the\n"
           "  bucketer gives it under GCOLL_LAYER_POLICY, then exit\n"
           "  -C CPU: pin the compute loop (this thread) to CPU, e.g. with\n"
           "  GCOLL_PROGRESS_CPU set to another: the compute loop stands for GPU kernels\n"
           "  (it runs for wall time), leaving the other cores to communication\n"
           "  -s STEPS: only the overlapped mode, STEPS steps, one line per step with the\n"
           "  iteration time and the densities the bucketer chose (for GCOLL_ADAPT runs),\n"
           "  after two steps of compute alone (the reference, printed first)\n"
           "  simulates ResNet-50's backward pass (161 tensors, 25.5M floats) taking\n"
           "  (or the -m model's)\n"
           "  COMPUTE_MS per iteration (default 200) and reduces the gradients through\n"
           "  the bucketer with compressor SPEC (default GCOLL_COMPRESSOR, else none)\n");
}

/* Fills the layer table from -m's argument (resnet50 or NxCOUNT) and names the model;
 * 2 after printing why. */
static int pick_model(const char *model, char *name, size_t len)
{
    int mn = 0;
    size_t mc = 0;
    if (strcmp(model, "resnet50") == 0) {
        resnet50();
    } else if (sscanf(model, "%dx%zu", &mn, &mc) == 2 && mn > 0 && mn <= 200 && mc > 0) {
        uniform_model(mn, mc);
        snprintf(name, len, "%d layers of %zu floats", mn, mc);
    } else {
        fprintf(stderr, "gcoll-overlap-bench: -m %s: expected resnet50 or NxCOUNT (N 1..200)\n",
                model);
        return 2;
    }
    return 0;
}

/* -s STEPS: compute alone twice (the reference), then STEPS overlapped steps, one line
 * each; the process's exit code. */
static int run_steps(gcoll_comm_t *comm, gcoll_bucketer_t *b, float **g, const int *id, int steps,
                     double s, double compute_ms, size_t total)
{
    int rank = gcoll_comm_rank(comm);
    gcoll_status_t sst = GCOLL_OK;
    /* the reference: a step of compute alone on this machine (the gradient writes and
     * the compute loops of all ranks sharing the cores), the slowest rank's best of 2 */
    double alone = 1e30, alone_slow = 0;
    for (int k = 0; k < 2 && sst == GCOLL_OK; k++) {
        double x = iteration(b, g, id, MODE_COMPUTE, s, total, &sst);
        alone = x < alone ? x : alone;
    }
    if (sst == GCOLL_OK)
        sst = gcoll_allreduce(comm, &alone, &alone_slow, 1, GCOLL_FLOAT64, GCOLL_MAX);
    if (rank == 0 && sst == GCOLL_OK)
        printf("# compute alone %.1f ms (%.1f ms of compute loops)\n", alone_slow * 1e3,
               compute_ms);
    double t0 = now();
    if (rank == 0) {
        /* so that a script changing the link during the run can line its clock up */
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        printf("# steps start at %.3f s (CLOCK_REALTIME)\n",
               (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec);
    }
    for (int k = 0; k < steps && sst == GCOLL_OK; k++) {
        double it = iteration(b, g, id, MODE_OVERLAP, s, total, &sst), slow = it;
        if (sst == GCOLL_OK)
            sst = gcoll_allreduce(comm, &it, &slow, 1, GCOLL_FLOAT64, GCOLL_MAX);
        if (rank == 0 && sst == GCOLL_OK) {
            /* the largest bucket is the one the density matters for */
            int big = gcoll_bucketer_num_buckets(b) - 1;
            printf("step %d t %.2f s iteration %.1f ms compute %.1f ms density %g\n", k, now() - t0,
                   slow * 1e3, compute_ms, gcoll_bucketer_density(b, big));
            fflush(stdout);
        }
    }
    if (sst != GCOLL_OK)
        fprintf(stderr, "gcoll-overlap-bench: %s\n", gcoll_comm_last_error(comm));
    gcoll_bucketer_destroy(b);
    gcoll_comm_destroy(comm);
    return sst == GCOLL_OK ? 0 : 1;
}

/* The four modes, the slowest rank's best time of each in t (with -c match, compute_s and
 * compute_ms first set to the communication alone's), and the slowest rank's mean times
 * from the end of backward in after. */
static gcoll_status_t run_modes(gcoll_comm_t *comm, gcoll_bucketer_t *b, float **g, const int *id,
                                int iters, int match, double *compute_s, double *compute_ms,
                                size_t total, double t[4], double after[2])
{
    gcoll_status_t st = GCOLL_OK;
    double s = *compute_s;
    if (match) { /* compute as long as the communication alone (its slowest rank's best) */
        double best = 1e30;
        for (int it = 0; it < iters + 2 && st == GCOLL_OK; it++) { /* 2 warm-ups */
            double x = iteration(b, g, id, MODE_COMM, 0, total, &st);
            best = it >= 2 && x < best ? x : best;
        }
        if (st == GCOLL_OK)
            st = gcoll_allreduce(comm, &best, &s, 1, GCOLL_FLOAT64, GCOLL_MAX);
        *compute_ms = s * 1e3;
    }
    *compute_s = s;
    for (int m = 0; m < 4 && st == GCOLL_OK; m++) {
        iteration(b, g, id, (mode_t_)m, s, total, &st); /* warm-up */
        if (m == MODE_OVERLAP) {
            first_sum = all_sum = 0;
            first_n = 0;
        }
        double best = 1e30;
        for (int it = 0; it < iters && st == GCOLL_OK; it++) {
            double x = iteration(b, g, id, (mode_t_)m, s, total, &st);
            best = x < best ? x : best;
        }
        /* the slowest rank's best time */
        if (st == GCOLL_OK)
            st = gcoll_allreduce(comm, &best, &t[m], 1, GCOLL_FLOAT64, GCOLL_MAX);
    }
    /* the slowest rank's mean times from the end of backward */
    after[0] = first_n ? first_sum / first_n : 0;
    after[1] = first_n ? all_sum / first_n : 0;
    if (st == GCOLL_OK)
        st = gcoll_allreduce(comm, after, after, 2, GCOLL_FLOAT64, GCOLL_MAX);
    return st;
}

/* Rank 0's table of the four modes and what follows from them. */
static void report(gcoll_comm_t *comm, gcoll_bucketer_t *b, const char *model_name,
                   const char *spec, int iters, int match, double compute_ms, size_t total,
                   const double t[4], const double after[2])
{
    static const char *const names[4] = {"compute alone", "communication alone",
                                         "bucketer, overlapped", "all after backward"};
    const char *pr = getenv("GCOLL_BUCKET_PRIORITY");
    printf("# gcoll-overlap-bench: %s gradients (%d tensors, %.1fM floats) in %d "
           "buckets, %d ranks over %s, compressor %s, best of %d\n",
           model_name, nlayers, (double)total / 1e6, gcoll_bucketer_num_buckets(b),
           gcoll_comm_size(comm), gcoll_comm_transport(comm),
           spec ? spec : (getenv("GCOLL_COMPRESSOR") ? getenv("GCOLL_COMPRESSOR") : "none"), iters);
    printf("# compute loops %.1f ms per iteration%s\n", compute_ms,
           match ? " (-c match: the communication alone, measured first)" : "");
    for (int m = 0; m < 4; m++)
        printf("%-24s %9.1f ms\n", names[m], t[m] * 1e3);
    double hidden = t[0] + t[1] - t[2], lo = t[0] < t[1] ? t[0] : t[1];
    printf("overlap efficiency       %9.2f   ((compute + comm - overlapped) / min(compute, "
           "comm))\n",
           lo > 0 ? hidden / lo : 0);
    printf("speedup over after-backward %6.2fx\n", t[3] / t[2]);
    printf("first layer ready        %9.1f ms after backward (mean, overlapped; "
           "GCOLL_BUCKET_PRIORITY=%s)\n",
           after[0] * 1e3, pr && *pr ? pr : "1");
    printf("all buckets reduced      %9.1f ms after backward (mean, overlapped)\n", after[1] * 1e3);
}

int main(int argc, char **argv)
{
    double compute_ms = 200;
    int iters = 5, steps = 0;
    const char *spec = NULL, *model = "resnet50";
    int c;
    int compute_cpu = -1, list = 0, match = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0) {
            usage();
            return 0;
        }
    while ((c = getopt(argc, argv, "c:n:z:s:C:m:Lh")) != -1) {
        /* clang-format off */
        switch (c) {
        case 'L': list = 1; break;
        case 'C': compute_cpu = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'm': model = optarg; break;
        case 'c':
            match = strcmp(optarg, "match") == 0;
            compute_ms = match ? 0 : atof(optarg);
            break;
        case 'n': iters = atoi(optarg); break;
        case 'z': spec = optarg; break;
        default:
            usage();
            return c == 'h' ? 0 : 2;
        }
        /* clang-format on */
    }
    char model_name[64] = "ResNet-50";
    if (pick_model(model, model_name, sizeof(model_name)) != 0)
        return 2;
    gcoll_comm_t *comm;
    if (gcoll_comm_init(&comm) != GCOLL_OK)
        return 1;
    if (compute_cpu >= 0) {
        /* after gcoll_comm_init, so the progress thread did not inherit this affinity */
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(compute_cpu, &one);
        if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0) {
            fprintf(stderr, "gcoll-overlap-bench: cannot pin the compute loop to CPU %d\n",
                    compute_cpu);
            return 2;
        }
    }
    gcoll_bucketer_config_t cfg = {.default_spec = spec ? spec : getenv("GCOLL_COMPRESSOR"),
                                   .op = GCOLL_AVG,
                                   .policy = getenv("GCOLL_LAYER_POLICY")};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, spec ? &cfg : NULL, &b) != GCOLL_OK) {
        fprintf(stderr, "gcoll-overlap-bench: %s\n", gcoll_comm_last_error(comm));
        return 1;
    }
    float *g[200];
    int id[200];
    size_t total = 0;
    /* register in backward order: the last layer first */
    for (int k = 0; k < nlayers; k++) {
        int l = nlayers - 1 - k;
        g[l] = calloc(layers[l].count, sizeof(float));
        total += layers[l].count;
        if (gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                      &id[k]) != GCOLL_OK)
            return 1;
    }
    int rank = gcoll_comm_rank(comm);
    if (list) {
        for (int l = 0; rank == 0 && l < nlayers; l++)
            printf("%-36s %9zu %s\n", layers[l].name, layers[l].count,
                   gcoll_bucketer_tensor_spec(b, id[nlayers - 1 - l]));
        gcoll_bucketer_destroy(b);
        for (int l = 0; l < nlayers; l++)
            free(g[l]);
        gcoll_comm_destroy(comm);
        return 0;
    }
    double s = compute_ms / 1e3, t[4] = {0}, after[2];
    if (steps > 0)
        return run_steps(comm, b, g, id, steps, s, compute_ms, total);
    gcoll_status_t st = run_modes(comm, b, g, id, iters, match, &s, &compute_ms, total, t, after);
    if (st != GCOLL_OK) {
        fprintf(stderr, "gcoll-overlap-bench: %s\n", gcoll_comm_last_error(comm));
        return 1;
    }
    if (rank == 0)
        report(comm, b, model_name, spec, iters, match, compute_ms, total, t, after);
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < nlayers; l++)
        free(g[l]);
    gcoll_comm_destroy(comm);
    return 0;
}
