/* ps_worker.c: the worker's side of the parameter server (lib/training/ps.c): pull, push
 * and finish on the caller's thread, and the messages' pool. A pull or push is a message
 * per owner handed to the server part through the mailbox; the worker waits for pull
 * answers on a condition variable, with a deadline. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/kernels.h"
#include "training/ps_int.h"
#include "base/util.h"

/* Messages are recycled: a step's pushes and answers are as large as the model, and
 * fresh buffers of that size come from mmap, zeroed page by page at first touch (measured
 * at 9% of an async run's CPU at batch 64 without the pool). */
ps_msg_t *gcoll_ps_msg_new(gcoll_ps_t *ps, int peer, int kind, size_t cap)
{
    if (cap < GCOLL_PS_HDR)
        cap = GCOLL_PS_HDR;
    ps_msg_t *m = NULL;
    pthread_mutex_lock(&ps->pool_lock);
    /* the smallest that fits, if not more than twice the size (small requests must not
     * hold a model-sized buffer) */
    ps_msg_t **best = NULL;
    for (ps_msg_t **pm = &ps->pool; *pm; pm = &(*pm)->next)
        if ((*pm)->cap >= cap && (*pm)->cap <= 2 * cap + 4096 &&
            (!best || (*pm)->cap < (*best)->cap))
            best = pm;
    if (best) {
        m = *best;
        *best = m->next;
        ps->pool_n--;
        ps->pool_bytes -= m->cap;
    }
    pthread_mutex_unlock(&ps->pool_lock);
    if (!m) {
        if (!(m = malloc(sizeof(*m))))
            return NULL;
        if (!(m->buf = malloc(cap))) {
            free(m);
            return NULL;
        }
        m->cap = cap;
    }
    uint8_t *buf = m->buf;
    size_t mcap = m->cap;
    memset(m, 0, sizeof(*m));
    m->buf = buf;
    m->cap = mcap;
    m->peer = peer;
    m->kind = kind;
    return m;
}

void gcoll_ps_msg_free(gcoll_ps_t *ps, ps_msg_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&ps->pool_lock);
    /* at most what two steps' messages hold (each rank sends about a model per step) */
    int keep = ps->pool_n < 8 * ps->P + 8 && ps->pool_bytes + m->cap <= 2 * ps->model_bytes + 65536;
    if (keep) {
        m->next = ps->pool;
        ps->pool = m;
        ps->pool_n++;
        ps->pool_bytes += m->cap;
    }
    pthread_mutex_unlock(&ps->pool_lock);
    if (!keep) {
        free(m->buf);
        free(m);
    }
}

/* Deadline of a worker's wait: the server's own silence bound plus a margin, so the
 * server (which names the peer) reports first. */
static void wait_deadline(const gcoll_ps_t *ps, struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    uint64_t ms = (uint64_t)ps->comm->cfg.timeout_ms + 2000;
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static gcoll_status_t queue_all(gcoll_ps_t *ps, ps_msg_t **msgs, int set_pull)
{
    pthread_mutex_lock(&ps->lock);
    gcoll_status_t st = ps->err;
    if (st == GCOLL_OK) {
        for (int o = 0; o < ps->P; o++)
            gcoll_ps_enqueue(ps, msgs[o], msgs[o]);
        if (set_pull)
            ps->pull_left = ps->P;
    }
    pthread_mutex_unlock(&ps->lock);
    if (st != GCOLL_OK)
        for (int o = 0; o < ps->P; o++)
            gcoll_ps_msg_free(ps, msgs[o]);
    return st;
}

static gcoll_status_t ctl_msgs(gcoll_ps_t *ps, int kind, uint64_t clock, ps_msg_t **msgs)
{
    for (int o = 0; o < ps->P; o++) {
        msgs[o] = gcoll_ps_msg_new(ps, o, kind, GCOLL_PS_HDR);
        if (!msgs[o]) {
            for (int k = 0; k < o; k++)
                gcoll_ps_msg_free(ps, msgs[k]);
            return GCOLL_ERR_NOMEM;
        }
        gcoll_ps_put_hdr(msgs[o]->buf, (uint32_t)kind, clock, 0, 0);
        msgs[o]->len = GCOLL_PS_HDR;
    }
    return GCOLL_OK;
}

/* Asks every owner for the model this worker may read at clock (answered once the clock
 * bound allows). */
static gcoll_status_t ask(gcoll_ps_t *ps, uint64_t clock)
{
    ps_msg_t *msgs[ps->P];
    GCOLL_CHECK(ctl_msgs(ps, GCOLL_PS_PULL, clock, msgs));
    return queue_all(ps, msgs, 1);
}

/* Waits (with a deadline) for every owner's answer to the request out; on success the
 * answers' shard clocks become the ones the next push reports. */
static gcoll_status_t wait_answers(gcoll_ps_t *ps, const char *what)
{
    uint64_t t0 = gcoll_time_ns();
    struct timespec dl;
    wait_deadline(ps, &dl);
    pthread_mutex_lock(&ps->lock);
    int rc = 0;
    while (ps->pull_left > 0 && ps->err == GCOLL_OK && rc == 0)
        rc = pthread_cond_timedwait(&ps->cond, &ps->lock, &dl);
    gcoll_status_t st = ps->err;
    if (st == GCOLL_OK && ps->pull_left > 0)
        st = GCOLL_ERR_TIMEOUT;
    if (st == GCOLL_OK)
        memcpy(ps->kuse, ps->kread, (size_t)ps->P * sizeof(uint64_t));
    pthread_mutex_unlock(&ps->lock);
    ps->wait_s += 1e-9 * (double)(gcoll_time_ns() - t0);
    if (st == GCOLL_ERR_TIMEOUT && ps->err == GCOLL_OK) {
        gcoll_comm_set_error(ps->comm, "%s: no answer in GCOLL_TIMEOUT_MS + 2 s", what);
        gcoll_comm_abort(ps->comm);
    }
    if (st != GCOLL_OK && ps->req) {
        /* the server failed: let its operation end, so the communicator's error (which
         * names the cause) is set when the caller reads it */
        (void)gcoll_wait(ps->req);
        ps->req = NULL;
    }
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_pull(gcoll_ps_t *ps)
{
    if (!ps)
        return GCOLL_ERR_INVALID;
    if (!ps->started || ps->finished)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_pull", "the server is not running");
    if (ps->pulled)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_pull", "pulled twice without a push");
    if (!ps->prefetched)
        GCOLL_CHECK(ask(ps, ps->clock));
    ps->prefetched = 0;
    GCOLL_CHECK(wait_answers(ps, "gcoll_ps_pull"));
    if (ps->stage) {
        /* the answers are in the staging copy, which no answer writes until the next
         * request: install them, then ask for the next clock's model at once. They were
         * asked for before this worker's last push (clock - 1), which an answer lacks
         * unless the bound held it back until that push was applied (its shard clock is
         * then past it). What it lacks is added as its owner will apply it (SSP's
         * read-my-writes, Ho et al. 2013), so prefetching delays only the other workers'
         * updates */
        for (int i = 0; i < ps->n; i++) {
            ps_tensor_t *t = &ps->t[i];
            for (int o = 0; o < ps->P; o++) {
                float *p = t->param + t->off[o];
                const float *s = t->stage + t->off[o], *u = t->own + t->off[o];
                const float k = ps->clock > 0 && ps->kuse[o] < ps->clock ? ps->own_scale[o] : 0.0f;
                for (size_t j = 0; j < t->len[o]; j++)
                    p[j] = s[j] - k * u[j];
            }
        }
        GCOLL_CHECK(ask(ps, ps->clock + 1));
        ps->prefetched = 1;
    }
    uint64_t lo = UINT64_MAX;
    for (int o = 0; o < ps->P; o++)
        if (ps->kuse[o] < lo)
            lo = ps->kuse[o];
    if (ps->clock - lo > ps->max_gap)
        ps->max_gap = ps->clock - lo;
    ps->pulled = 1;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_push(gcoll_ps_t *ps, const float *const *grads)
{
    if (!ps || !grads)
        return GCOLL_ERR_INVALID;
    const char *w = "gcoll_ps_push";
    if (!ps->started || ps->finished)
        return gcoll_ps_invalid(ps->comm, w, "the server is not running");
    if (!ps->pulled)
        return gcoll_ps_invalid(ps->comm, w, "push without a pull before it");
    for (int i = 0; i < ps->n; i++) {
        if (!grads[i])
            return gcoll_ps_invalid(ps->comm, w, "NULL gradient");
        if (gcoll_kernels()->first_bad(grads[i], ps->t[i].count) != ps->t[i].count)
            return gcoll_ps_invalid(ps->comm, w, "NaN or Inf in a gradient");
    }
    ps_msg_t *msgs[ps->P];
    for (int o = 0; o < ps->P; o++) {
        size_t cnt[ps->n];
        const float *src[ps->n];
        gcoll_tensor_state_t *st_o[ps->n];
        gcoll_ps_counts(ps, o, cnt);
        for (int i = 0; i < ps->n; i++) {
            src[i] = grads[i] + ps->t[i].off[o];
            st_o[i] = ps->t[i].st[o];
        }
        size_t cap = gcoll_ps_frame_bound(ps->comp, cnt, ps->n);
        ps_msg_t *m = msgs[o] = gcoll_ps_msg_new(ps, o, GCOLL_PS_PUSH, cap);
        gcoll_status_t st = m ? GCOLL_OK : GCOLL_ERR_NOMEM;
        if (m) {
            gcoll_ps_put_hdr(m->buf, GCOLL_PS_PUSH, ps->clock, ps->kuse[o], (uint64_t)ps->n);
            st = gcoll_ps_frame_encode(ps->comp, st_o, src, cnt, ps->n, m->buf, cap, &m->len);
        }
        if (st == GCOLL_OK && ps->own) {
            /* what owner o will apply, for the next pull (read-my-writes): the update as
             * it decodes it, times lr f(tau) / P (lib/training/ssp.c's weight) */
            float *dst[ps->n];
            for (int i = 0; i < ps->n; i++)
                dst[i] = ps->t[i].own + ps->t[i].off[o];
            if (gcoll_ps_exact(ps->comp)) /* what decodes is the gradient itself */
                for (int i = 0; i < ps->n; i++)
                    memcpy(dst[i], src[i], cnt[i] * sizeof(float));
            else
                st = gcoll_ps_frame_decode(ps->comp, m->buf, m->len, dst, cnt, ps->n, 0, NULL, 0);
            ps->own_scale[o] =
                ps->cfg.lr *
                (float)(gcoll_ssp_weight(ps->cfg.weighting, ps->clock - ps->kuse[o]) / ps->P);
        }
        if (st != GCOLL_OK) {
            for (int k = 0; k <= o; k++)
                gcoll_ps_msg_free(ps, msgs[k]);
            return st;
        }
    }
    GCOLL_CHECK(queue_all(ps, msgs, 0));
    ps->clock++;
    ps->pulled = 0;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_finish(gcoll_ps_t *ps)
{
    if (!ps)
        return GCOLL_ERR_INVALID;
    if (!ps->started || ps->finished)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_finish", "the server is not running");
    ps_msg_t *msgs[ps->P];
    gcoll_status_t st = GCOLL_OK;
    if (ps->prefetched) {
        /* every answer must be in before done: an owner may end once all workers are */
        ps->prefetched = 0;
        st = wait_answers(ps, "gcoll_ps_finish");
        if (st != GCOLL_OK) {
            ps->finished = 1;
            return st;
        }
    }
    st = ctl_msgs(ps, GCOLL_PS_DONE, ps->clock, msgs);
    if (st == GCOLL_OK)
        st = queue_all(ps, msgs, 0);
    if (st != GCOLL_OK)
        gcoll_comm_abort(ps->comm); /* the server must not wait for this worker */
    gcoll_status_t rst = ps->req ? gcoll_wait(ps->req) : ps->err;
    ps->req = NULL;
    ps->finished = 1;
    if (st == GCOLL_OK)
        st = rst;
    if (st != GCOLL_OK)
        return st;
    /* the final model on every rank */
    size_t *cnt = malloc((size_t)ps->P * sizeof(size_t));
    if (!cnt)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < ps->n && st == GCOLL_OK; i++) {
        ps_tensor_t *t = &ps->t[i];
        memcpy(cnt, t->len, (size_t)ps->P * sizeof(size_t));
        st = gcoll_allgatherv(ps->comm, ps->sh.w + t->soff, t->len[ps->rank], t->param, cnt, t->off,
                              GCOLL_FLOAT32);
    }
    free(cnt);
    if (st != GCOLL_OK)
        return st;
    double mx = (double)ps->max_gap;
    double sum[11] = {(double)ps->sh.napplied, ps->sh.tau_sum};
    for (int k = 0; k <= ps->sh.S; k++)
        sum[2 + (k < 8 ? k : 8)] += (double)ps->sh.hist[k];
    GCOLL_CHECK(gcoll_allreduce(ps->comm, &mx, &mx, 1, GCOLL_FLOAT64, GCOLL_MAX));
    GCOLL_CHECK(gcoll_allreduce(ps->comm, sum, sum, 11, GCOLL_FLOAT64, GCOLL_SUM));
    ps->fin.clock = ps->clock;
    ps->fin.max_gap = (uint64_t)mx;
    ps->fin.applied = (uint64_t)sum[0];
    ps->fin.mean_staleness = sum[0] > 0 ? sum[1] / sum[0] : 0.0;
    for (int k = 0; k < 9; k++)
        ps->fin.hist[k] = (uint64_t)sum[2 + k];
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_stats(const gcoll_ps_t *ps, gcoll_ps_stats_t *stats_p)
{
    if (!ps || !stats_p)
        return GCOLL_ERR_INVALID;
    if (ps->finished) {
        *stats_p = ps->fin;
    } else {
        /* before finish: this worker's view only (the shard is the server thread's) */
        memset(stats_p, 0, sizeof(*stats_p));
        stats_p->clock = ps->clock;
        stats_p->max_gap = ps->max_gap;
    }
    stats_p->wait_s = ps->wait_s;
    return GCOLL_OK;
}
