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
    int bucket;
    size_t off; /* in the bucket's fused buffer */
    int ready;
} tensor_t;

typedef struct {
    int first, n; /* tensors [first, first+n) */
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
    int finalized;
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

/* Assigns codecs by policy and cuts the tensors into buckets. */
static gcoll_status_t finalize(gcoll_bucketer_t *b)
{
    b->bk = calloc((size_t)b->nt + 1, sizeof(bucket_t));
    if (!b->bk)
        return GCOLL_ERR_NOMEM;
    assign_specs(b);
    for (int i = 0; i < b->nt; i++) {
        tensor_t *t = &b->t[i];
        const char *spec = t->chosen;
        bucket_t *k = b->nb ? &b->bk[b->nb - 1] : NULL;
        size_t esz = gcoll_dtype_size(t->dtype);
        if (!k || strcmp(k->spec, spec) != 0 || k->dtype != t->dtype ||
            (k->count > 0 && (k->count + t->count) * esz > b->cfg.bucket_bytes)) {
            k = &b->bk[b->nb++];
            k->first = i;
            k->dtype = t->dtype;
            k->b = b;
            if (!(k->spec = strdup(spec)))
                return GCOLL_ERR_NOMEM;
        }
        t->bucket = (int)(k - b->bk);
        t->off = k->count;
        k->count += t->count;
        k->n++;
        char why[32];
        if (t->rule >= 0)
            snprintf(why, sizeof(why), "policy rule %d", t->rule + 1);
        GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: tensor %d '%s' (layer '%.*s', %zu elements) -> "
                   "bucket %d, %s (%s)", i, t->name, (int)gcoll_policy_layer_len(t->name),
                   t->name, t->count, t->bucket, spec,
                   t->rule >= 0 ? why : t->rule == -1 ? "default" : t->spec ? "explicit"
                                                                           : "not float32");
    }
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        snprintf(k->label, sizeof(k->label), "gcoll_bucketer bucket %d [%s .. %s]", j,
                 b->t[k->first].name, b->t[k->first + k->n - 1].name);
        size_t esz = gcoll_dtype_size(k->dtype);
        k->fused = malloc(k->count * esz + 1);
        if (!k->fused || (b->cfg.accumulate_steps > 1 && !(k->acc = calloc(k->count + 1, esz))))
            return GCOLL_ERR_NOMEM;
        if (k->dtype == GCOLL_FLOAT32) {
            GCOLL_CHECK(gcoll_compressor_create(k->spec, &k->comp));
            default_warmup(k->comp, b->cfg.warmup_steps);
            if (b->comm->cfg.layer_select && k->n > 1) {
                /* top-k and DGC select in each tensor of the bucket (select.c) */
                if (!(k->ends = malloc((size_t)k->n * sizeof(size_t))))
                    return GCOLL_ERR_NOMEM;
                for (int i = 0; i < k->n; i++)
                    k->ends[i] = b->t[k->first + i].off + b->t[k->first + i].count;
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
        }
    }
    for (int j = 0, later = 0; (b->adapt & 1) && j < b->nb; j++) {
        bucket_t *k = &b->bk[b->nb - 1 - j];
        k->check_after = k->adaptive && later;
        later |= k->adaptive;
    }
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: %d tensors in %d buckets of up to %zu bytes", b->nt,
               b->nb, b->cfg.bucket_bytes);
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
    for (int i = k->first; i < k->first + k->n; i++) {
        const tensor_t *t = &b->t[i];
        const float *out = k->fused + t->off;
        size_t nz = 0;
        for (size_t j = 0; j < t->count; j++)
            nz += out[j] != 0;
        GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS, "trace step %llu tensor '%s' n %zu density %.6g "
                    "updated %zu grad %.6g residual %.6g velocity %.6g",
                    (unsigned long long)step, t->name, t->count,
                    gcoll_codec_density(k->comp, step), nz, norm2(t->grad, t->count),
                    e ? norm2(e + t->off, t->count) : 0.0,
                    u ? norm2(u + t->off, t->count) : 0.0);
    }
}

/* On the progress thread: gather, reduce (compressed for float32), scatter back. */
static gcoll_status_t run_bucket(gcoll_comm_t *comm, gcoll_request_t *req)
{
    bucket_t *k = req->a.ext;
    gcoll_bucketer_t *b = k->b;
    size_t esz = gcoll_dtype_size(k->dtype);
    uint8_t *fused = (uint8_t *)k->fused;
    double tc = (double)gcoll_time_ns() * 1e-9;
    /* float32 without local accumulation: look for NaN/Inf while each block of the copy
     * is in cache, instead of a separate pass over the fused buffer in the encoder */
    const int scan = k->dtype == GCOLL_FLOAT32 && !k->acc;
    for (int i = k->first; i < k->first + k->n; i++) {
        tensor_t *t = &b->t[i];
        if (!scan) {
            memcpy(fused + t->off * esz, t->grad, t->count * esz);
            continue;
        }
        float *dst = k->fused + t->off;
        const float *src = t->grad;
        for (size_t o = 0; o < t->count; o += 16384) {
            size_t n = GCOLL_MIN(t->count - o, (size_t)16384);
            memcpy(dst + o, src + o, n * sizeof(float));
            size_t bad = gcoll_kernels()->first_bad(dst + o, n);
            if (bad < n) {
                gcoll_comm_set_error(comm, "%s: tensor '%s' element %zu is NaN or infinite",
                                     k->label, t->name, o + bad);
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
    uint64_t sent0 = comm->chan.counters.bytes_sent, comp0 = comm->chan.counters.ns_compress;
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
    if (k->dtype == GCOLL_FLOAT32) {
        k->state->input_checked = scan;
        st = gcoll_compressed_run(comm, k->state, k->fused, k->fused, k->count, b->cfg.op, 0);
        k->state->input_checked = 0;
        k->run_s = (double)gcoll_time_ns() * 1e-9 - t0;
        k->comp_s = (double)(comm->chan.counters.ns_compress - comp0) * 1e-9;
        k->bytes = (double)(comm->chan.counters.bytes_sent - sent0);
    } else {
        uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, k->count, k->dtype, b->cfg.op, 0);
        st = gcoll_ring_allreduce(comm, fused, k->count, k->dtype, b->cfg.op, sig);
        if (st == GCOLL_OK)
            gcoll_reduce_finish(fused, k->count, k->dtype, b->cfg.op, comm->size);
    }
    if (st == GCOLL_OK && k->check_after)
        st = midstep_check(comm, k);
    if (st != GCOLL_OK)
        return st;
    if (k->dtype == GCOLL_FLOAT32 && GCOLL_LOG_ON(GCOLL_LOG_DEBUG, GCOLL_SUBSYS_COMPRESS))
        trace_tensors(k, cstep);
    double t1 = (double)gcoll_time_ns() * 1e-9;
    for (int i = k->first; i < k->first + k->n; i++) {
        tensor_t *t = &b->t[i];
        memcpy(t->grad, fused + t->off * esz, t->count * esz);
    }
    k->copy_s += (double)gcoll_time_ns() * 1e-9 - t1;
    /* where the time of a step goes: queueing behind earlier buckets, then the run */
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "bucketer: step %llu %s: queued %.1f ms, ran %.1f ms "
                "(compression %.1f ms, %.0f bytes sent)", (unsigned long long)b->step, k->label,
                (t0 - k->t_launch) * 1e3, k->run_s * 1e3, k->comp_s * 1e3, k->bytes);
    return GCOLL_OK;
}

/* Is this a step that communicates (the last of an accumulation cycle)? */
static int communicating(const gcoll_bucketer_t *b)
{
    return (b->step + 1) % b->cfg.accumulate_steps == 0;
}

/* Queues every complete bucket whose predecessors are queued: the same order everywhere. */
static gcoll_status_t launch_ready(gcoll_bucketer_t *b)
{
    while (b->next_launch < b->nb && b->bk[b->next_launch].nready == b->bk[b->next_launch].n) {
        bucket_t *k = &b->bk[b->next_launch];
        gcoll_args_t a = {.count = k->count, .dtype = k->dtype, .op = b->cfg.op, .ext = k};
        gcoll_request_t *req = gcoll_request_new(b->comm, k->label, run_bucket, &a);
        if (!req)
            return GCOLL_ERR_NOMEM;
        k->t_launch = (double)gcoll_time_ns() * 1e-9;
        GCOLL_CHECK(gcoll_comm_submit(b->comm, req, &k->req));
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
    bucket_t *k = &b->bk[t->bucket];
    if (!communicating(b)) {
        /* accumulate locally; nothing travels this step */
        size_t esz = gcoll_dtype_size(t->dtype);
        accumulate((uint8_t *)k->acc + t->off * esz, t->grad, t->count, t->dtype);
        k->nready++;
        goto out;
    }
    k->nready++;
    st = launch_ready(b);
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
    pthread_mutex_unlock(&b->lock);
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
    for (int i = 0; i < b->nt; i++)
        b->t[i].ready = 0;
    for (int j = 0; j < b->nb; j++)
        b->bk[j].nready = 0;
    b->next_launch = 0;
    b->mid_scale = 1;
    b->mid_fired = 0;
    b->step++;
    pthread_mutex_unlock(&b->lock);
    return st;
}

GCOLL_EXPORT int gcoll_bucketer_num_buckets(const gcoll_bucketer_t *b) { return b ? b->nb : 0; }
