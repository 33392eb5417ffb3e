/* modes.c: gcoll-train's local-SGD mode (gcoll_localsgd over the MLP's parameters), the
 * simulated stragglers, and the summary lines of every mode. The loop follows train.c's;
 * it is kept apart so that the bucketer's synchronous loop stays as it is. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"
#include "modes.h"

const char train_mode_usage[] =
    "Local SGD (Qsparse-local-SGD; docs/local-sgd.md):\n"
    "      --local-steps H     each rank takes H local SGD steps, then the model delta is\n"
    "                          compressed with --compressor (error feedback per tensor) and\n"
    "                          averaged; H=1 with 'none' is synchronous SGD\n"
    "      --local-warmup N    the first N steps synchronise every step (PostLocalSGD; 0)\n"
    "      --local-momentum M  momentum buffers at a sync: local (kept, the default), reset\n"
    "                          (zeroed) or average (dense allreduce)\n"
    "Bounded-staleness asynchronous SGD (SSP parameter server inside the job):\n"
    "      --async             every rank owns a shard of each tensor; workers pull the\n"
    "                          model, push momentum-SGD updates compressed with\n"
    "                          --compressor, the owners apply them weighted 1/(1+tau)\n"
    "      --staleness S       SSP bound: no worker computes more than S clocks ahead of\n"
    "                          the slowest (0, synchronous); also prints 'max clock gap: N'\n"
    "                          and 'mean staleness: X'\n"
    "      --pull-compressor SPEC  codec of the pull answers (none: the dense shard); the\n"
    "                          owner sends the change from the worker's copy and keeps the\n"
    "                          rest (top-k, quantizers, fp16)\n"
    "      --dc-lambda L       DC-ASGD delay compensation (Zheng et al. 2017): the owner\n"
    "                          adds L g*g*(w_now - w_read) to each update g (0: off)\n"
    "      --staleness-weight W  f(tau) of the updates: inverse (1/(1+tau)) or none (1,\n"
    "                          the default); with S > 0 the worker momentum defaults to\n"
    "                          0.7 (asynchrony adds its own; docs/local-sgd.md)\n"
    "      --prefetch on|off   on (the default): a pull installs the model asked for at the\n"
    "                          previous one and asks for the next, which travels while the\n"
    "                          worker computes (one clock staler, within S); off: ask and wait\n"
    "Stragglers (real extra forward/backward passes, not sleep; need --local-steps or\n"
    "--async):\n"
    "      --straggle F        at each step one rank, from a seeded schedule all ranks know,\n"
    "                          works F times as long (F rounded to whole passes)\n"
    "      --slow-rank R       rank R works --slow-factor F times as long at every step\n"
    "      --slow-factor F     (2)\n"
    "Every mode ends with the lines 'final test accuracy: 0.NNNN', 'total wire MB: X' (bytes\n"
    "rank 0 sent, as the epochs' r0_wire_MB, plus the epoch statistics) and 'steps per\n"
    "second: X' (rank 0's optimizer steps over the run).\n";

void train_mode_opts_default(train_mode_opts_t *mo)
{
    memset(mo, 0, sizeof(*mo));
    mo->local_momentum = GCOLL_LSGD_MOMENTUM_LOCAL;
    mo->slow_rank = -1;
    mo->slow_factor = 2.0;
    mo->prefetch = 1;
}

static int num(const char *opt, const char *arg, double lo, double hi, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(arg, &end);
    if (errno || end == arg || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "gcoll-train: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi,
                arg);
        return -1;
    }
    *v = x;
    return 0;
}

int train_mode_option(train_mode_opts_t *mo, int c, const char *arg)
{
    double v;
    switch (c) {
    case TRAIN_OPT_LOCAL_STEPS:
        if (num("--local-steps", arg, 1, 1000000, &v))
            return -1;
        mo->local_steps = (int)v;
        return 0;
    case TRAIN_OPT_LOCAL_WARMUP:
        if (num("--local-warmup", arg, 0, 1e9, &v))
            return -1;
        mo->local_warmup = (int)v;
        return 0;
    case TRAIN_OPT_LOCAL_MOMENTUM:
        if (!strcmp(arg, "local"))
            mo->local_momentum = GCOLL_LSGD_MOMENTUM_LOCAL;
        else if (!strcmp(arg, "reset"))
            mo->local_momentum = GCOLL_LSGD_MOMENTUM_RESET;
        else if (!strcmp(arg, "average"))
            mo->local_momentum = GCOLL_LSGD_MOMENTUM_AVERAGE;
        else {
            fprintf(stderr,
                    "gcoll-train: --local-momentum expects local, reset or average, "
                    "got '%s'\n",
                    arg);
            return -1;
        }
        return 0;
    case TRAIN_OPT_STRAGGLE:
        if (num("--straggle", arg, 1, 1000, &v))
            return -1;
        mo->straggle = v;
        return 0;
    case TRAIN_OPT_SLOW_RANK:
        if (num("--slow-rank", arg, 0, 1048575, &v))
            return -1;
        mo->slow_rank = (int)v;
        return 0;
    case TRAIN_OPT_ASYNC:
        mo->async = 1;
        return 0;
    case TRAIN_OPT_STALENESS:
        if (num("--staleness", arg, 0, 1000, &v))
            return -1;
        mo->staleness = (int)v;
        return 0;
    case TRAIN_OPT_PULL_COMPRESSOR:
        mo->pull_compressor = arg;
        return 0;
    case TRAIN_OPT_DC_LAMBDA:
        if (num("--dc-lambda", arg, 0, 1e6, &v))
            return -1;
        mo->dc_lambda = v;
        return 0;
    case TRAIN_OPT_STALENESS_WEIGHT:
        if (!strcmp(arg, "inverse"))
            mo->weighting = GCOLL_PS_WEIGHT_INVERSE;
        else if (!strcmp(arg, "none"))
            mo->weighting = GCOLL_PS_WEIGHT_NONE;
        else {
            fprintf(stderr,
                    "gcoll-train: --staleness-weight expects inverse or none, got "
                    "'%s'\n",
                    arg);
            return -1;
        }
        mo->weighting_set = 1;
        return 0;
    case TRAIN_OPT_PREFETCH:
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            fprintf(stderr, "gcoll-train: --prefetch expects on or off, got '%s'\n", arg);
            return -1;
        }
        mo->prefetch = !strcmp(arg, "on");
        mo->prefetch_set = 1;
        return 0;
    case TRAIN_OPT_SLOW_FACTOR:
        if (num("--slow-factor", arg, 1, 1000, &v))
            return -1;
        mo->slow_factor = v;
        return 0;
    }
    fprintf(stderr, "gcoll-train: internal: unknown mode option %d\n", c);
    return -1;
}

int train_mode_active(const train_mode_opts_t *mo)
{
    return mo->local_steps > 0 || mo->async || mo->straggle > 0 || mo->slow_rank >= 0;
}

int train_mode_check(const train_mode_opts_t *mo, const train_opts_t *o)
{
    if ((mo->straggle > 0 || mo->slow_rank >= 0) && mo->local_steps == 0 && !mo->async) {
        fprintf(stderr, "gcoll-train: --straggle and --slow-rank need --local-steps H (H=1 "
                        "with 'none' is synchronous SGD) or --async\n");
        return -1;
    }
    if (mo->async && mo->local_steps > 0) {
        fprintf(stderr, "gcoll-train: --async and --local-steps are different modes\n");
        return -1;
    }
    if ((mo->pull_compressor || mo->dc_lambda > 0 || mo->weighting_set || mo->prefetch_set) &&
        !mo->async) {
        fprintf(stderr, "gcoll-train: --pull-compressor, --dc-lambda, --staleness-weight and "
                        "--prefetch apply to --async\n");
        return -1;
    }
    if (mo->staleness > 0 && !mo->async) {
        fprintf(stderr, "gcoll-train: --staleness applies to --async\n");
        return -1;
    }
    if (mo->async && o->lr_schedule > TRAIN_LR_CONSTANT) {
        fprintf(stderr, "gcoll-train: --lr-schedule: with --async the parameter server applies "
                        "a constant --lr\n");
        return -1;
    }
    if (mo->async && o->policy && *o->policy) {
        fprintf(stderr, "gcoll-train: --policy applies to the bucketer's gradients; with "
                        "--async the one --compressor codes every push\n");
        return -1;
    }
    if (mo->local_steps > 0 && o->policy && *o->policy) {
        fprintf(stderr, "gcoll-train: --policy applies to the bucketer's gradients; with "
                        "--local-steps the one --compressor codes every delta\n");
        return -1;
    }
    return 0;
}

double train_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t train_total_steps(const train_opts_t *o, const train_data_t *d, int size)
{
    size_t ntrain = o->limit && o->limit < d->train.n ? o->limit : d->train.n;
    size_t global = (size_t)o->batch * (size_t)size;
    return global ? (size_t)o->epochs * (ntrain / global) : 0;
}

void train_print_summary(FILE *out, gcoll_comm_t *comm, const gcoll_counters_t *c0, double seconds,
                         size_t steps)
{
    if (!out || gcoll_comm_rank(comm) != 0)
        return;
    gcoll_counters_t c1;
    gcoll_comm_counters(comm, &c1);
    fprintf(out, "total wire MB: %.3f\n", (double)(c1.bytes_sent - c0->bytes_sent) / 1e6);
    fprintf(out, "steps per second: %.2f\n", seconds > 0 ? (double)steps / seconds : 0.0);
    fflush(out);
}

int train_straggle_passes(const train_mode_opts_t *mo, uint64_t seed, uint64_t step, int rank,
                          int size)
{
    double f = 1.0;
    if (mo->slow_rank == rank)
        f = mo->slow_factor;
    if (mo->straggle > 0 && size > 1) {
        /* the schedule is a function of (seed, step) only: every rank knows who is slow */
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + step;
        if ((int)(train_splitmix64(&s) % (uint64_t)size) == rank)
            f *= mo->straggle;
    }
    return (int)lround(f - 1.0);
}

int train_mode_fail(gcoll_comm_t *comm, const char *what, gcoll_status_t st)
{
    const char *detail = gcoll_comm_last_error(comm);
    fprintf(stderr, "gcoll-train: rank %d: %s: %s%s%s\n", gcoll_comm_rank(comm), what,
            gcoll_status_string(st), *detail ? ": " : "", detail);
    return -1;
}

/* This rank's share of the test set, summed (as train.c's). */
void train_mode_evaluate(train_mlp_t *m, const train_split_t *t, size_t n, int rank, int size,
                         float *x, uint8_t *y, uint32_t *idx, double *loss_sum, long *correct)
{
    size_t lo = n * (size_t)rank / (size_t)size, hi = n * (size_t)(rank + 1) / (size_t)size;
    for (size_t i = lo; i < hi; i += (size_t)m->cap) {
        int b = (int)(hi - i < (size_t)m->cap ? hi - i : (size_t)m->cap);
        for (int j = 0; j < b; j++)
            idx[j] = (uint32_t)(i + (size_t)j);
        train_gather(t, idx, (size_t)b, x, y);
        *loss_sum += train_mlp_forward(m, x, y, b, correct) * b;
    }
}

void train_epoch_done(FILE *out, int csv, train_result_t *res, int epoch, const double v[5],
                      size_t examples, size_t ntest, double secs, double wait_s)
{
    double train_loss = v[0] / (double)examples, acc = v[1] / (double)ntest;
    if (epoch == 0)
        res->first_loss = train_loss;
    res->last_loss = train_loss;
    res->final_acc = acc;
    res->wire_bytes += (uint64_t)v[3];
    res->raw_bytes += (uint64_t)v[4];
    if (!out)
        return;
    if (csv)
        fprintf(out, "%d,%.6f,%.6f,%.4f,%.0f,%.0f,%.3f,%.3f\n", epoch + 1, train_loss,
                v[2] / (double)ntest, acc, v[3], v[4], secs, wait_s);
    else
        fprintf(out, "%5d %10.4f %9.4f %8.4f %10.2f %10.2f %8.4f %7.2f %6.2f\n", epoch + 1,
                train_loss, v[2] / (double)ntest, acc, v[3] / 1e6, v[4] / 1e6,
                v[4] > 0 ? v[3] / v[4] : 0.0, secs, wait_s);
    fflush(out);
}

int train_epoch_end(gcoll_comm_t *comm, FILE *out, int csv, train_result_t *res, int epoch,
                    train_work_t *w, const train_split_t *test, size_t ntest, double loss_sum,
                    const gcoll_counters_t *c0, size_t examples, double t0, double wait_s)
{
    gcoll_counters_t c1;
    gcoll_comm_counters(comm, &c1);
    double test_loss = 0.0;
    long correct = 0;
    train_mode_evaluate(&w->m, test, ntest, gcoll_comm_rank(comm), gcoll_comm_size(comm), w->x,
                        w->y, w->idx, &test_loss, &correct);
    const double wire = (double)(c1.bytes_sent - c0->bytes_sent),
                 raw = (double)(c1.bytes_raw - c0->bytes_raw);
    double v[5] = {loss_sum, (double)correct, test_loss, wire, raw};
    gcoll_status_t st = gcoll_allreduce(comm, v, v, 3, GCOLL_FLOAT64, GCOLL_SUM);
    if (st != GCOLL_OK)
        return train_mode_fail(comm, "epoch statistics", st);
    /* the traffic is this rank's own, as 'total wire MB' is rank 0's: the two add up */
    train_epoch_done(out, csv, res, epoch, v, examples, ntest, train_now_s() - t0, wait_s);
    return 0;
}

int train_work_init(train_work_t *w, const train_opts_t *o, const train_data_t *d, size_t ntrain,
                    int rank)
{
    memset(w, 0, sizeof(*w));
    int sizes[TRAIN_MAX_LAYERS + 1];
    memcpy(sizes, o->sizes, sizeof(sizes));
    sizes[0] = (int)d->train.dim;
    int cap = o->batch > 500 ? o->batch : 500; /* evaluation runs 500 examples at a time */
    train_sgemm_init();
    if (train_mlp_init(&w->m, sizes, o->nsizes, cap, o->seed) != 0) {
        fprintf(stderr, "gcoll-train: rank %d: cannot create the model (out of memory?)\n", rank);
        return -1;
    }
    w->x = malloc((size_t)cap * d->train.dim * sizeof(float));
    w->y = malloc((size_t)cap);
    w->perm = malloc(ntrain * sizeof(uint32_t));
    w->idx = malloc((size_t)cap * sizeof(uint32_t));
    if (!w->x || !w->y || !w->perm || !w->idx) {
        fprintf(stderr, "gcoll-train: rank %d: out of memory\n", rank);
        train_work_free(w);
        return -1;
    }
    return 0;
}

void train_print_model(FILE *out, const char *prefix, gcoll_comm_t *comm, const train_work_t *w)
{
    int size = gcoll_comm_size(comm);
    fprintf(out, "%sgcoll-train: %d rank%s (%s), MLP", prefix, size, size == 1 ? "" : "s",
            gcoll_comm_transport(comm));
    fprintf(out, " %d", w->m.l[0].in);
    for (int l = 0; l < w->m.nl; l++)
        fprintf(out, "-%d", w->m.l[l].out);
    fprintf(out, " (%zu parameters), sgemm %s\n", train_mlp_num_params(&w->m), train_sgemm_name());
}

void train_work_free(train_work_t *w)
{
    train_mlp_free(&w->m);
    free(w->x);
    free(w->y);
    free(w->perm);
    free(w->idx);
    memset(w, 0, sizeof(*w));
}

int train_keep_params(const train_mlp_t *m, int rank, train_result_t *res)
{
    res->nparams = train_mlp_num_params(m);
    res->params = malloc(res->nparams * sizeof(float));
    if (!res->params) {
        fprintf(stderr, "gcoll-train: rank %d: out of memory\n", rank);
        return -1;
    }
    train_mlp_get_params(m, res->params);
    return 0;
}

static const char *momentum_name(int m)
{
    return m == GCOLL_LSGD_MOMENTUM_RESET     ? "reset"
           : m == GCOLL_LSGD_MOMENTUM_AVERAGE ? "average"
                                              : "local";
}

/* One local SGD run of train_run_mode: its sizes and what it holds. */
typedef struct {
    const train_opts_t *o;
    const train_mode_opts_t *mo;
    const train_data_t *d;
    gcoll_comm_t *comm;
    FILE *out; /* rank 0's, else NULL */
    int rank, size;
    size_t ntrain, ntest, global, steps; /* steps per epoch */
    float momentum;
    train_work_t w;
    gcoll_localsgd_t *ls;
} ls_run_t;

/* The local SGD state with the model's tensors (and momentum buffers); -1 after saying
 * why. */
static int ls_setup(ls_run_t *r)
{
    const train_mode_opts_t *mo = r->mo;
    train_work_t *w = &r->w;
    gcoll_localsgd_config_t lc = {
        .local_steps = mo->local_steps,
        .warmup_steps = mo->local_warmup,
        .compressor = r->o->compressor,
        .momentum = (gcoll_lsgd_momentum_t)mo->local_momentum,
    };
    gcoll_status_t st = gcoll_localsgd_create(r->comm, &lc, &r->ls);
    if (st != GCOLL_OK) {
        train_mode_fail(r->comm, "gcoll_localsgd_create", st);
        return -1;
    }
    /* every rank initialized the model from the same seed: the synced copies agree */
    for (int l = 0; l < w->m.nl && st == GCOLL_OK; l++) {
        st = gcoll_localsgd_add_tensor(r->ls, w->m.l[l].w, r->momentum > 0 ? w->m.l[l].vw : NULL,
                                       (size_t)w->m.l[l].in * w->m.l[l].out, NULL);
        if (st == GCOLL_OK)
            st =
                gcoll_localsgd_add_tensor(r->ls, w->m.l[l].b, r->momentum > 0 ? w->m.l[l].vb : NULL,
                                          (size_t)w->m.l[l].out, NULL);
    }
    if (st != GCOLL_OK) {
        train_mode_fail(r->comm, "gcoll_localsgd_add_tensor", st);
        return -1;
    }
    return 0;
}

/* Rank 0's header: the model, the run's settings, the table's head. */
static void ls_header(const ls_run_t *r)
{
    const train_opts_t *o = r->o;
    const train_mode_opts_t *mo = r->mo;
    FILE *out = r->out;
    train_print_model(out, "", r->comm, &r->w);
    fprintf(out,
            "local SGD: H=%d after %d synchronous steps, delta compressor %s, momentum %g "
            "(%s at a sync); batch %d per rank (%zu global), lr %g %s; %zu steps per epoch on "
            "%zu examples, %zu test; seed %llu",
            mo->local_steps, mo->local_warmup, o->compressor, (double)r->momentum,
            momentum_name(mo->local_momentum), o->batch, r->global, (double)o->lr,
            train_lr_schedule_name(o->lr_schedule), r->steps, r->ntrain, r->ntest,
            (unsigned long long)o->seed);
    if (mo->straggle > 0)
        fprintf(out, "; rotating straggler x%g", mo->straggle);
    if (mo->slow_rank >= 0)
        fprintf(out, "; rank %d slow x%g", mo->slow_rank, mo->slow_factor);
    fprintf(out, "\n%5s %10s %9s %8s %10s %10s %8s %7s %6s\n", "epoch", "train_loss", "test_loss",
            "test_acc", "r0_wire_MB", "r0_raw_MB", "wire/raw", "time_s", "wait_s");
    fflush(out);
}

/* Epoch e: every local step (gstep counts them over the run), then a sync, the test set of
 * the common model and the epoch's line; -1 after saying why. */
static int ls_epoch(ls_run_t *r, int e, uint64_t *gstep, train_result_t *res)
{
    const train_opts_t *o = r->o;
    const train_data_t *d = r->d;
    gcoll_comm_t *comm = r->comm;
    train_work_t *w = &r->w;
    const size_t steps = r->steps;
    gcoll_status_t st;
    double t0 = train_now_s(), wait_s = 0.0, loss_sum = 0.0;
    gcoll_counters_t c0;
    gcoll_comm_counters(comm, &c0);
    train_permutation(w->perm, r->ntrain, o->seed, (uint64_t)e);
    for (size_t s = 0; s < steps; s++, (*gstep)++) {
        train_gather(&d->train, w->perm + s * r->global + (size_t)r->rank * o->batch,
                     (size_t)o->batch, w->x, w->y);
        int extra = train_straggle_passes(r->mo, o->seed, *gstep, r->rank, r->size);
        double loss = 0;
        for (int k = 0; k <= extra; k++) {
            loss = train_mlp_forward(&w->m, w->x, w->y, o->batch, NULL);
            train_mlp_backward(&w->m, w->y, NULL, NULL);
        }
        if (!isfinite(loss)) {
            fprintf(stderr,
                    "gcoll-train: rank %d: the loss diverged (%g) at epoch %d step %zu: "
                    "try a smaller --lr\n",
                    r->rank, loss, e + 1, s);
            gcoll_comm_abort(comm);
            return -1;
        }
        loss_sum += loss;
        train_mlp_sgd(&w->m, train_lr_at(o, *gstep, (size_t)o->epochs * steps), r->momentum);
        double tw = train_now_s();
        st = gcoll_localsgd_step(r->ls, NULL);
        wait_s += train_now_s() - tw;
        if (st != GCOLL_OK) {
            train_mode_fail(comm, "gcoll_localsgd_step", st);
            return -1;
        }
    }
    /* evaluate the common model */
    double tw = train_now_s();
    st = gcoll_localsgd_sync(r->ls);
    wait_s += train_now_s() - tw;
    if (st != GCOLL_OK) {
        train_mode_fail(comm, "gcoll_localsgd_sync", st);
        return -1;
    }
    return train_epoch_end(comm, r->out, 0, res, e, w, &d->test, r->ntest, loss_sum, &c0,
                           steps * (size_t)r->size, t0, wait_s);
}

int train_run_mode(const train_opts_t *o, const train_mode_opts_t *mo, const train_data_t *d,
                   gcoll_comm_t *comm, FILE *out, int keep_params, train_result_t *res)
{
    int rank = gcoll_comm_rank(comm), size = gcoll_comm_size(comm);
    memset(res, 0, sizeof(*res));
    if (rank != 0)
        out = NULL;
    size_t ntrain = o->limit && o->limit < d->train.n ? o->limit : d->train.n;
    size_t ntest = o->test_limit && o->test_limit < d->test.n ? o->test_limit : d->test.n;
    size_t global = (size_t)o->batch * (size_t)size;
    if (o->batch < 1 || global > ntrain) {
        fprintf(stderr,
                "gcoll-train: rank %d: a global batch of %zu (%d per rank x %d ranks) needs at "
                "least that many training examples, have %zu\n",
                rank, global, o->batch, size, ntrain);
        return -1;
    }
    if (mo->slow_rank >= size) {
        fprintf(stderr, "gcoll-train: --slow-rank %d: the job has %d ranks\n", mo->slow_rank, size);
        return -1;
    }
    if (mo->async)
        return train_run_async(o, mo, d, comm, out, keep_params, res);
    ls_run_t r = {.o = o,
                  .mo = mo,
                  .d = d,
                  .comm = comm,
                  .out = out,
                  .rank = rank,
                  .size = size,
                  .ntrain = ntrain,
                  .ntest = ntest,
                  .global = global,
                  .steps = ntrain / global};
    /* DGC's own momentum does not apply to deltas: the optimizer keeps 0.9 unless told */
    r.momentum = o->momentum >= 0.0f ? o->momentum : 0.9f;
    int rc = -1;
    if (train_work_init(&r.w, o, d, ntrain, rank) != 0)
        return -1;
    if (ls_setup(&r) != 0)
        goto out;
    if (out)
        ls_header(&r);
    uint64_t gstep = 0;
    for (int e = 0; e < o->epochs; e++)
        if (ls_epoch(&r, e, &gstep, res) != 0)
            goto out;
    if (out) {
        fprintf(out, "final test accuracy: %.4f\n", res->final_acc);
        fflush(out);
    }
    if (keep_params && train_keep_params(&r.w.m, rank, res) != 0)
        goto out;
    rc = 0;
out:
    gcoll_localsgd_destroy(r.ls);
    train_work_free(&r.w);
    return rc;
}

void train_adapt_report(FILE *out, int csv, const gcoll_bucketer_t *b, int epoch)
{
    gcoll_adapt_stats_t st;
    if (!out || gcoll_bucketer_stats(b, -1, &st) != GCOLL_OK || st.steps == 0)
        return;
    fprintf(out,
            "%sadapt: epoch %d noise_scale %.4g noise_share %.4f stage %.4f boost %.2f "
            "bandwidth_MBps %.1f density %.6g buckets",
            csv ? "# " : "", epoch + 1, st.noise_scale, st.noise_share, st.stage, st.phase_boost,
            st.bandwidth / 1e6, st.density);
    for (int j = 0; j < gcoll_bucketer_num_buckets(b); j++) {
        gcoll_adapt_stats_t bs;
        gcoll_bucketer_stats(b, j, &bs);
        if (bs.bits)
            fprintf(out, "%s%ub", j ? "," : " ", bs.bits);
        else
            fprintf(out, "%s%.6g", j ? "," : " ", gcoll_bucketer_density(b, j));
    }
    fprintf(out, "\n");
    fflush(out);
}
