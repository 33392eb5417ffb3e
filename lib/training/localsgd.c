/* localsgd.c: local SGD with compressed model deltas and error feedback (Qsparse-local-SGD,
 * Basu et al. 2019), over the public compressed allreduce.
 *
 * Each tensor keeps the synced model w_s. At a synchronisation the delta d = w - w_s goes
 * through gcoll_compressed_allreduce with the tensor's codec state, whose residual e is the
 * client-side error feedback (what C(d + e) did not carry); every rank adds the same
 * average to w_s and restarts from it. What a rank does not send stays in its residual, so
 * no local progress is lost, only delayed (the argument of Stich et al. 2018 and Basu et al.
 * 2019). The warm-up of synchronous steps is PyTorch's PostLocalSGD (Lin et al. 2020, "Don't
 * use large mini-batches, use local SGD"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "compress/compress.h"
#include "base/util.h"

typedef struct {
    float *param, *mom; /* the caller's */
    size_t count;
    float *synced;       /* w_s */
    float *delta;        /* d, the allreduce's input; kept until the sync is applied */
    float *avg;          /* the allreduce's output */
    float *snap;         /* w at the snapshot of a nonblocking sync */
    float *msnap, *mavg; /* GCOLL_LSGD_MOMENTUM_AVERAGE: snapshot and its average */
    gcoll_tensor_state_t *state;
    gcoll_request_t *req, *mreq;
} lsgd_tensor_t;

struct gcoll_localsgd {
    gcoll_comm_t *comm;
    gcoll_localsgd_config_t cfg;
    gcoll_compressor_t *comp;
    lsgd_tensor_t *t;
    int n, cap;
    uint64_t steps, syncs;
    int since;
    int pending; /* a sync is queued */
    int moving;  /* it is nonblocking: the params may move before it is applied */
};

static gcoll_status_t lsgd_invalid(gcoll_comm_t *comm, const char *what, const char *msg)
{
    return gcoll_comm_check_args(comm, what, 0, "%s", msg);
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_create(gcoll_comm_t *comm,
                                                  const gcoll_localsgd_config_t *cfg,
                                                  gcoll_localsgd_t **ls_p)
{
    if (!comm || !cfg || !ls_p)
        return GCOLL_ERR_INVALID;
    const char *w = "gcoll_localsgd_create";
    if (cfg->local_steps < 1)
        return lsgd_invalid(comm, w, "local_steps must be >= 1");
    if (cfg->warmup_steps < 0)
        return lsgd_invalid(comm, w, "warmup_steps must be >= 0");
    if (cfg->momentum != GCOLL_LSGD_MOMENTUM_LOCAL && cfg->momentum != GCOLL_LSGD_MOMENTUM_RESET &&
        cfg->momentum != GCOLL_LSGD_MOMENTUM_AVERAGE)
        return lsgd_invalid(comm, w, "momentum must be local, reset or average");
    const char *spec = cfg->compressor && *cfg->compressor ? cfg->compressor : "none";
    char err[256];
    if (gcoll_compressor_check(spec, err, sizeof(err)) != GCOLL_OK)
        return gcoll_comm_check_args(comm, w, 0, "delta compressor: %s", err);
    gcoll_localsgd_t *ls = calloc(1, sizeof(*ls));
    if (!ls)
        return GCOLL_ERR_NOMEM;
    ls->comm = comm;
    ls->cfg = *cfg;
    ls->cfg.compressor = NULL; /* the caller's string need not outlive the call */
    gcoll_status_t st = gcoll_compressor_create(spec, &ls->comp);
    if (st != GCOLL_OK) {
        free(ls);
        return st;
    }
    *ls_p = ls;
    return GCOLL_OK;
}

static void tensor_free(lsgd_tensor_t *t)
{
    free(t->synced);
    free(t->delta);
    free(t->avg);
    free(t->snap);
    free(t->msnap);
    free(t->mavg);
    gcoll_state_destroy(t->state);
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_add_tensor(gcoll_localsgd_t *ls, float *param,
                                                      float *momentum, size_t count, int *id_p)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    const char *w = "gcoll_localsgd_add_tensor";
    if (!param && count > 0)
        return lsgd_invalid(ls->comm, w, "param is NULL");
    if (ls->steps > 0)
        return lsgd_invalid(ls->comm, w, "tensors must be registered before the first step");
    if (ls->n == ls->cap) {
        int cap = ls->cap ? 2 * ls->cap : 8;
        lsgd_tensor_t *nt = realloc(ls->t, (size_t)cap * sizeof(*nt));
        if (!nt)
            return GCOLL_ERR_NOMEM;
        ls->t = nt;
        ls->cap = cap;
    }
    lsgd_tensor_t *t = &ls->t[ls->n];
    memset(t, 0, sizeof(*t));
    t->param = param;
    t->mom = momentum;
    t->count = count;
    size_t bytes = (count ? count : 1) * sizeof(float);
    int avg_mom = momentum && ls->cfg.momentum == GCOLL_LSGD_MOMENTUM_AVERAGE;
    t->synced = malloc(bytes);
    t->delta = malloc(bytes);
    t->avg = malloc(bytes);
    t->snap = malloc(bytes);
    if (avg_mom) {
        t->msnap = malloc(bytes);
        t->mavg = malloc(bytes);
    }
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!t->synced || !t->delta || !t->avg || !t->snap || (avg_mom && (!t->msnap || !t->mavg)))
        goto err_tensor;
    GCOLL_CHECK_GOTO(gcoll_state_create(ls->comp, count, &t->state), st, err_tensor);
    if (count)
        memcpy(t->synced, param, count * sizeof(float));
    if (id_p)
        *id_p = ls->n;
    ls->n++;
    return GCOLL_OK;
err_tensor:
    tensor_free(t);
    return st;
}

/* Queues every tensor's compressed allreduce of its delta (and the momentum average), in
 * registration order, the same on every rank. */
static gcoll_status_t sync_start(gcoll_localsgd_t *ls, int nonblocking)
{
    gcoll_status_t st = GCOLL_OK;
    ls->moving = nonblocking;
    for (int i = 0; i < ls->n; i++) {
        lsgd_tensor_t *t = &ls->t[i];
        for (size_t j = 0; j < t->count; j++)
            t->delta[j] = t->param[j] - t->synced[j];
        if (nonblocking)
            memcpy(t->snap, t->param, t->count * sizeof(float));
        st = gcoll_icompressed_allreduce(ls->comm, t->state, t->delta, t->avg, t->count, GCOLL_AVG,
                                         &t->req);
        if (st != GCOLL_OK)
            break;
        if (t->msnap) {
            memcpy(t->msnap, t->mom, t->count * sizeof(float));
            st = gcoll_iallreduce(ls->comm, t->msnap, t->mavg, t->count, GCOLL_FLOAT32, GCOLL_AVG,
                                  &t->mreq);
            if (st != GCOLL_OK)
                break;
        }
    }
    ls->pending = 1;
    ls->syncs++;
    ls->since = 0;
    return st;
}

/* Waits for every queued request and applies the averages: w_s += avg, and w = w_s plus
 * whatever the caller's steps moved w since the snapshot of a nonblocking sync. */
static gcoll_status_t sync_finish(gcoll_localsgd_t *ls)
{
    if (!ls->pending)
        return GCOLL_OK;
    gcoll_status_t first = GCOLL_OK;
    for (int i = 0; i < ls->n; i++) {
        lsgd_tensor_t *t = &ls->t[i];
        gcoll_status_t st = t->req ? gcoll_wait(t->req) : GCOLL_OK;
        gcoll_status_t mst = t->mreq ? gcoll_wait(t->mreq) : GCOLL_OK;
        int ok = t->req != NULL && st == GCOLL_OK && (!t->msnap || (t->mreq && mst == GCOLL_OK));
        t->req = t->mreq = NULL;
        if (first == GCOLL_OK)
            first = st != GCOLL_OK ? st : mst;
        if (!ok || first != GCOLL_OK) {
            if (first == GCOLL_OK)
                first = GCOLL_ERR_INTERNAL; /* a request that was never queued */
            continue;
        }
        float *w = t->param, *ws = t->synced;
        const float *a = t->avg, *snap = t->snap;
        for (size_t j = 0; j < t->count; j++) {
            ws[j] += a[j];
            /* w - snap is exactly 0 for an element no step touched: the ranks' models
             * then stay bit-identical */
            w[j] = ls->moving ? ws[j] + (w[j] - snap[j]) : ws[j];
        }
        if (t->mom) {
            if (ls->cfg.momentum == GCOLL_LSGD_MOMENTUM_RESET)
                memset(t->mom, 0, t->count * sizeof(float));
            else if (t->msnap && !ls->moving)
                memcpy(t->mom, t->mavg, t->count * sizeof(float));
            else if (t->msnap) /* keep what the steps since the snapshot added */
                for (size_t j = 0; j < t->count; j++)
                    t->mom[j] += t->mavg[j] - t->msnap[j];
        }
    }
    ls->pending = 0;
    return first;
}

static int period_now(const gcoll_localsgd_t *ls)
{
    return ls->steps < (uint64_t)ls->cfg.warmup_steps ? 1 : ls->cfg.local_steps;
}

static gcoll_status_t step_common(gcoll_localsgd_t *ls, int nonblocking, int *flag_p)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    int period = period_now(ls); /* the period this step belongs to */
    gcoll_status_t st = sync_finish(ls);
    ls->steps++;
    ls->since++;
    int sync = ls->since >= period;
    if (st == GCOLL_OK && sync) {
        st = sync_start(ls, nonblocking);
        if (!nonblocking) {
            gcoll_status_t st2 = sync_finish(ls);
            if (st == GCOLL_OK)
                st = st2;
        }
    }
    if (flag_p)
        *flag_p = sync;
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_step(gcoll_localsgd_t *ls, int *synced_p)
{
    return step_common(ls, 0, synced_p);
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_istep(gcoll_localsgd_t *ls, int *started_p)
{
    return step_common(ls, 1, started_p);
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_wait(gcoll_localsgd_t *ls)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    return sync_finish(ls);
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_sync(gcoll_localsgd_t *ls)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    GCOLL_CHECK(sync_finish(ls));
    if (ls->since == 0) /* every rank has the same count, so every rank skips */
        return GCOLL_OK;
    gcoll_status_t st = sync_start(ls, 0);
    gcoll_status_t st2 = sync_finish(ls);
    return st != GCOLL_OK ? st : st2;
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_info(const gcoll_localsgd_t *ls,
                                                gcoll_localsgd_info_t *info_p)
{
    if (!ls || !info_p)
        return GCOLL_ERR_INVALID;
    info_p->steps = ls->steps;
    info_p->syncs = ls->syncs;
    info_p->period = period_now(ls);
    info_p->since_sync = ls->since;
    info_p->ntensors = ls->n;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_get_tensor(const gcoll_localsgd_t *ls, int id,
                                                      float *synced, float *residual)
{
    if (!ls || id < 0 || id >= ls->n)
        return GCOLL_ERR_INVALID;
    const lsgd_tensor_t *t = &ls->t[id];
    if (synced)
        memcpy(synced, t->synced, t->count * sizeof(float));
    if (residual) {
        const float *e = gcoll_state_residual(t->state);
        if (e)
            memcpy(residual, e, t->count * sizeof(float));
        else
            memset(residual, 0, t->count * sizeof(float));
    }
    return GCOLL_OK;
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_set_tensor(gcoll_localsgd_t *ls, int id,
                                                      const float *synced, const float *residual)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    const char *w = "gcoll_localsgd_set_tensor";
    if (id < 0 || id >= ls->n)
        return lsgd_invalid(ls->comm, w, "no such tensor id");
    if (ls->pending)
        return lsgd_invalid(ls->comm, w, "a synchronisation is pending (call wait first)");
    lsgd_tensor_t *t = &ls->t[id];
    if ((synced && !all_finite(synced, t->count)) || (residual && !all_finite(residual, t->count)))
        return lsgd_invalid(ls->comm, w, "NaN or Inf in the restored state");
    /* the residual lives in the codec state; gcoll_state_residual is its current buffer */
    float *e = (float *)gcoll_state_residual(t->state);
    if (residual && !e) {
        for (size_t j = 0; j < t->count; j++)
            if (residual[j] != 0.0f)
                return lsgd_invalid(ls->comm, w, "this codec keeps no residual");
    }
    if (synced)
        memcpy(t->synced, synced, t->count * sizeof(float));
    if (residual && e)
        memcpy(e, residual, t->count * sizeof(float));
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_localsgd_set_counters(gcoll_localsgd_t *ls, uint64_t steps,
                                                        uint64_t syncs, int since_sync)
{
    if (!ls)
        return GCOLL_ERR_INVALID;
    if (ls->pending || since_sync < 0 || syncs > steps)
        return lsgd_invalid(ls->comm, "gcoll_localsgd_set_counters",
                            "bad counts, or a synchronisation is pending");
    ls->steps = steps;
    ls->syncs = syncs;
    ls->since = since_sync;
    /* the codec's step (its warm-up schedules, and the ranks' agreement check) counts
     * encodes, one per sync */
    for (int i = 0; i < ls->n; i++)
        ls->t[i].state->step = syncs;
    return GCOLL_OK;
}

GCOLL_EXPORT void gcoll_localsgd_destroy(gcoll_localsgd_t *ls)
{
    if (!ls)
        return;
    (void)sync_finish(ls);
    for (int i = 0; i < ls->n; i++)
        tensor_free(&ls->t[i]);
    free(ls->t);
    gcoll_compressor_destroy(ls->comp);
    free(ls);
}
