/* bucketer.c: overlap of gradient reduction with the backward pass. Tensors registered in
 * backward order are fused into buckets (consecutive tensors with the same codec, sized by
 * bucket_layout.c: automatically from the model and the link, or up to GCOLL_BUCKET_BYTES,
 * as PyTorch DDP's buckets and Horovod's tensor fusion); a bucket is queued on the progress
 * thread as soon as all its tensors are ready (bucket_sched.c: the same buckets in the same
 * order on every rank), and there it is gathered, compressed, reduced and scattered back
 * while the caller keeps computing. This file: registration, codecs, one bucket's run, the
 * step's end and the adaptation of densities. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"
#include "adapt/adapt_stat.h"
#include "bucket/bucketer_int.h"
#include "compress/kernels.h"
#include "collectives/compressed/compressed.h"
#include "collectives/reduce.h"
#include "collectives/sparse.h"
#include "base/util.h"
#include "core/ops.h"

void gcoll_bk_free(bucket_t *k)
{
    gcoll_state_destroy(k->state);
    gcoll_compressor_destroy(k->comp);
    free(k->ends);
    free(k->fused);
    free(k->acc);
    free(k->spec);
    gcoll_encoded_free(&k->staged);
}

GCOLL_EXPORT void gcoll_bucketer_destroy(gcoll_bucketer_t *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->ntok; i++)
        gcoll_wait(b->tok[i]);
    for (int i = 0; i < b->nb; i++)
        if (b->bk[i].req)
            gcoll_wait(b->bk[i].req);
    gcoll_bk_worker_stop(b);
    for (int i = 0; i < b->nb; i++)
        gcoll_bk_free(&b->bk[i]);
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
    pthread_cond_destroy(&b->wcond);
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_create(gcoll_comm_t *comm,
                                                  const gcoll_bucketer_config_t *cfg,
                                                  gcoll_bucketer_t **b_p)
{
    if (!comm || !b_p)
        return GCOLL_ERR_INVALID;
    gcoll_bucketer_t *b = calloc(1, sizeof(*b));
    if (!b)
        return GCOLL_ERR_NOMEM;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    pthread_cond_init(&b->wcond, NULL);
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
    b->pipeline = comm->cfg.bucket_pipeline;
    b->link.msg_s = gcoll_bk_default_msg_s(comm->size);
    if (comm->probe_bw > 0 && comm->size > 1) /* a dense ring sends 2(P-1)/P of a bucket */
        b->link.bw = comm->probe_bw * comm->size / (2.0 * (comm->size - 1));
    if (b->cfg.accumulate_steps < 1)
        b->cfg.accumulate_steps = 1;
    b->adapt = comm->cfg.adapt; /* GCOLL_AR_* */
    b->mid_scale = 1;
    gcoll_phase_init(&b->phase, 0.5, 2);
    gcoll_bw_init(&b->bw, (double)comm->cfg.adapt_half_life);
    if (comm->probe_bw > 0) /* GCOLL_PROBE: the first decision need not wait for a rate */
        gcoll_bw_jump(&b->bw, comm->probe_bw, 1.0);
    b->policy_text = strdup(b->cfg.policy ? b->cfg.policy : "");
    b->default_spec =
        strdup(b->cfg.default_spec && *b->cfg.default_spec ? b->cfg.default_spec : "none");
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
        st =
            gcoll_comm_check_args(comm, "gcoll_bucketer_create", 0, "default compressor: %s", cerr);
        goto err;
    }
    *b_p = b;
    return GCOLL_OK;
err:
    gcoll_bucketer_destroy(b);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_add_tensor(gcoll_bucketer_t *b, const char *name,
                                                      float *grad, size_t count,
                                                      gcoll_dtype_t dtype,
                                                      const char *compressor_spec, int *id_p)
{
    const char *what = "gcoll_bucketer_add_tensor";
    if (!b || !name || !id_p)
        return GCOLL_ERR_INVALID;
    gcoll_comm_t *comm = b->comm;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, !b->finalized,
                                      "'%s' registered after the first ready(): register every "
                                      "tensor once, before training",
                                      name));
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

/* A bucket's fused buffer, codec and state. */
gcoll_status_t gcoll_bk_setup(gcoll_bucketer_t *b, int j)
{
    bucket_t *k = &b->bk[j];
    const seg_t *s0 = &b->seg[k->seg0], *s1 = &b->seg[k->seg0 + k->n - 1];
    snprintf(k->label, sizeof(k->label), "gcoll_bucketer bucket %d [%s .. %s]", j, b->t[s0->t].name,
             b->t[s1->t].name);
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
    k->quant = b->adapt && gcoll_adapt_is_quant(k->comp);
    k->adaptive = b->adapt && (gcoll_adapt_has_density(k->comp) || k->quant);
    /* a streamed top-k bucket measures its wire by the time the run waited on it
     * (gcoll_bk_run_one), so adaptive buckets keep the streamed scheme */
    if (k->adaptive) {
        const gcoll_config_t *cf = &b->comm->cfg;
        k->base_density = k->quant ? 1 : k->comp->density;
        k->dens_now = k->base_density;
        k->orig_q8 = k->comp->vs.fmt == GCOLL_VF_Q8;
        gcoll_ctl_init(&k->ctl, cf->density_min, cf->density_max, k->base_density);
        gcoll_bw_init(&k->bw, (double)cf->adapt_half_life);
        gcoll_sig_init(&k->sig, (unsigned)b->adapt, cf->density_min, cf->density_max,
                       k->quant ? 0 : k->comp->density, k->quant ? gcoll_adapt_bits_of(k->comp) : 0,
                       (double)cf->adapt_stat_half_life);
    }
    return GCOLL_OK;
}
/* The mid-step checks run after an adaptive bucket with another adaptive one after it.
 * With them, the densities of the adaptive buckets a check may cut are decided on the wire
 * in the bucket's turn: only the other float32 buckets of a codec that compresses may be
 * encoded ahead (GCOLL_BUCKET_PIPELINE). */
void gcoll_bk_mark_checks(gcoll_bucketer_t *b)
{
    int checks = 0;
    for (int j = 0, later = 0; (b->adapt & 1) && j < b->nb; j++) {
        bucket_t *k = &b->bk[b->nb - 1 - j];
        k->check_after = k->adaptive && !k->quant && later;
        later |= k->adaptive && !k->quant;
        checks |= k->check_after;
    }
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        int dense = !k->comp || ((gcoll_codec_flags(k->comp) & GCOLL_CODEC_LOSSLESS) &&
                                 k->comp->vs.fmt == GCOLL_VF_F32);
        k->pre_ok = b->pipeline && b->comm->size > 1 && k->dtype == GCOLL_FLOAT32 && !dense &&
                    !(checks && k->adaptive && !k->quant);
    }
}

/* Assigns codecs by policy and cuts the tensors into buckets. */
static gcoll_status_t finalize(gcoll_bucketer_t *b)
{
    assign_specs(b);
    gcoll_plan_rule_t r;
    gcoll_bk_layout_rule(b, &r, 0);
    GCOLL_CHECK(gcoll_bk_layout(b, NULL, &r, NULL));
    for (int j = 0; j < b->nb; j++)
        GCOLL_CHECK(gcoll_bk_setup(b, j));
    gcoll_bk_mark_checks(b);
    char why[96];
    snprintf(why, sizeof(why),
             b->autosize ? "automatic, first %zu, then %zu bytes" : "GCOLL_BUCKET_BYTES %zu bytes",
             r.first, r.target);
    gcoll_bk_log_layout(b, why);
    b->finalized = 1;
    return GCOLL_OK;
}

/* Adds src into dst (n elements of dtype) for local accumulation. */
static void accumulate(void *dst, const void *src, size_t n, gcoll_dtype_t dtype)
{
    gcoll_reduce_local(dst, src, n, dtype, GCOLL_SUM);
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
        GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS,
                    "trace step %llu tensor '%s' n %zu density %.6g "
                    "updated %zu grad %.6g residual %.6g velocity %.6g",
                    (unsigned long long)step, t->name, g->n, gcoll_codec_density(k->comp, step), nz,
                    norm2(t->grad + g->toff, g->n), e ? norm2(e + g->foff, g->n) : 0.0,
                    u ? norm2(u + g->foff, g->n) : 0.0);
    }
}

/* Gathers bucket k's pieces into its fused buffer and adds the local accumulation; with
 * scan, looks for NaN/Inf while each block of the copy is in cache, instead of a separate
 * pass over the fused buffer in the encoder. err: why not. */
static gcoll_status_t gather(bucket_t *k, int scan, char *err, size_t errlen)
{
    const gcoll_bucketer_t *b = k->b;
    size_t esz = gcoll_dtype_size(k->dtype);
    uint8_t *fused = (uint8_t *)k->fused;
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
                snprintf(err, errlen, "%s: tensor '%s' element %zu is NaN or infinite", k->label,
                         t->name, g->toff + o + bad);
                return GCOLL_ERR_INVALID;
            }
        }
    }
    if (k->acc) {
        accumulate(fused, k->acc, k->count, k->dtype);
        memset(k->acc, 0, k->count * esz);
    }
    return GCOLL_OK;
}

/* The adaptation's view of this step's input, before the in-place run: the sampled
 * coordinates and the squared norm. */
static void sample_input(bucket_t *k)
{
    const gcoll_bucketer_t *b = k->b;
    k->m = 0;
    if (k->adaptive && (b->adapt & (GCOLL_AR_STAT | GCOLL_AR_BUDGET))) {
        size_t idx[GCOLL_SNR_SAMPLE];
        k->m = gcoll_snr_sample_idx(k->count, b->step, (uint64_t)(k - b->bk), idx);
        for (size_t i = 0; i < k->m; i++)
            k->sample[i] = k->fused[idx[i]];
    }
    if (k->adaptive && (b->adapt & 2)) {
        double n2 = 0;
        for (size_t i = 0; i < k->count; i++)
            n2 += (double)k->fused[i] * k->fused[i];
        k->norm2 = n2;
    }
}

void gcoll_bk_encode(bucket_t *k)
{
    const gcoll_bucketer_t *b = k->b;
    gcoll_encoded_t *e = &k->staged;
    const int scan = !k->acc;
    double tc = (double)gcoll_time_ns() * 1e-9;
    gcoll_status_t st = gather(k, scan, e->err, sizeof(e->err));
    double t0 = (double)gcoll_time_ns() * 1e-9;
    k->copy_s = t0 - tc;
    if (st != GCOLL_OK) { /* reported by the exchange stage, in the bucket's turn */
        e->staged = 1;
        e->st = st;
        e->ns = 0;
    } else {
        sample_input(k);
        gcoll_compressed_encode_stage(b->comm, k->state, k->fused, k->count, b->cfg.op,
                                      scan ? GCOLL_NANCHECK_DONE : GCOLL_NANCHECK_SCAN, e);
        k->streamed = gcoll_coll_compressed_is_stream(e->plan.scheme); /* the stage's plan */
    }
    k->enc_t = (double)gcoll_time_ns() * 1e-9;
    k->enc_s = k->enc_t - t0;
}

/* The collective of a bucket encoded ahead (gcoll_bk_encode): its exchange stage. Its run
 * and wire times count the encode as if it had run here, as the adaptation and the
 * layout's link fit measure an unpipelined run. */
static gcoll_status_t run_staged(gcoll_comm_t *comm, bucket_t *k, double *t0_p)
{
    const gcoll_bucketer_t *b = k->b;
    GCOLL_CHECK(gcoll_bk_encoded(comm, k));
    double t0 = (double)gcoll_time_ns() * 1e-9;
    *t0_p = t0;
    uint64_t sent0 = comm->chan.counters.bytes_sent, comp0 = comm->chan.counters.ns_compress;
    uint64_t wire0 = comm->chan.counters.ns_wire;
    gcoll_bk_on_wire(k->b, 1);
    gcoll_status_t st = gcoll_compressed_exchange_stage(
        comm, k->state, &k->staged, k->fused, k->fused, k->count, b->cfg.op,
        k->acc ? GCOLL_NANCHECK_SCAN : GCOLL_NANCHECK_DONE);
    gcoll_bk_on_wire(k->b, 0);
    k->run_s = k->enc_s + (double)gcoll_time_ns() * 1e-9 - t0;
    k->wire_s = k->run_s;
    k->comp_s = (double)(comm->chan.counters.ns_compress - comp0) * 1e-9;
    k->bytes = (double)(comm->chan.counters.bytes_sent - sent0);
    k->wire_busy = (double)(comm->chan.counters.ns_wire - wire0) * 1e-9;
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "bucketer: step %ld %s: encoded %.1f ms before its turn",
                b->step, k->label, (t0 - k->enc_t) * 1e3);
    return st;
}

/* The collective of a bucket run whole here: gather, reduce (compressed for float32). */
static gcoll_status_t run_inline(gcoll_comm_t *comm, bucket_t *k, double *t0_p)
{
    gcoll_bucketer_t *b = k->b;
    const int scan = k->dtype == GCOLL_FLOAT32 && !k->acc;
    double tc = (double)gcoll_time_ns() * 1e-9;
    char err[256];
    gcoll_status_t st = gather(k, scan, err, sizeof(err));
    if (st != GCOLL_OK) {
        gcoll_comm_set_error(comm, "%s", err);
        return st;
    }
    double t0 = (double)gcoll_time_ns() * 1e-9;
    *t0_p = t0;
    k->copy_s = t0 - tc;
    uint64_t sent0 = comm->chan.counters.bytes_sent, comp0 = comm->chan.counters.ns_compress;
    uint64_t wire0 = comm->chan.counters.ns_wire;
    sample_input(k);
    if (k->adaptive && !k->quant && b->mid_scale < 1) {
        double d = fmax(k->ctl.dmin, k->dens_now * b->mid_scale);
        if (d != k->comp->density && (st = gcoll_bucket_set_density(k, d)) != GCOLL_OK)
            return st;
    }
    uint64_t w0 = gcoll_time_ns();
    gcoll_bk_on_wire(b, 1);
    if (k->dtype == GCOLL_FLOAT32) {
        gcoll_step_plan_t plan; /* the call's, after any mid-step cut above */
        gcoll_compressed_plan(comm, k->state, k->count, 0, &plan);
        k->streamed = gcoll_coll_compressed_is_stream(plan.scheme);
        st = gcoll_compressed_run(comm, k->state, k->fused, k->fused, k->count, b->cfg.op, 0,
                                  scan ? GCOLL_NANCHECK_DONE : GCOLL_NANCHECK_SCAN, &plan);
        k->run_s = (double)gcoll_time_ns() * 1e-9 - t0;
        k->comp_s = (double)(comm->chan.counters.ns_compress - comp0) * 1e-9;
        k->bytes = (double)(comm->chan.counters.bytes_sent - sent0);
        k->wire_busy = (double)(comm->chan.counters.ns_wire - wire0) * 1e-9;
    } else {
        uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, k->count, k->dtype, b->cfg.op, 0);
        st = gcoll_ring_allreduce(comm, k->fused, k->count, k->dtype, b->cfg.op, sig);
        if (st == GCOLL_OK)
            gcoll_reduce_finish(k->fused, k->count, k->dtype, b->cfg.op, comm->size);
    }
    gcoll_bk_on_wire(b, 0);
    k->wire_s = (double)(gcoll_time_ns() - w0) * 1e-9;
    return st;
}

/* On the progress thread: the bucket's collective (encoded ahead, or whole here), the
 * mid-step check, the scatter back. */
gcoll_status_t gcoll_bk_run_one(gcoll_comm_t *comm, bucket_t *k)
{
    gcoll_bucketer_t *b = k->b;
    size_t esz = gcoll_dtype_size(k->dtype);
    uint64_t cstep = k->state ? k->state->step : 0; /* the codec's step of this run */
    double t0 = 0;
    gcoll_status_t st = k->pre_ok ? run_staged(comm, k, &t0) : run_inline(comm, k, &t0);
    if (st == GCOLL_OK && k->check_after)
        st = gcoll_bucket_midstep(comm, k);
    if (st != GCOLL_OK)
        return st;
    if (k->dtype == GCOLL_FLOAT32 && GCOLL_LOG_ON(GCOLL_LOG_DEBUG, GCOLL_SUBSYS_COMPRESS))
        trace_tensors(k, cstep);
    double t1 = (double)gcoll_time_ns() * 1e-9;
    for (int i = k->seg0; i < k->seg0 + k->n; i++) {
        const seg_t *g = &b->seg[i];
        memcpy((uint8_t *)b->t[g->t].grad + g->toff * esz, (uint8_t *)k->fused + g->foff * esz,
               g->n * esz);
    }
    k->copy_s += (double)gcoll_time_ns() * 1e-9 - t1;
    /* where the time of a step goes: queueing behind earlier buckets, then the run */
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL,
                "bucketer: step %llu %s: queued %.1f ms, ran %.1f ms "
                "(compression %.1f ms, %.0f bytes sent)",
                (unsigned long long)b->step, k->label, (t0 - k->t_launch) * 1e3, k->run_s * 1e3,
                k->comp_s * 1e3, k->bytes);
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
        if (!gcoll_bk_communicating(b)) /* accumulate locally; nothing travels this step */
            accumulate((uint8_t *)k->acc + g->foff * esz, (const uint8_t *)t->grad + g->toff * esz,
                       g->n, t->dtype);
        k->nready++;
    }
    if (gcoll_bk_communicating(b))
        st = gcoll_bk_launch(b, t);
out:
    pthread_mutex_unlock(&b->lock);
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
    if (st == GCOLL_OK && b->adapt && gcoll_bk_communicating(b))
        st = gcoll_bucketer_adapt(b, t_end);
    pthread_mutex_lock(&b->lock);
    /* a failed step may leave the worker on a bucket that never ran: the buckets are reset
     * (or rebuilt) only once it has let go */
    gcoll_status_t s2 = gcoll_bk_encodes_idle(b);
    if (st == GCOLL_OK)
        st = s2;
    if (st == GCOLL_OK && gcoll_bk_communicating(b) && b->autosize && b->rebuild && !b->rebuilt &&
        ++b->comm_steps == 2)
        st = gcoll_bk_rebuild(b);
    for (int i = 0; i < b->nt; i++)
        b->t[i].ready = 0;
    for (int j = 0; j < b->nb && s2 == GCOLL_OK; j++) {
        bucket_t *k = &b->bk[j];
        k->nready = k->launched = k->ran = 0;
        k->enc = ENC_NONE;
        k->staged.staged = 0; /* encoded for a step that failed before its turn */
    }
    b->ntok = 0;
    b->t_first_ready = 0;
    b->next_launch = 0;
    b->mid_scale = 1;
    b->mid_fired = 0;
    b->step++;
    pthread_mutex_unlock(&b->lock);
    return st;
}

GCOLL_EXPORT int gcoll_bucketer_num_buckets(const gcoll_bucketer_t *b)
{
    return b ? b->nb : 0;
}
