/* train.c: the data-parallel training loop. Every rank holds the whole model; each step it
 * takes its slice of a global batch, runs forward and backward, and hands each layer's
 * gradients to gcoll's bucketer as soon as backward produces them (last layer first), so
 * their compression and reduction overlap the backward pass of the earlier layers; after
 * gcoll_bucketer_wait() every rank holds the same averaged gradient and takes the same step.
 *
 * DGC (Lin et al. 2018, "Deep Gradient Compression") corrects momentum inside the codec: it
 * accumulates velocity u = m u + g per rank and sends the largest entries of the
 * accumulation, so, as in the paper, the trainer applies plain SGD to its output. A codec
 * with error feedback gets the momentum before compression too: each rank updates its
 * velocity u = m u + g and hands u to the bucketer, whose codec feeds back what it did not
 * send of u, and the trainer applies plain SGD to the average. That is EF-SGD with
 * momentum as Karimireddy et al. 2019 ("Error Feedback Fixes SignSGD") and Zheng et al.
 * 2019 (blockwise momentum SGD with error feedback) run it; momentum applied after the
 * reduction instead multiplies the bursts in which a residual is paid out, and sign,
 * QSGD 4-bit and random-k with error feedback diverged that way here. For an exact codec
 * the two orders are the same update (the average of the ranks' velocities is the velocity
 * of the averaged gradient). Codecs without feedback keep momentum after the reduction. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"
#include "modes.h"
#include "train.h"

void train_opts_default(train_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->epochs = 5;
    o->compressor = "none";
    o->policy = "";
    o->seed = 1;
    o->batch = 64;
    o->lr = 0.05f;
    o->lr_schedule = -1;
    o->momentum = -1.0f;
    o->bucket_bytes = 1;
    o->warmup_frac = 0.1;
    o->sizes[0] = 784;
    o->sizes[1] = 512;
    o->sizes[2] = 256;
    o->sizes[3] = TRAIN_CLASSES;
    o->nsizes = 4;
}

int train_lr_schedule_parse(const char *s)
{
    static const char *const names[] = {"constant", "cosine", "step"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *train_lr_schedule_name(int schedule)
{
    return schedule == TRAIN_LR_STEP       ? "step"
           : schedule == TRAIN_LR_CONSTANT ? "constant"
                                           : "cosine";
}

float train_lr_at(const train_opts_t *o, size_t t, size_t total)
{
    double f = total ? (double)t / (double)total : 0.0;
    switch (o->lr_schedule) {
    case -1: /* the default outside --async */
    case TRAIN_LR_COSINE:
        return (float)(o->lr * 0.5 * (1.0 + cos(M_PI * f)));
    case TRAIN_LR_STEP:
        return o->lr * (f >= 0.75 ? 0.01f : f >= 0.5 ? 0.1f : 1.0f);
    default:
        return o->lr;
    }
}

const char *train_dgc_layer_rule(const char *compressor, char *buf, size_t len)
{
    gcoll_compressor_t *c = NULL;
    if (!compressor || strncmp(compressor, "dgc", 3) != 0 || strchr(compressor, '+') ||
        gcoll_compressor_create(compressor, &c) != GCOLL_OK)
        return NULL;
    const char *d = strstr(gcoll_compressor_spec(c), "density=");
    double density = d ? strtod(d + 8, NULL) : 0.0;
    int n = density > 0.0 ? snprintf(buf, len, "last=none;size<%.0f=none;*=%s",
                                     floor(2.0 / density) + 1.0, compressor)
                          : -1;
    gcoll_compressor_destroy(c);
    return n > 0 && (size_t)n < len ? buf : NULL;
}

int train_uses_dgc(const char *compressor, const char *policy)
{
    return (compressor && strstr(compressor, "dgc")) || (policy && strstr(policy, "dgc"));
}

int train_codec_momentum(const char *spec)
{
    if (!spec)
        return 0;
    if (strstr(spec, "dgc"))
        return 1;
    const char *m = strncmp(spec, "randomk", 7) == 0 ? strstr(spec, "momentum=") : NULL;
    return m && strtod(m + 9, NULL) > 0.0;
}

/* Random-k's error feedback at density p is itself a heavy-ball momentum of 1-p in
 * expectation (docs/compressors.md), so the optimizer's momentum on top diverged here (NaN
 * in epoch 2 at 1%); its codec takes the momentum instead (randomk:momentum=M). */
const char *train_randomk_spec(const char *compressor, float momentum, char *buf, size_t len)
{
    if (!compressor || strncmp(compressor, "randomk:", 8) != 0 || !(momentum > 0.0f) ||
        strstr(compressor, "momentum=") || strstr(compressor, "ef=0") ||
        strstr(compressor, "feedback=ef21") || strstr(compressor, "unbiased=1"))
        return NULL;
    const char *plus = strchr(compressor, '+');
    int head = plus ? (int)(plus - compressor) : (int)strlen(compressor);
    int n = snprintf(buf, len, "%.*s,momentum=%g%s", head, compressor, (double)momentum,
                     plus ? plus : "");
    return n > 0 && (size_t)n < len ? buf : NULL;
}

/* Whether the codec feeds back its error, and so gets the momentum before it (above). */
int train_momentum_first(const char *compressor, const char *policy)
{
    if (policy && *policy)
        return 0; /* several codecs: momentum after the reduction, as before */
    return compressor && *compressor && strcmp(compressor, "none") != 0 &&
           !train_uses_dgc(compressor, policy) && !train_codec_momentum(compressor) &&
           !strstr(compressor, "ef=0");
}

typedef struct {
    gcoll_bucketer_t *b;
    int id_w[TRAIN_MAX_LAYERS], id_b[TRAIN_MAX_LAYERS];
    gcoll_status_t st;
    train_mlp_t *m;
    float momentum_first; /* > 0: hand the velocity to the bucketer, not the gradient */
} ready_ctx_t;

static void velocity(float *v, float *g, size_t n, float mom)
{
    for (size_t i = 0; i < n; i++)
        g[i] = v[i] = mom * v[i] + g[i];
}

static int layer_ready(int layer, void *arg)
{
    ready_ctx_t *c = arg;
    if (c->momentum_first > 0.0f) {
        train_layer_t *L = &c->m->l[layer];
        velocity(L->vw, L->gw, (size_t)L->in * L->out, c->momentum_first);
        velocity(L->vb, L->gb, (size_t)L->out, c->momentum_first);
    }
    if ((c->st = gcoll_bucketer_ready(c->b, c->id_b[layer])) != GCOLL_OK ||
        (c->st = gcoll_bucketer_ready(c->b, c->id_w[layer])) != GCOLL_OK)
        return -1;
    return 0;
}

/* One run of train_run: what it decides before the first step, and what it holds. */
typedef struct {
    const train_opts_t *o;
    const train_data_t *d;
    gcoll_comm_t *comm;
    FILE *out; /* rank 0's, else NULL */
    int rank, size;
    size_t ntrain, ntest, global, steps; /* steps per epoch */
    const char *policy, *dgc_rule;
    char rule[512]; /* dgc_rule's text */
    float momentum;
    int dgc_default; /* momentum 0 on DGC's tensors */
    int rk_default;  /* momentum 0 on random-k's tensors with momentum= */
    train_work_t w;
    gcoll_bucketer_config_t bc;
    gcoll_bucketer_t *b;
    ready_ctx_t rctx;
    float mom[2 * TRAIN_MAX_LAYERS]; /* the optimizer's momentum per tensor */
} dp_run_t;

/* The run's sizes, layer policy and momentum; -1 after printing why. */
static int dp_plan(dp_run_t *r)
{
    const train_opts_t *o = r->o;
    const train_data_t *d = r->d;
    r->ntrain = o->limit && o->limit < d->train.n ? o->limit : d->train.n;
    r->ntest = o->test_limit && o->test_limit < d->test.n ? o->test_limit : d->test.n;
    r->global = (size_t)o->batch * (size_t)r->size;
    if (o->batch < 1 || r->global > r->ntrain) {
        fprintf(stderr,
                "gcoll-train: rank %d: a global batch of %zu (%d per rank x %d ranks) needs at "
                "least that many training examples, have %zu\n",
                r->rank, r->global, o->batch, r->size, r->ntrain);
        return -1;
    }
    if (o->nsizes < 2 || o->sizes[o->nsizes - 1] != TRAIN_CLASSES) {
        fprintf(stderr, "gcoll-train: rank %d: the last layer must have %d outputs\n", r->rank,
                TRAIN_CLASSES);
        return -1;
    }
    r->steps = r->ntrain / r->global;
    r->policy = o->policy && *o->policy ? o->policy : NULL;
    r->dgc_rule = r->policy ? NULL : train_dgc_layer_rule(o->compressor, r->rule, sizeof(r->rule));
    if (r->dgc_rule)
        r->policy = r->dgc_rule;
    /* DGC's tensors correct momentum inside the codec, so by default the optimizer adds
     * none to them (and 0.9 to the others, as the authors' implementation leaves tensors it
     * does not compress to the usual momentum SGD); an explicit --momentum is for all */
    r->momentum = o->momentum >= 0.0f ? o->momentum : 0.9f;
    return 0;
}

/* The bucketer, its tensors and the optimizer's momentum per tensor; -1 after saying why. */
static int dp_bucketer(dp_run_t *r)
{
    const train_opts_t *o = r->o;
    train_work_t *w = &r->w;
    /* One bucket per tensor by default (bucket_bytes 1): each layer's reduction starts as
     * soon as backward has produced it, and each tensor gets its own codec state (DGC
     * selects per layer). Registered in backward order, bias before weight within a layer,
     * as DDP does (reversed parameters()). */
    r->bc = (gcoll_bucketer_config_t){
        .bucket_bytes = o->bucket_bytes,
        .op = GCOLL_AVG,
        .policy = r->policy,
        .default_spec = o->compressor,
        .accumulate_steps = 1,
        /* the DGC paper warms up over 4 of 90 epochs; 10% of a short run here */
        .warmup_steps = (uint64_t)(o->warmup_frac * (double)r->steps * o->epochs + 0.5),
    };
    gcoll_status_t st = gcoll_bucketer_create(r->comm, &r->bc, &r->b);
    if (st != GCOLL_OK) {
        train_mode_fail(r->comm, "bucketer", st);
        return -1;
    }
    r->rctx = (ready_ctx_t){
        .b = r->b,
        .m = &w->m,
        .momentum_first = train_momentum_first(o->compressor, r->policy) ? r->momentum : 0.0f};
    for (int l = w->m.nl - 1; l >= 0; l--) {
        char name[32];
        snprintf(name, sizeof(name), "fc%d.bias", l + 1);
        st = gcoll_bucketer_add_tensor(r->b, name, w->m.l[l].gb, (size_t)w->m.l[l].out,
                                       GCOLL_FLOAT32, NULL, &r->rctx.id_b[l]);
        if (st == GCOLL_OK) {
            snprintf(name, sizeof(name), "fc%d.weight", l + 1);
            st = gcoll_bucketer_add_tensor(r->b, name, w->m.l[l].gw,
                                           (size_t)w->m.l[l].in * w->m.l[l].out, GCOLL_FLOAT32,
                                           NULL, &r->rctx.id_w[l]);
        }
        if (st != GCOLL_OK) {
            train_mode_fail(r->comm, "bucketer registration", st);
            return -1;
        }
    }
    r->dgc_default = o->momentum < 0.0f && train_uses_dgc(o->compressor, r->policy);
    for (int l = 0; l < w->m.nl; l++) {
        for (int t = 0; t < 2; t++) {
            const char *spec =
                gcoll_bucketer_tensor_spec(r->b, t ? r->rctx.id_b[l] : r->rctx.id_w[l]);
            /* random-k with momentum= takes the optimizer's momentum, as DGC does */
            int rk = o->momentum < 0.0f && !strstr(spec, "dgc") && train_codec_momentum(spec);
            r->rk_default |= rk;
            r->mom[2 * l + t] = r->rctx.momentum_first > 0.0f           ? 0.0f
                                : r->dgc_default && strstr(spec, "dgc") ? 0.0f
                                : rk                                    ? 0.0f
                                                                        : r->momentum;
        }
    }
    return 0;
}

/* Rank 0's header: the model, the run's settings, each tensor's spec, the table's head. */
static void dp_header(const dp_run_t *r)
{
    const train_opts_t *o = r->o;
    FILE *out = r->out;
    const char *c = o->csv ? "# " : "";
    train_print_model(out, c, r->comm, &r->w);
    char buckets[64];
    if (o->bucket_bytes == 1)
        snprintf(buckets, sizeof(buckets), "one bucket per tensor");
    else if (o->bucket_bytes == 0)
        snprintf(buckets, sizeof(buckets), "buckets sized by GCOLL_BUCKET_BYTES");
    else
        snprintf(buckets, sizeof(buckets), "buckets of %zu bytes", o->bucket_bytes);
    fprintf(out,
            "%scompressor %s, policy %s%s, %s; batch %d per rank (%zu "
            "global), lr %g%s%s, momentum %g%s; %zu steps per epoch on %zu examples, %zu test; "
            "seed %llu\n",
            c, o->compressor, r->policy ? r->policy : "none",
            r->dgc_rule ? " (DGC's layer rule)" : "", buckets, o->batch, r->global, (double)o->lr,
            " ", train_lr_schedule_name(o->lr_schedule), (double)r->momentum,
            r->dgc_default  ? " (0 on DGC's tensors: DGC corrects momentum itself)"
            : r->rk_default ? " (0 on random-k's tensors: their codec takes the momentum, "
                              "momentum= in the spec)"
            : r->rctx.momentum_first > 0.0f ? " (before compression: error feedback)"
                                            : "",
            r->steps, r->ntrain, r->ntest, (unsigned long long)o->seed);
    fprintf(out, "%stensor specs (warm-up of sparsifiers: %llu steps):", c,
            (unsigned long long)r->bc.warmup_steps);
    for (int l = r->w.m.nl - 1; l >= 0; l--)
        fprintf(out, "%s fc%d.bias=%s; fc%d.weight=%s", l == r->w.m.nl - 1 ? "" : ";", l + 1,
                gcoll_bucketer_tensor_spec(r->b, r->rctx.id_b[l]), l + 1,
                gcoll_bucketer_tensor_spec(r->b, r->rctx.id_w[l]));
    fprintf(out, "\n");
    if (o->csv)
        fprintf(out, "epoch,train_loss,test_loss,test_acc,wire_bytes,raw_bytes,seconds,"
                     "wait_seconds\n");
    else
        fprintf(out, "%5s %10s %9s %8s %10s %10s %8s %7s %6s\n", "epoch", "train_loss", "test_loss",
                "test_acc", "r0_wire_MB", "r0_raw_MB", "wire/raw", "time_s", "wait_s");
    fflush(out);
}

/* Epoch e: every step, then the test set and the epoch's line; -1 after saying why. */
static int dp_epoch(dp_run_t *r, int e, train_result_t *res)
{
    const train_opts_t *o = r->o;
    const train_data_t *d = r->d;
    gcoll_comm_t *comm = r->comm;
    train_work_t *w = &r->w;
    const size_t steps = r->steps, global = r->global;
    double t0 = train_now_s(), wait_s = 0.0, loss_sum = 0.0;
    gcoll_counters_t c0;
    gcoll_status_t st;
    gcoll_comm_counters(comm, &c0);
    train_permutation(w->perm, r->ntrain, o->seed, (uint64_t)e);
    for (size_t s = 0; s < steps; s++) {
        /* rank r takes the r-th slice of global batch s: together the ranks cover exactly
         * what one rank with the global batch would */
        train_gather(&d->train, w->perm + s * global + (size_t)r->rank * o->batch, (size_t)o->batch,
                     w->x, w->y);
        double loss = train_mlp_forward(&w->m, w->x, w->y, o->batch, NULL);
        if (!isfinite(loss)) {
            fprintf(stderr,
                    "gcoll-train: rank %d: the loss diverged (%g) at epoch %d step %zu: "
                    "try a smaller --lr\n",
                    r->rank, loss, e + 1, s);
            gcoll_comm_abort(comm);
            return -1;
        }
        loss_sum += loss;
        if (train_mlp_backward(&w->m, w->y, layer_ready, &r->rctx) != 0) {
            train_mode_fail(comm, "gcoll_bucketer_ready", r->rctx.st);
            return -1;
        }
        double tw = train_now_s();
        st = gcoll_bucketer_wait(r->b);
        wait_s += train_now_s() - tw;
        if (st != GCOLL_OK) {
            train_mode_fail(comm, "gcoll_bucketer_wait", st);
            return -1;
        }
        train_mlp_sgd_each(&w->m, train_lr_at(o, (size_t)e * steps + s, (size_t)o->epochs * steps),
                           r->mom);
    }
    if (train_epoch_end(comm, r->out, o->csv, res, e, w, &d->test, r->ntest, loss_sum, &c0,
                        steps * (size_t)r->size, t0, wait_s) != 0)
        return -1;
    train_adapt_report(r->out, o->csv, r->b, e);
    return 0;
}

int train_run(const train_opts_t *o, const train_data_t *d, gcoll_comm_t *comm, FILE *out,
              int keep_params, train_result_t *res)
{
    dp_run_t r = {.o = o, .d = d, .comm = comm};
    r.rank = gcoll_comm_rank(comm);
    r.size = gcoll_comm_size(comm);
    memset(res, 0, sizeof(*res));
    r.out = r.rank == 0 ? out : NULL;
    if (dp_plan(&r) != 0)
        return -1;
    int rc = -1;
    if (train_work_init(&r.w, o, d, r.ntrain, r.rank) != 0)
        return -1;
    if (dp_bucketer(&r) != 0)
        goto out;
    if (r.out)
        dp_header(&r);
    for (int e = 0; e < o->epochs; e++)
        if (dp_epoch(&r, e, res) != 0)
            goto out;
    if (r.out) {
        fprintf(r.out, "final test accuracy: %.4f\n", res->final_acc);
        fflush(r.out);
    }
    if (keep_params && train_keep_params(&r.w.m, r.rank, res) != 0)
        goto out;
    rc = 0;
out:
    gcoll_bucketer_destroy(r.b);
    train_work_free(&r.w);
    return rc;
}
