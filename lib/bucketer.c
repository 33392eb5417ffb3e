/* bucketer.c: overlap of gradient reduction with the backward pass. Tensors registered in
 * backward order are fused into buckets (consecutive tensors with the same codec, up to
 * GCOLL_BUCKET_BYTES, as PyTorch DDP's buckets and Horovod's tensor fusion); a bucket is
 * queued on the progress thread as soon as all its tensors are ready, buckets in the same
 * order on every rank, and there it is gathered, compressed, reduced and scattered back
 * while the caller keeps computing. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt.h"
#include "bucket_plan.h"
#include "comm.h"
#include "compress/compress.h"
#include "compress/kernels.h"
#include "policy.h"
#include "reduce.h"
#include "sparse.h"
#include "util.h"

typedef struct {
    char *name;
    float *grad;
    size_t count;
    gcoll_dtype_t dtype;
    char *spec; /* explicit, or NULL: the policy decides */
    const char *chosen; /* the spec it gets (explicit, a rule's, the default or "none") */
    int rule;           /* the policy rule that chose it; -1 the default, -2 explicit/dtype */
    int bucket; /* its first bucket */
    int seg0, nseg; /* its pieces: segments [seg0, seg0 + nseg), in consecutive buckets */
    int ready;
    double t_ready; /* since the step's first ready(), this rank's clock */
} tensor_t;

/* Elements [toff, toff + n) of tensor t at foff in its bucket's fused buffer. */
typedef struct {
    int t, bucket;
    size_t toff, n, foff;
} seg_t;

typedef struct {
    int seg0, n; /* segments [seg0, seg0 + n) */
    size_t count;
    gcoll_dtype_t dtype;
    char *spec;
    char label[160];
    gcoll_compressor_t *comp;
    gcoll_tensor_state_t *state;
    size_t *ends; /* per-tensor selection: each tensor's end in the fused buffer */
    float *fused;
    float *acc; /* local accumulation across GCOLL_ACCUMULATE_STEPS (NULL when 1) */
    int nready;
    int launched, ran; /* this step: complete here (queued); reduced (progress thread) */
    gcoll_request_t *req;
    gcoll_bucketer_t *b;
    /* adaptation: measured on the progress thread during the bucket's run */
    int adaptive; /* the codec has a density to tune */
    int check_after; /* adaptive, with bandwidth adaptation, and another adaptive bucket
                      * after it: the mid-step check runs after this one */
    gcoll_density_ctl_t ctl;
    gcoll_bw_est_t bw; /* this bucket's own wire rate, for the mid-step check */
    double base_density; /* the spec's */
    double t_launch, run_s, comp_s, bytes, norm2;
    double copy_s; /* gathering into the fused buffer and scattering back */
    double wire_s; /* the collective alone (codec and wire), for the layout's link fit */
    gcoll_status_t st; /* of its run this step */
} bucket_t;

struct gcoll_bucketer {
    gcoll_comm_t *comm;
    gcoll_bucketer_config_t cfg;
    char *policy_text;
    char *default_spec;
    gcoll_policy_t policy;
    pthread_mutex_t lock;
    tensor_t *t;
    int nt, capt;
    bucket_t *bk;
    int nb;
    seg_t *seg;
    int nseg;
    int finalized;
    int autosize;  /* GCOLL_BUCKET_BYTES unset: sized by the model and the link */
    int priority;  /* GCOLL_BUCKET_PRIORITY: queued buckets run first layers first */
    int rebuild;   /* GCOLL_BUCKET_REBUILD: boundaries fixed from measured ready times */
    int rebuilt;
    int comm_steps; /* communicating steps completed (until the rebuild) */
    gcoll_plan_link_t link; /* what the layout assumed of the link */
    gcoll_request_t **tok;  /* priority: one request per launched bucket this step */
    int32_t *neg;           /* priority: the flags the tokens agree on */
    int ntok;
    pthread_cond_t cond;    /* a bucket launched (tokens wait) or reduced (wait_tensor) */
    double t_first_ready;   /* this step's first ready(), seconds; 0: none yet */
    int next_launch;
    long step; /* steps completed */
    int adapt;  /* GCOLL_ADAPT: bit 0 bandwidth, bit 1 phase */
    gcoll_phase_t phase;
    gcoll_bw_est_t bw; /* of all adaptive buckets together */
    double window;     /* the last agreed backward window, seconds */
    double mid_scale;  /* this step's mid-step cut of the densities (1: none) */
    int mid_fired;     /* mid-step checks that found the link slower this step */
    long adapted;      /* communicating steps adapt() has seen */
    char err[512];
};

/* The fixed cost of one bucket's ring allreduce assumed until one is measured: 2(P-1)
 * steps of a TCP round trip's half on a LAN and the progress thread's turn. */
static double default_msg_s(int size) { return size > 1 ? 50e-6 * 2 * (size - 1) + 100e-6 : 0; }

static void bucket_free(bucket_t *k)
{
    gcoll_state_destroy(k->state);
    gcoll_compressor_destroy(k->comp);
    free(k->ends);
    free(k->fused);
    free(k->acc);
    free(k->spec);
}

GCOLL_EXPORT void gcoll_bucketer_destroy(gcoll_bucketer_t *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->ntok; i++)
        gcoll_wait(b->tok[i]);
    for (int i = 0; i < b->nb; i++) {
        if (b->bk[i].req)
            gcoll_wait(b->bk[i].req);
        bucket_free(&b->bk[i]);
    }
    for (int i = 0; i < b->nt; i++) {
        free(b->t[i].name);
        free(b->t[i].spec);
    }
    gcoll_policy_free(&b->policy);
    free(b->policy_text);
    free(b->default_spec);
    free(b->t);
    free(b->bk);
    free(b->seg);
    free(b->tok);
    free(b->neg);
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_create(gcoll_comm_t *comm, const gcoll_bucketer_config_t *cfg,
                                     gcoll_bucketer_t **b_p)
{
    if (!comm || !b_p)
        return GCOLL_ERR_INVALID;
    gcoll_bucketer_t *b = calloc(1, sizeof(*b));
    if (!b)
        return GCOLL_ERR_NOMEM;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    b->comm = comm;
    if (cfg) {
        b->cfg = *cfg;
    } else {
        b->cfg.bucket_bytes = comm->cfg.bucket_bytes;
        b->cfg.op = comm->cfg.bucket_op == 1 ? GCOLL_SUM : GCOLL_AVG;
        b->cfg.policy = comm->cfg.layer_policy;
        b->cfg.default_spec = comm->cfg.compressor;
        b->cfg.accumulate_steps = (int)comm->cfg.accumulate_steps;
    }
    if (b->cfg.bucket_bytes == 0)
        b->cfg.bucket_bytes = comm->cfg.bucket_bytes;
    /* GCOLL_BUCKET_BYTES (or the config's) unset: sized from the model and the link */
    b->autosize = b->cfg.bucket_bytes == 0;
    b->priority = comm->cfg.bucket_priority;
    b->rebuild = comm->cfg.bucket_rebuild;
    b->link.msg_s = default_msg_s(comm->size);
    if (comm->probe_bw > 0 && comm->size > 1) /* a dense ring sends 2(P-1)/P of a bucket */
        b->link.bw = comm->probe_bw * comm->size / (2.0 * (comm->size - 1));
    if (b->cfg.accumulate_steps < 1)
        b->cfg.accumulate_steps = 1;
    b->adapt = comm->cfg.adapt; /* 1 bandwidth, 2 phase, 3 both */
    b->mid_scale = 1;
    gcoll_phase_init(&b->phase, 0.5, 2);
    gcoll_bw_init(&b->bw, (double)comm->cfg.adapt_half_life);
    if (comm->probe_bw > 0) /* GCOLL_PROBE: the first decision need not wait for a rate */
        gcoll_bw_jump(&b->bw, comm->probe_bw, 1.0);
    b->policy_text = strdup(b->cfg.policy ? b->cfg.policy : "");
    b->default_spec = strdup(b->cfg.default_spec && *b->cfg.default_spec ? b->cfg.default_spec
                                                                         : "none");
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!b->policy_text || !b->default_spec)
        goto err;
    st = gcoll_comm_check_args(comm, "gcoll_bucketer_create",
                               b->cfg.op == GCOLL_SUM || b->cfg.op == GCOLL_AVG,
                               "op must be sum or avg");
    if (st != GCOLL_OK)
        goto err;
    char perr[512];
    st = gcoll_policy_parse(b->policy_text, &b->policy, perr, sizeof(perr));
    if (st != GCOLL_OK) {
        gcoll_comm_check_args(comm, "gcoll_bucketer_create", 0, "GCOLL_LAYER_POLICY: %s", perr);
        goto err;
    }
    char cerr[256];
    if (gcoll_compressor_check(b->default_spec, cerr, sizeof(cerr)) != GCOLL_OK) {
        st = gcoll_comm_check_args(comm, "gcoll_bucketer_create", 0, "default compressor: %s",
                                   cerr);
        goto err;
    }
    *b_p = b;
    return GCOLL_OK;
err:
    gcoll_bucketer_destroy(b);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_add_tensor(gcoll_bucketer_t *b, const char *name, float *grad,
                                         size_t count, gcoll_dtype_t dtype,
                                         const char *compressor_spec, int *id_p)
{
    const char *what = "gcoll_bucketer_add_tensor";
    if (!b || !name || !id_p)
        return GCOLL_ERR_INVALID;
    gcoll_comm_t *comm = b->comm;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, !b->finalized,
                                      "'%s' registered after the first ready(): register every "
                                      "tensor once, before training", name));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || grad, "NULL gradient '%s'", name));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, dtype >= GCOLL_FLOAT32 && dtype <= GCOLL_INT64,
                                      "unknown dtype for '%s'", name));
    for (int i = 0; i < b->nt; i++)
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, strcmp(b->t[i].name, name) != 0,
                                          "'%s' is already registered (with %zu elements)", name,
                                          b->t[i].count));
    if (compressor_spec) {
        char cerr[256];
        GCOLL_CHECK(gcoll_comm_check_args(
            comm, what, gcoll_compressor_check(compressor_spec, cerr, sizeof(cerr)) == GCOLL_OK,
            "tensor '%s': %s", name, cerr));
    }
    if (b->nt == b->capt) {
        int cap = b->capt ? 2 * b->capt : 64;
        tensor_t *t = realloc(b->t, (size_t)cap * sizeof(*t));
        if (!t)
            return GCOLL_ERR_NOMEM;
        b->t = t;
        b->capt = cap;
    }
    tensor_t *t = &b->t[b->nt];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    t->spec = compressor_spec ? strdup(compressor_spec) : NULL;
    if (!t->name || (compressor_spec && !t->spec)) {
        free(t->name);
        free(t->spec);
        return GCOLL_ERR_NOMEM;
    }
    t->grad = grad;
    t->count = count;
    t->dtype = dtype;
    *id_p = b->nt++;
    return GCOLL_OK;
}

/* Each tensor's spec: explicit, else by policy, with the first and last layers in forward
 * order those of the last and first tensors registered (backward order). A function of
 * the tensors registered so far. */
static void assign_specs(gcoll_bucketer_t *b)
{
    for (int i = 0; i < b->nt; i++) {
        tensor_t *t = &b->t[i];
        int in_first = gcoll_policy_same_layer(t->name, b->t[b->nt - 1].name);
        int in_last = gcoll_policy_same_layer(t->name, b->t[0].name);
        t->rule = -2;
        t->chosen = t->spec ? t->spec
                            : gcoll_policy_pick(&b->policy, t->name, t->count, in_first, in_last,
                                                b->default_spec, &t->rule);
        /* only float32 gradients are compressed */
        if (t->dtype != GCOLL_FLOAT32) {
            t->chosen = "none";
            t->rule = -2;
        }
    }
}

GCOLL_EXPORT const char *gcoll_bucketer_tensor_spec(gcoll_bucketer_t *b, int id)
{
    if (!b)
        return NULL;
    pthread_mutex_lock(&b->lock);
    const char *spec = NULL;
    if (id >= 0 && id < b->nt) {
        if (!b->finalized)
            assign_specs(b);
        spec = b->t[id].chosen;
    }
    pthread_mutex_unlock(&b->lock);
    return spec;
}

/* Warm-up length for sparsifiers whose spec gives none (gcoll_bucketer_config_t). */
static void default_warmup(gcoll_compressor_t *c, uint64_t steps)
{
    if (steps == 0 || c->k_fixed || (c->warmup_given & GCOLL_WARMUP_STEPS_GIVEN) ||
        !(c->sparsify == GCOLL_SPARSIFY_TOPK || c->sparsify == GCOLL_SPARSIFY_RANDOMK ||
          c->sparsify == GCOLL_SPARSIFY_DGC))
        return;
    c->warmup_steps = steps;
    c->warmup_given |= GCOLL_WARMUP_STEPS_GIVEN;
    gcoll_spec_canon(c);
}

/* The rule the layout follows: GCOLL_BUCKET_BYTES when set (buckets up to that size,
 * tensors whole), else the automatic one for this model on b->link (bucket_plan.h). */
static void layout_rule(const gcoll_bucketer_t *b, gcoll_plan_rule_t *r, int timed)
{
    if (!b->autosize) {
        *r = (gcoll_plan_rule_t){.first = b->cfg.bucket_bytes, .target = b->cfg.bucket_bytes};
        return;
    }
    size_t total = 0;
    for (int i = 0; i < b->nt; i++)
        total += b->t[i].count * gcoll_dtype_size(b->t[i].dtype);
    gcoll_plan_rule_auto(total, &b->link, r);
    if (!timed)
        r->flush_s = 0;
}

/* Cuts the tensors, taken in order (NULL: registration order), into buckets by rule r:
 * b->seg, b->bk (their segments, counts and codec specs) and each tensor's pieces. */
static gcoll_status_t layout(gcoll_bucketer_t *b, const int *order, const gcoll_plan_rule_t *r,
                             const double *ready)
{
    gcoll_plan_tensor_t *pt = calloc((size_t)b->nt + 1, sizeof(*pt));
    if (!pt)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < b->nt; i++) {
        tensor_t *t = &b->t[i];
        pt[i] = (gcoll_plan_tensor_t){.count = t->count, .esz = gcoll_dtype_size(t->dtype),
                                      .group = i, .ready = ready ? ready[i] : 0};
        for (int j = 0; j < i; j++) /* one group per (codec, dtype) */
            if (b->t[j].dtype == t->dtype && strcmp(b->t[j].chosen, t->chosen) == 0) {
                pt[i].group = pt[j].group;
                break;
            }
    }
    gcoll_plan_seg_t *ps = NULL;
    int ns = gcoll_plan_cut(pt, order, b->nt, r, &ps);
    free(pt);
    if (ns < 0)
        return GCOLL_ERR_NOMEM;
    b->nb = ns ? ps[ns - 1].bucket + 1 : 0;
    b->nseg = ns;
    b->seg = calloc((size_t)ns + 1, sizeof(seg_t));
    b->bk = calloc((size_t)b->nb + 1, sizeof(bucket_t));
    b->tok = calloc((size_t)b->nb + 1, sizeof(*b->tok));
    b->neg = calloc((size_t)b->nb + 1, sizeof(*b->neg));
    if (!b->seg || !b->bk || !b->tok || !b->neg) {
        free(ps);
        return GCOLL_ERR_NOMEM;
    }
    for (int s = 0; s < ns; s++) {
        bucket_t *k = &b->bk[ps[s].bucket];
        tensor_t *t = &b->t[ps[s].t];
        if (k->n++ == 0) {
            k->seg0 = s;
            k->dtype = t->dtype;
            k->b = b;
            if (!(k->spec = strdup(t->chosen))) {
                free(ps);
                return GCOLL_ERR_NOMEM;
            }
        }
        b->seg[s] = (seg_t){.t = ps[s].t, .bucket = ps[s].bucket, .toff = ps[s].toff, .n = ps[s].n, .foff = k->count};
        k->count += ps[s].n;
        if (ps[s].toff == 0) {
            t->seg0 = s;
            t->bucket = ps[s].bucket;
        }
        t->nseg++;
    }
    free(ps);
    return GCOLL_OK;
}

/* A bucket's fused buffer, codec and state. */
static gcoll_status_t bucket_setup(gcoll_bucketer_t *b, int j)
{
    bucket_t *k = &b->bk[j];
    const seg_t *s0 = &b->seg[k->seg0], *s1 = &b->seg[k->seg0 + k->n - 1];
    snprintf(k->label, sizeof(k->label), "gcoll_bucketer bucket %d [%s .. %s]", j,
             b->t[s0->t].name, b->t[s1->t].name);
    size_t esz = gcoll_dtype_size(k->dtype);
    k->fused = malloc(k->count * esz + 1);
    if (!k->fused || (b->cfg.accumulate_steps > 1 && !(k->acc = calloc(k->count + 1, esz))))
        return GCOLL_ERR_NOMEM;
    if (k->dtype != GCOLL_FLOAT32)
        return GCOLL_OK;
    GCOLL_CHECK(gcoll_compressor_create(k->spec, &k->comp));
    default_warmup(k->comp, b->cfg.warmup_steps);
    if (b->comm->cfg.layer_select && k->n > 1) {
        /* top-k and DGC select in each tensor (piece) of the bucket (select.c) */
        if (!(k->ends = malloc((size_t)k->n * sizeof(size_t))))
            return GCOLL_ERR_NOMEM;
        for (int i = 0; i < k->n; i++)
            k->ends[i] = b->seg[k->seg0 + i].foff + b->seg[k->seg0 + i].n;
        k->comp->layer_end = k->ends;
        k->comp->nlayers = (size_t)k->n;
    }
    GCOLL_CHECK(gcoll_state_create(k->comp, k->count, &k->state));
    k->adaptive = b->adapt && k->comp->density > 0 && k->comp->k_fixed == 0;
    /* the bandwidth estimate takes the run less compression as wire time, which
     * the streamed top-k hides under compression: adaptive buckets do not stream */
    k->state->no_stream = k->adaptive && (b->adapt & 1);
    if (k->adaptive) {
        const gcoll_config_t *cf = &b->comm->cfg;
        k->base_density = k->comp->density;
        gcoll_ctl_init(&k->ctl, cf->density_min, cf->density_max, k->comp->density);
        gcoll_bw_init(&k->bw, (double)cf->adapt_half_life);
    }
    return GCOLL_OK;
}

static void log_layout(const gcoll_bucketer_t *b, const char *why)
{
    for (int s = 0; s < b->nseg && GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_COLL); s++) {
        const seg_t *g = &b->seg[s];
        const tensor_t *t = &b->t[g->t];
        char rule[32];
        if (t->rule >= 0)
            snprintf(rule, sizeof(rule), "policy rule %d", t->rule + 1);
        int bk = g->bucket;
        GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: tensor %d '%s' (layer '%.*s', elements "
                   "%zu..%zu of %zu) -> bucket %d, %s (%s)", g->t, t->name,
                   (int)gcoll_policy_layer_len(t->name), t->name, g->toff, g->toff + g->n,
                   t->count, bk, b->bk[bk].spec,
                   t->rule >= 0 ? rule : t->rule == -1 ? "default" : t->spec ? "explicit"
                                                                            : "not float32");
    }
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: %d tensors in %d buckets (%s; link %.1f MB/s, "
               "%.0f us per bucket assumed)", b->nt, b->nb, why, b->link.bw / 1e6,
               b->link.msg_s * 1e6);
}

/* The mid-step checks run after an adaptive bucket with another adaptive one after it. */
static void mark_checks(gcoll_bucketer_t *b)
{
    for (int j = 0, later = 0; (b->adapt & 1) && j < b->nb; j++) {
        bucket_t *k = &b->bk[b->nb - 1 - j];
        k->check_after = k->adaptive && later;
        later |= k->adaptive;
    }
}

/* Assigns codecs by policy and cuts the tensors into buckets. */
static gcoll_status_t finalize(gcoll_bucketer_t *b)
{
    assign_specs(b);
    gcoll_plan_rule_t r;
    layout_rule(b, &r, 0);
    GCOLL_CHECK(layout(b, NULL, &r, NULL));
    for (int j = 0; j < b->nb; j++)
        GCOLL_CHECK(bucket_setup(b, j));
    mark_checks(b);
    char why[96];
    snprintf(why, sizeof(why), b->autosize ? "automatic, first %zu, then %zu bytes"
                                           : "GCOLL_BUCKET_BYTES %zu bytes", r.first, r.target);
    log_layout(b, why);
    b->finalized = 1;
    return GCOLL_OK;
}

/* Adds src into dst (n elements of dtype) for local accumulation. */
static void accumulate(void *dst, const void *src, size_t n, gcoll_dtype_t dtype)
{
    gcoll_reduce(dst, src, n, dtype, GCOLL_SUM);
}

/* Swaps a bucket's compressor for a copy at another density; the residuals stay. */
static gcoll_status_t set_density(bucket_t *k, double d)
{
    gcoll_compressor_t *c = malloc(sizeof(*c));
    if (!c)
        return GCOLL_ERR_NOMEM;
    *c = *k->comp;
    c->density = d;
    gcoll_spec_canon(c);
    k->state->c = c;
    if (k->state->server)
        k->state->server->c = c;
    gcoll_compressor_destroy(k->comp);
    k->comp = c;
    return GCOLL_OK;
}

/* Mid-step, after an adaptive bucket (on the progress thread, where every rank runs the
 * buckets in the same order): the ranks agree on its wire time (the shortest: the rank that
 * waited least for the others) and bytes with one tiny allreduce, and when the link turned
 * out much slower than the step was planned for, the buckets not yet started in this step
 * run at a density cut in proportion; the next decision at the end of the step restores the
 * controller's density. The same agreed numbers on every rank: the same cut everywhere. */
#define MIDSTEP_SUB 0xf0000000u /* message tags far above the bucket's own collective's */
static gcoll_status_t midstep_check(gcoll_comm_t *comm, bucket_t *k)
{
    gcoll_bucketer_t *b = k->b;
    double x[2] = {-(k->run_s - k->comp_s), k->bytes};
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, 2, GCOLL_FLOAT64, GCOLL_MAX, 0);
    GCOLL_CHECK(gcoll_ring_allreduce_at(comm, x, 2, GCOLL_FLOAT64, GCOLL_MAX, sig, MIDSTEP_SUB));
    /* against this bucket's own rate in the steps before: buckets differ (the first ones
     * share the CPU with the busiest part of backward) */
    if (k->bw.n < 2)
        return GCOLL_OK; /* one sample is not a history to compare with */
    double s = gcoll_midstep_scale(k->bw.bw, x[1], -x[0], b->window, b->mid_scale);
    b->mid_fired += s < 1;
    if (s < 1 || b->mid_scale < 1)
        GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT, "step %ld %s: %.0f bytes in %.1f ms of wire, %.1f MB/s "
                    "before: later buckets at %.3g of their density", b->step, k->label, x[1],
                    -x[0] * 1e3, k->bw.bw / 1e6, s);
    b->mid_scale = s;
    return GCOLL_OK;
}

static double norm2(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

/* Debug trace of what compression does to each tensor of a bucket this step (before the
 * reduced gradient is scattered back, so t->grad still holds this rank's input): the
 * density in force, the elements the reduced gradient updates, and the norms of the input,
 * of what stays behind (the residual; DGC's accumulation) and of DGC's velocity.
 * bench/dgc-trace.sh plots it. */
static void trace_tensors(const bucket_t *k, uint64_t step)
{
    const gcoll_bucketer_t *b = k->b;
    const float *e = gcoll_state_residual(k->state), *u = k->state->u;
    for (int i = k->seg0; i < k->seg0 + k->n; i++) {
        const seg_t *g = &b->seg[i];
        const tensor_t *t = &b->t[g->t];
        const float *out = k->fused + g->foff;
        size_t nz = 0;
        for (size_t j = 0; j < g->n; j++)
            nz += out[j] != 0;
        GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS, "trace step %llu tensor '%s' n %zu density %.6g "
                    "updated %zu grad %.6g residual %.6g velocity %.6g",
                    (unsigned long long)step, t->name, g->n,
                    gcoll_codec_density(k->comp, step), nz, norm2(t->grad + g->toff, g->n),
                    e ? norm2(e + g->foff, g->n) : 0.0, u ? norm2(u + g->foff, g->n) : 0.0);
    }
}

/* On the progress thread: gather, reduce (compressed for float32), scatter back. */
static gcoll_status_t run_one(gcoll_comm_t *comm, bucket_t *k)
{
    gcoll_bucketer_t *b = k->b;
    size_t esz = gcoll_dtype_size(k->dtype);
    uint8_t *fused = (uint8_t *)k->fused;
    double tc = (double)gcoll_time_ns() * 1e-9;
    /* float32 without local accumulation: look for NaN/Inf while each block of the copy
     * is in cache, instead of a separate pass over the fused buffer in the encoder */
    const int scan = k->dtype == GCOLL_FLOAT32 && !k->acc;
    for (int i = k->seg0; i < k->seg0 + k->n; i++) {
        const seg_t *g = &b->seg[i];
        const tensor_t *t = &b->t[g->t];
        const uint8_t *src8 = (const uint8_t *)t->grad + g->toff * esz;
        if (!scan) {
            memcpy(fused + g->foff * esz, src8, g->n * esz);
            continue;
        }
        float *dst = k->fused + g->foff;
        const float *src = (const float *)src8;
        for (size_t o = 0; o < g->n; o += 16384) {
            size_t n = GCOLL_MIN(g->n - o, (size_t)16384);
            memcpy(dst + o, src + o, n * sizeof(float));
            size_t bad = gcoll_kernels()->first_bad(dst + o, n);
            if (bad < n) {
                gcoll_comm_set_error(comm, "%s: tensor '%s' element %zu is NaN or infinite",
                                     k->label, t->name, g->toff + o + bad);
                return GCOLL_ERR_INVALID;
            }
        }
    }
    if (k->acc) {
        accumulate(fused, k->acc, k->count, k->dtype);
        memset(k->acc, 0, k->count * esz);
    }
    gcoll_status_t st;
    double t0 = (double)gcoll_time_ns() * 1e-9;
    k->copy_s = t0 - tc;
    uint64_t sent0 = comm->counters.bytes_sent, comp0 = comm->counters.ns_compress;
    if (k->adaptive && (b->adapt & 2)) {
        double n2 = 0;
        for (size_t i = 0; i < k->count; i++)
            n2 += (double)k->fused[i] * k->fused[i];
        k->norm2 = n2;
    }
    if (k->adaptive && b->mid_scale < 1) {
        double d = fmax(k->ctl.dmin, k->ctl.density * b->mid_scale);
        if (d != k->comp->density && (st = set_density(k, d)) != GCOLL_OK)
            return st;
    }
    uint64_t cstep = k->state ? k->state->step : 0; /* the codec's step of this run */
    uint64_t w0 = gcoll_time_ns();
    if (k->dtype == GCOLL_FLOAT32) {
        k->state->input_checked = scan;
        st = gcoll_compressed_run(comm, k->state, k->fused, k->fused, k->count, b->cfg.op, 0);
        k->state->input_checked = 0;
        k->run_s = (double)gcoll_time_ns() * 1e-9 - t0;
        k->comp_s = (double)(comm->counters.ns_compress - comp0) * 1e-9;
        k->bytes = (double)(comm->counters.bytes_sent - sent0);
    } else {
        uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, k->count, k->dtype, b->cfg.op, 0);
        st = gcoll_ring_allreduce(comm, fused, k->count, k->dtype, b->cfg.op, sig);
        if (st == GCOLL_OK)
            gcoll_reduce_finish(fused, k->count, k->dtype, b->cfg.op, comm->size);
    }
    k->wire_s = (double)(gcoll_time_ns() - w0) * 1e-9;
    if (st == GCOLL_OK && k->check_after)
        st = midstep_check(comm, k);
    if (st != GCOLL_OK)
        return st;
    if (k->dtype == GCOLL_FLOAT32 && GCOLL_LOG_ON(GCOLL_LOG_DEBUG, GCOLL_SUBSYS_COMPRESS))
        trace_tensors(k, cstep);
    double t1 = (double)gcoll_time_ns() * 1e-9;
    for (int i = k->seg0; i < k->seg0 + k->n; i++) {
        const seg_t *g = &b->seg[i];
        memcpy((uint8_t *)b->t[g->t].grad + g->toff * esz, fused + g->foff * esz, g->n * esz);
    }
    k->copy_s += (double)gcoll_time_ns() * 1e-9 - t1;
    /* where the time of a step goes: queueing behind earlier buckets, then the run */
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "bucketer: step %llu %s: queued %.1f ms, ran %.1f ms "
                "(compression %.1f ms, %.0f bytes sent)", (unsigned long long)b->step, k->label,
                (t0 - k->t_launch) * 1e3, k->run_s * 1e3, k->comp_s * 1e3, k->bytes);
    return GCOLL_OK;
}

/* Bucket k reduced (or failed) this step: wakes gcoll_bucketer_wait_tensor. */
static void bucket_done(bucket_t *k, gcoll_status_t st)
{
    gcoll_bucketer_t *b = k->b;
    pthread_mutex_lock(&b->lock);
    k->st = st;
    k->ran = 1;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* On the progress thread, buckets in launch order (GCOLL_BUCKET_PRIORITY=0). */
static gcoll_status_t run_bucket(gcoll_comm_t *comm, gcoll_request_t *req)
{
    bucket_t *k = req->a.ext;
    gcoll_status_t st = run_one(comm, k);
    bucket_done(k, st);
    return st;
}

/* Priorities (ByteScheduler, Peng et al. SOSP'19, with Horovod's negotiation of what is
 * ready): each launched bucket queues a token; a token runs the highest-priority bucket
 * that every rank has launched and none has run -- the one latest in backward order, the
 * first layers the next forward pass needs first. The ranks agree on the candidates with a
 * tiny MIN allreduce of launched flags, so all run the same bucket even when their ready()
 * timings differ; the last bucket of a step needs no agreement. */
#define NEGOTIATE_SUB 0xe0000000u /* tags apart from the bucket's and the mid-step check's */
static gcoll_status_t run_token(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_bucketer_t *b = req->a.ext;
    int32_t *f = b->neg;
    uint64_t give_up = gcoll_time_ms() + (uint64_t)comm->cfg.timeout_ms;
    for (unsigned round = 0;; round++) {
        int left = 0, only = -1, pick = -1;
        pthread_mutex_lock(&b->lock);
        for (int j = 0; j < b->nb; j++) {
            f[j] = b->bk[j].launched && !b->bk[j].ran;
            if (!b->bk[j].ran) {
                left++;
                only = j;
            }
        }
        pthread_mutex_unlock(&b->lock);
        if (left == 1) {
            pick = only;
        } else {
            uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, (size_t)b->nb, GCOLL_INT32,
                                          GCOLL_MIN, 0);
            GCOLL_CHECK(gcoll_ring_allreduce_at(comm, f, (size_t)b->nb, GCOLL_INT32, GCOLL_MIN,
                                                sig, NEGOTIATE_SUB + ((round & 0xfffu) << 16)));
            for (int j = b->nb - 1; j >= 0 && pick < 0; j--)
                if (f[j])
                    pick = j;
        }
        if (pick >= 0) {
            gcoll_status_t st = run_one(comm, &b->bk[pick]);
            bucket_done(&b->bk[pick], st);
            return st;
        }
        /* nothing launched on every rank yet: wait for a launch here (briefly: another
         * rank's launch is seen only through the next round) */
        if (gcoll_time_ms() > give_up) {
            gcoll_comm_set_error(comm, "gcoll_bucketer: no bucket launched on every rank within "
                                       "GCOLL_TIMEOUT_MS (a tensor not marked ready?)");
            return GCOLL_ERR_TIMEOUT;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&b->lock);
        pthread_cond_timedwait(&b->cond, &b->lock, &ts);
        pthread_mutex_unlock(&b->lock);
    }
}

/* Is this a step that communicates (the last of an accumulation cycle)? */
static int communicating(const gcoll_bucketer_t *b)
{
    return (b->step + 1) % b->cfg.accumulate_steps == 0;
}

static gcoll_status_t submit(gcoll_bucketer_t *b, const char *label, gcoll_run_fn_t fn,
                             size_t count, gcoll_dtype_t dtype, void *ext,
                             gcoll_request_t **req_p)
{
    gcoll_args_t a = {.count = count, .dtype = dtype, .op = b->cfg.op, .ext = ext};
    gcoll_request_t *req = gcoll_request_new(b->comm, label, fn, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    return gcoll_comm_submit(b->comm, req, req_p);
}

/* Queues complete buckets. In launch order, each once its predecessors are queued (the same
 * order everywhere); with priorities, each as soon as it is complete, as a token. */
static gcoll_status_t launch_ready(gcoll_bucketer_t *b, const tensor_t *t)
{
    if (b->priority) {
        for (int j = t->bucket; j < t->bucket + t->nseg; j++) {
            bucket_t *k = &b->bk[j];
            if (k->nready != k->n || k->launched)
                continue;
            k->launched = 1;
            k->t_launch = (double)gcoll_time_ns() * 1e-9;
            GCOLL_CHECK(submit(b, "gcoll_bucketer bucket (by priority)", run_token, 0,
                               GCOLL_INT32, b, &b->tok[b->ntok]));
            b->ntok++;
            pthread_cond_broadcast(&b->cond);
        }
        return GCOLL_OK;
    }
    while (b->next_launch < b->nb && b->bk[b->next_launch].nready == b->bk[b->next_launch].n) {
        bucket_t *k = &b->bk[b->next_launch];
        k->t_launch = (double)gcoll_time_ns() * 1e-9;
        k->launched = 1;
        GCOLL_CHECK(submit(b, k->label, run_bucket, k->count, k->dtype, k, &k->req));
        b->next_launch++;
    }
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_ready(gcoll_bucketer_t *b, int id)
{
    if (!b)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock(&b->lock);
    gcoll_status_t st = GCOLL_OK;
    if (!b->finalized && (st = finalize(b)) != GCOLL_OK)
        goto out;
    st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_ready", id >= 0 && id < b->nt,
                               "no tensor %d (%d registered)", id, b->nt);
    if (st != GCOLL_OK)
        goto out;
    tensor_t *t = &b->t[id];
    st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_ready", !t->ready,
                               "tensor '%s' marked ready twice in one step", t->name);
    if (st != GCOLL_OK)
        goto out;
    t->ready = 1;
    double now = (double)gcoll_time_ns() * 1e-9;
    if (b->t_first_ready == 0)
        b->t_first_ready = now;
    t->t_ready = now - b->t_first_ready;
    size_t esz = gcoll_dtype_size(t->dtype);
    for (int s = t->seg0; s < t->seg0 + t->nseg; s++) {
        const seg_t *g = &b->seg[s];
        bucket_t *k = &b->bk[g->bucket];
        if (!communicating(b)) /* accumulate locally; nothing travels this step */
            accumulate((uint8_t *)k->acc + g->foff * esz, (const uint8_t *)t->grad + g->toff * esz,
                       g->n, t->dtype);
        k->nready++;
    }
    if (communicating(b))
        st = launch_ready(b, t);
out:
    pthread_mutex_unlock(&b->lock);
    return st;
}

/* After a communicating step: agree on the measurements (the slowest rank's times and
 * launch offsets, the shortest wire times and window, the gradient norms), then let each
 * adaptive bucket's controller pick its density. Every rank runs the same controller on the
 * same numbers, so all decide alike. */
static gcoll_status_t adapt(gcoll_bucketer_t *b, double t_end)
{
    enum { NV = 7 }; /* per bucket: run, compression, bytes, squared norm, launch offset,
                      * gather and scatter copies, wire (negated: the shortest) */
    int na = 0;
    double first = 1e300;
    for (int j = 0; j < b->nb; j++) {
        na += b->bk[j].adaptive;
        if (b->bk[j].t_launch > 0)
            first = b->bk[j].t_launch < first ? b->bk[j].t_launch : first;
    }
    if (na == 0)
        return GCOLL_OK;
    double *v = calloc((size_t)b->nb * (NV + 3) + 1, sizeof(double));
    if (!v)
        return GCOLL_ERR_NOMEM;
    double *off = v + (size_t)b->nb * NV + 1, *fixed = off + b->nb, *wfull = fixed + b->nb;
    double window = t_end - first, norm2 = 0;
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        double *x = v + (size_t)j * NV;
        x[0] = k->run_s;
        x[1] = k->comp_s;
        x[2] = k->bytes;
        x[3] = k->adaptive ? k->norm2 : 0;
        x[4] = k->t_launch - first;
        x[5] = k->copy_s;
        x[6] = -(k->run_s - k->comp_s);
    }
    v[(size_t)b->nb * NV] = -window; /* MAX of the negation: the shortest window */
    gcoll_status_t st = gcoll_allreduce(b->comm, v, v, (size_t)b->nb * NV + 1, GCOLL_FLOAT64,
                                        GCOLL_MAX);
    if (st == GCOLL_OK) {
        window = -v[(size_t)b->nb * NV];
        b->window = window;
        double comp_all = 0, wire_all = 0, bytes_all = 0;
        for (int j = 0; j < b->nb; j++) {
            const double *x = v + (size_t)j * NV;
            if (!b->bk[j].adaptive)
                continue;
            norm2 += x[3];
            if (b->adapted == 0)
                continue; /* the first step warms up (page faults, connections): not a rate */
            /* two mid-step checks of this step saw the link slow down: the step's own
             * samples below half the estimates are the new regime, not a stall */
            if (b->mid_fired >= 2 && x[2] / fmax(-x[6], 1e-9) < b->bk[j].bw.bw / 2)
                gcoll_bw_jump(&b->bk[j].bw, x[2], -x[6]);
            else
                gcoll_bw_update(&b->bk[j].bw, x[2], -x[6]);
            comp_all += x[1];
            wire_all += -x[6] > 1e-6 ? -x[6] : 1e-6;
            bytes_all += x[2];
        }
        int critical = (b->adapt & 2) ? gcoll_phase_update(&b->phase, sqrt(norm2)) : 0;
        long jumps = b->bw.jumps;
        double bw_before = b->bw.bw;
        int mid_jump = 0; /* the mid-step checks saw the link slow down */
        if (b->adapted++ > 0) {
            if (b->mid_fired >= 2 && bytes_all / wire_all < b->bw.bw / 2) {
                gcoll_bw_jump(&b->bw, bytes_all, wire_all);
                mid_jump = 1;
            } else {
                gcoll_bw_update(&b->bw, bytes_all, wire_all);
            }
        }
        /* The buckets share one progress thread and run in launch order: bucket j starts
         * at its launch or when the one before it ends, then compresses and sends. What
         * must end by the end of backward is the last of them; the density that makes
         * it (the same for every adaptive bucket) accounts for buckets launched late,
         * whose communication would otherwise be left after backward. */
        double dmin = 1, dmax = 0;
        for (int j = 0; j < b->nb; j++) {
            const double *x = v + (size_t)j * NV;
            bucket_t *k = &b->bk[j];
            off[j] = x[4];
            if (k->adaptive && b->bw.bw > 0) {
                gcoll_bucket_cost(x[0], -x[6], x[1], x[5], x[2], k->comp->density, b->bw.bw,
                                  &fixed[j], &wfull[j]);
                dmin = fmin(dmin, k->ctl.dmin);
                dmax = fmax(dmax, k->ctl.dmax);
            } else {
                fixed[j] = x[0] + x[5];
                wfull[j] = 0;
            }
        }
        double target = dmax >= dmin ? gcoll_fit_density(b->nb, off, fixed, wfull, window,
                                                         dmin, dmax)
                                     : 0;
        for (int j = 0; j < b->nb && st == GCOLL_OK; j++) {
            bucket_t *k = &b->bk[j];
            if (!k->adaptive)
                continue;
            double old = k->ctl.density;
            /* the estimate jumped: the fits from before say nothing of the new regime. A
             * link the mid-step checks saw slow down acts at once, without the hold;
             * other jumps keep it: a faster link (a run of small transfers that passed
             * at the burst rate looks like one), and a slower estimate without that
             * evidence (GCOLL_PROBE's link rate giving way to the buckets' own, which
             * cut 0.1 to 0.041 at 10 Gbit/s in one run) cuts after two fits in a row */
            if (b->bw.jumps != jumps) {
                k->ctl.nfit = 0;
                if (mid_jump && b->bw.bw < bw_before) {
                    k->ctl.held = k->ctl.min_hold;
                    k->ctl.slower = 1;
                }
            }
            /* Only GCOLL_PROBE's estimate allows a fit after the first step, whose
             * compression and copies ran through first-touch page faults: it may raise
             * the density, never cut it (measured: a fit of 0.006 from 0.01 at 10 Gbit/s);
             * a fit that would cut is not one (not kept among the fits a rise waits for) */
            int warmup_cut = b->adapted == 1 && target > 0 && target < k->ctl.density &&
                             !critical;
            double d;
            if (!(b->adapt & 1)) { /* phase only: the spec's, or the maximum when critical */
                d = critical ? k->ctl.dmax : k->base_density;
            } else if (warmup_cut) {
                k->ctl.held++;
                d = k->ctl.density;
            } else if (target > 0) {
                d = gcoll_ctl_apply(&k->ctl, target, critical);
            } else {
                d = gcoll_ctl_step(&k->ctl, window, comp_all, 0, 0, critical);
            }
            GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                        "bucket %d: launched at +%.1f ms of a %.1f ms window; all adaptive "
                        "buckets: wire %.1f ms, compress %.1f ms, %.0f bytes, bandwidth "
                        "%.1f MB/s; fitted density %g; critical %d: density %g -> %g; this "
                        "bucket: %.0f bytes, wire %.1f ms, compress %.1f ms",
                        j, off[j] * 1e3, window * 1e3, wire_all * 1e3, comp_all * 1e3,
                        bytes_all, b->bw.bw / 1e6, target, critical, old, d,
                        v[(size_t)j * NV + 2], -v[(size_t)j * NV + 6] * 1e3,
                        v[(size_t)j * NV + 1] * 1e3);
            if (d != k->comp->density)
                st = set_density(k, d);
        }
    }
    free(v);
    return st;
}

GCOLL_EXPORT double gcoll_bucketer_density(const gcoll_bucketer_t *b, int bucket)
{
    if (!b || bucket < 0 || bucket >= b->nb || !b->bk[bucket].comp)
        return 0;
    return b->bk[bucket].comp->density > 0 ? b->bk[bucket].comp->density : 1.0;
}

/* Moves what the codec states remember (the residual, DGC's velocity, the step) from the
 * old buckets to the new ones, element by element through the tensors. */
static void move_states(gcoll_bucketer_t *b, const bucket_t *obk, int onb, const seg_t *oseg,
                        const int *oseg0, const int *onseg)
{
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        if (!k->state)
            continue;
        for (int s = k->seg0; s < k->seg0 + k->n; s++) {
            const seg_t *g = &b->seg[s];
            for (int o = oseg0[g->t]; o < oseg0[g->t] + onseg[g->t]; o++) {
                const seg_t *h = &oseg[o];
                const bucket_t *ok = &obk[h->bucket];
                size_t lo = GCOLL_MAX(g->toff, h->toff);
                size_t hi = GCOLL_MIN(g->toff + g->n, h->toff + h->n);
                if (lo >= hi || !ok->state || h->bucket >= onb)
                    continue;
                k->state->step = ok->state->step;
                size_t to = g->foff + lo - g->toff, from = h->foff + lo - h->toff;
                if (k->state->e && ok->state->e)
                    memcpy(k->state->e + to, ok->state->e + from, (hi - lo) * sizeof(float));
                if (k->state->u && ok->state->u)
                    memcpy(k->state->u + to, ok->state->u + from, (hi - lo) * sizeof(float));
            }
        }
    }
}

/* Whether every old bucket's state can move (compressed allreduce keeps a residual of its
 * reduced chunk, which belongs to no tensor element: such layouts stay). */
static int states_movable(const gcoll_bucketer_t *b)
{
    for (int j = 0; j < b->nb; j++)
        if (b->bk[j].state && b->bk[j].state->server)
            return 0;
    return 1;
}

static int by_ready(const void *x, const void *y, void *arg)
{
    const double *r = arg;
    int i = *(const int *)x, j = *(const int *)y;
    return r[i] < r[j] ? -1 : r[i] > r[j] ? 1 : i - j;
}

/* Insertion sort with a context (qsort_r is not portable); n is the tensor count. */
static void sort_order(int *order, int n, const double *ready)
{
    for (int i = 1; i < n; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0 && by_ready(&order[j], &x, (void *)ready) > 0) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
}

/* Frees a layout's buckets (nb of bk), segments and the priority arrays. */
static void layout_free(bucket_t *bk, int nb, seg_t *seg, gcoll_request_t **tok, int32_t *neg)
{
    for (int j = 0; bk && j < nb; j++)
        bucket_free(&bk[j]);
    free(bk);
    free(seg);
    free(tok);
    free(neg);
}

/* After the second communicating step (the first warms connections and pages): the ranks
 * agree on each tensor's ready time (the latest) and each bucket's collective time (the
 * shortest: the rank that waited least), fit the link from the latter and cut the buckets
 * again in ready order with the time rule. The same agreed numbers give every rank the
 * same layout. */
static gcoll_status_t rebuild(gcoll_bucketer_t *b)
{
    int nt = b->nt, nb = b->nb;
    double *v = calloc((size_t)(nt + 2 * nb) + 1, sizeof(double));
    int *order = calloc((size_t)nt + 1, sizeof(int));
    int *oseg0 = calloc((size_t)nt + 1, sizeof(int)), *onseg = calloc((size_t)nt + 1, sizeof(int));
    int *obucket = calloc((size_t)nt + 1, sizeof(int));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!v || !order || !oseg0 || !onseg || !obucket)
        goto out;
    for (int i = 0; i < nt; i++)
        v[i] = b->t[i].t_ready;
    for (int j = 0; j < nb; j++) {
        v[nt + j] = -b->bk[j].wire_s; /* MAX of the negation: the shortest */
        v[nt + nb + j] = (double)(b->bk[j].count * gcoll_dtype_size(b->bk[j].dtype));
    }
    int movable = states_movable(b);
    v[nt + 2 * nb] = movable;
    st = gcoll_allreduce(b->comm, v, v, (size_t)(nt + 2 * nb) + 1, GCOLL_FLOAT64, GCOLL_MAX);
    if (st != GCOLL_OK)
        goto out;
    for (int j = 0; j < nb; j++)
        v[nt + j] = -v[nt + j];
    b->rebuilt = 1;
    gcoll_plan_link_t link = b->link;
    gcoll_plan_fit_link(v + nt + nb, v + nt, nb, default_msg_s(b->comm->size), &link);
    if (v[nt + 2 * nb] < 1) { /* some rank's states cannot move: MAX of 0 on all is 0 */
        GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: layout kept (compressed allreduce states)");
        st = GCOLL_OK;
        goto out;
    }
    for (int i = 0; i < nt; i++) {
        order[i] = i;
        oseg0[i] = b->t[i].seg0;
        onseg[i] = b->t[i].nseg;
        obucket[i] = b->t[i].bucket;
        b->t[i].nseg = 0;
    }
    sort_order(order, nt, v);
    b->link = link;
    gcoll_plan_rule_t r;
    layout_rule(b, &r, 1);
    bucket_t *obk = b->bk;
    seg_t *oseg = b->seg;
    gcoll_request_t **otok = b->tok;
    int32_t *oneg = b->neg;
    int onb = b->nb, onseg_all = b->nseg;
    b->bk = NULL;
    b->nb = 0;
    st = layout(b, order, &r, v);
    for (int j = 0; j < b->nb && st == GCOLL_OK; j++)
        st = bucket_setup(b, j);
    if (st == GCOLL_OK) {
        move_states(b, obk, onb, oseg, oseg0, onseg);
        mark_checks(b);
        char why[128];
        snprintf(why, sizeof(why), "rebuilt from measured ready times: first %zu, then %zu "
                 "bytes, flush after %.1f ms", r.first, r.target, r.flush_s * 1e3);
        log_layout(b, why);
        layout_free(obk, onb, oseg, otok, oneg);
    } else { /* out of memory: the old layout stays */
        layout_free(b->bk, b->nb, b->seg, b->tok, b->neg);
        b->bk = obk;
        b->nb = onb;
        b->seg = oseg;
        b->nseg = onseg_all;
        b->tok = otok;
        b->neg = oneg;
        for (int i = 0; i < nt; i++) {
            b->t[i].seg0 = oseg0[i];
            b->t[i].nseg = onseg[i];
            b->t[i].bucket = obucket[i];
        }
    }
out:
    free(v);
    free(order);
    free(oseg0);
    free(onseg);
    free(obucket);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_wait_tensor(gcoll_bucketer_t *b, int id)
{
    if (!b)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock(&b->lock);
    gcoll_status_t st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor",
                                              b->finalized && id >= 0 && id < b->nt,
                                              "no tensor %d (%d registered, %s)", id, b->nt,
                                              b->finalized ? "step started" : "no ready() yet");
    if (st == GCOLL_OK && !communicating(b)) { /* nothing travels this step */
        pthread_mutex_unlock(&b->lock);
        return GCOLL_OK;
    }
    if (st == GCOLL_OK)
        st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor", b->t[id].ready,
                                   "tensor '%s' is not marked ready this step", b->t[id].name);
    uint64_t give_up = gcoll_time_ms() + (uint64_t)b->comm->cfg.timeout_ms;
    int j0 = st == GCOLL_OK ? b->t[id].bucket : 0, j1 = st == GCOLL_OK ? j0 + b->t[id].nseg : 0;
    for (int j = j0; st == GCOLL_OK && j < j1; j++) {
        while (!b->bk[j].ran && st == GCOLL_OK) {
            if (gcoll_time_ms() > give_up) {
                st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor", 0,
                                           "%s not reduced within GCOLL_TIMEOUT_MS",
                                           b->bk[j].label);
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&b->cond, &b->lock, &ts);
        }
        if (st == GCOLL_OK)
            st = b->bk[j].st;
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_wait(gcoll_bucketer_t *b)
{
    if (!b)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock(&b->lock);
    gcoll_status_t st = GCOLL_OK;
    if (!b->finalized && (st = finalize(b)) != GCOLL_OK) {
        pthread_mutex_unlock(&b->lock);
        return st;
    }
    /* A tensor never marked ready: its bucket was never launched here, so the others
     * time out in it; say which one on this rank at once. */
    for (int i = 0; i < b->nt && st == GCOLL_OK; i++)
        if (!b->t[i].ready)
            st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait", 0,
                                       "tensor '%s' (bucket %d) was not marked ready this step",
                                       b->t[i].name, b->t[i].bucket);
    double t_end = (double)gcoll_time_ns() * 1e-9; /* the end of backward */
    int ntok = b->ntok;
    pthread_mutex_unlock(&b->lock);
    for (int i = 0; i < ntok; i++) {
        gcoll_status_t s2 = gcoll_wait(b->tok[i]);
        b->tok[i] = NULL;
        if (st == GCOLL_OK)
            st = s2;
    }
    for (int j = 0; j < b->nb; j++) {
        if (!b->bk[j].req)
            continue;
        gcoll_status_t s2 = gcoll_wait(b->bk[j].req);
        b->bk[j].req = NULL;
        if (st == GCOLL_OK)
            st = s2;
    }
    if (st == GCOLL_OK && b->adapt && communicating(b))
        st = adapt(b, t_end);
    pthread_mutex_lock(&b->lock);
    if (st == GCOLL_OK && communicating(b) && b->autosize && b->rebuild && !b->rebuilt &&
        ++b->comm_steps == 2)
        st = rebuild(b);
    for (int i = 0; i < b->nt; i++)
        b->t[i].ready = 0;
    for (int j = 0; j < b->nb; j++)
        b->bk[j].nready = b->bk[j].launched = b->bk[j].ran = 0;
    b->ntok = 0;
    b->t_first_ready = 0;
    b->next_launch = 0;
    b->mid_scale = 1;
    b->mid_fired = 0;
    b->step++;
    pthread_mutex_unlock(&b->lock);
    return st;
}

GCOLL_EXPORT int gcoll_bucketer_num_buckets(const gcoll_bucketer_t *b) { return b ? b->nb : 0; }
