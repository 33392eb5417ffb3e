/* ps.c: the in-job sharded parameter server with SSP's staleness bound (Ho et al. 2013),
 * as BytePS's summation service runs beside the workers. Every rank owns a shard of every
 * tensor; its server part is one long operation on the communicator's progress thread that
 * answers pulls once the clock bound allows and applies pushes (lib/training/ssp.c), while the
 * worker, on the caller's thread, talks to it through a mailbox. Messages between ranks are
 * point-to-point on the running operation's tags: a request channel (worker to owner: push,
 * pull, done) and a reply channel (owner to worker), each numbered in order per peer. The
 * worker's calls are in ps_worker.c, the messages' encoding and checks in ps_wire.c. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compress/compress.h"
#include "collectives/compressed/compressed.h"
#include "training/ps_int.h"
#include "base/util.h"

enum { CH_REQ = 1, CH_REP = 2 };
/* kind hashed into the messages' signature: the collectives' kinds stay below it */
enum { PS_SIG_KIND = 64 };
#define PS_SUB(ch, seq) (((uint32_t)(ch) << 28) | ((uint32_t)(seq)&0x0fffffffu))
#define NONE_CLOCK UINT64_MAX
/* the server's longest sleep on the transport: it wakes earlier on any message, a worker's
 * mailbox write (the communicator's wake fd) or an abort */
#define PS_NAP_MS 100
/* after an event the server looks at the mailbox and the transport every 50 us for this
 * long before it sleeps: the next message of a step (a pull after a push, a peer's answer)
 * usually comes within it, and a wake-up per message costs a scheduler turn on a busy host.
 * Short, because the polling thread shares its core with the rank's compute
 * (docs/results/local-sgd.md, "Throughput") */
#define PS_SPIN_NS 200000ull

gcoll_status_t gcoll_ps_invalid(gcoll_comm_t *comm, const char *what, const char *msg)
{
    return gcoll_comm_check_args(comm, what, 0, "%s", msg);
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_create(gcoll_comm_t *comm, const gcoll_ps_config_t *cfg,
                                            gcoll_ps_t **ps_p)
{
    if (!comm || !cfg || !ps_p)
        return GCOLL_ERR_INVALID;
    const char *w = "gcoll_ps_create";
    if (cfg->staleness < 0 || cfg->staleness > 1000)
        return gcoll_ps_invalid(comm, w, "staleness must be in [0, 1000]");
    if (!(cfg->lr >= 0.0f) || !isfinite(cfg->lr))
        return gcoll_ps_invalid(comm, w, "lr must be a finite number >= 0");
    if (cfg->weighting != GCOLL_PS_WEIGHT_INVERSE && cfg->weighting != GCOLL_PS_WEIGHT_NONE)
        return gcoll_ps_invalid(comm, w, "weighting must be inverse or none");
    const char *spec = cfg->compressor && *cfg->compressor ? cfg->compressor : "none";
    char err[256];
    if (gcoll_compressor_check(spec, err, sizeof(err)) != GCOLL_OK)
        return gcoll_comm_check_args(comm, w, 0, "push compressor: %s", err);
    const char *pspec =
        cfg->pull_compressor && *cfg->pull_compressor && strcmp(cfg->pull_compressor, "none") != 0
            ? cfg->pull_compressor
            : NULL;
    if (pspec && gcoll_compressor_check(pspec, err, sizeof(err)) != GCOLL_OK)
        return gcoll_comm_check_args(comm, w, 0, "pull compressor: %s", err);
    if (!(cfg->dc_lambda >= 0.0f) || !isfinite(cfg->dc_lambda))
        return gcoll_ps_invalid(comm, w, "dc_lambda must be a finite number >= 0");
    if (cfg->prefetch != 0 && cfg->prefetch != 1)
        return gcoll_ps_invalid(comm, w, "prefetch must be 0 or 1");
    gcoll_ps_t *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return GCOLL_ERR_NOMEM;
    ps->comm = comm;
    ps->cfg = *cfg;
    ps->cfg.compressor = NULL;
    ps->cfg.pull_compressor = NULL;
    ps->P = gcoll_comm_size(comm);
    ps->rank = gcoll_comm_rank(comm);
    pthread_mutex_init(&ps->lock, NULL);
    pthread_mutex_init(&ps->pool_lock, NULL);
    pthread_cond_init(&ps->cond, NULL);
    ps->kread = calloc((size_t)ps->P, sizeof(uint64_t));
    ps->kuse = calloc((size_t)ps->P, sizeof(uint64_t));
    ps->pull_want = malloc((size_t)ps->P * sizeof(uint64_t));
    ps->done_clock = malloc((size_t)ps->P * sizeof(uint64_t));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!ps->kread || !ps->kuse || !ps->pull_want || !ps->done_clock)
        goto err_ps;
    for (int p = 0; p < ps->P; p++)
        ps->pull_want[p] = ps->done_clock[p] = NONE_CLOCK;
    GCOLL_CHECK_GOTO(gcoll_compressor_create(spec, &ps->comp), st, err_ps);
    if (pspec) {
        GCOLL_CHECK_GOTO(gcoll_compressor_create(pspec, &ps->pcomp), st, err_ps);
        /* answers are encoded without a state (the view is their feedback): codecs whose
         * choice depends on one would pick the same coordinates every time */
        if (ps->pcomp->sparsify == GCOLL_SPARSIFY_RANDOMK ||
            ps->pcomp->sparsify == GCOLL_SPARSIFY_DGC) {
            st = gcoll_ps_invalid(comm, w,
                                  "pull compressor: random-k and DGC need a state "
                                  "per tensor; use top-k, a quantizer or fp16");
            goto err_ps;
        }
    }
    *ps_p = ps;
    return GCOLL_OK;
err_ps:
    gcoll_ps_destroy(ps);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_add_tensor(gcoll_ps_t *ps, float *param, size_t count,
                                                int *id_p)
{
    if (!ps)
        return GCOLL_ERR_INVALID;
    if (ps->started)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_add_tensor",
                                "tensors must be added before start");
    if (!param || count == 0 || count > UINT32_MAX)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_add_tensor",
                                "param NULL or count not in [1, 2^32)");
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 8;
        ps_tensor_t *nt = realloc(ps->t, (size_t)cap * sizeof(*nt));
        if (!nt)
            return GCOLL_ERR_NOMEM;
        ps->t = nt;
        ps->cap = cap;
    }
    ps_tensor_t *t = &ps->t[ps->n];
    memset(t, 0, sizeof(*t));
    t->param = param;
    t->count = count;
    t->off = calloc((size_t)ps->P, sizeof(size_t));
    t->len = calloc((size_t)ps->P, sizeof(size_t));
    t->st = calloc((size_t)ps->P, sizeof(*t->st));
    if (!t->off || !t->len || !t->st)
        goto err_nomem;
    for (int o = 0; o < ps->P; o++) {
        gcoll_span_t ch = gcoll_even_chunk(count, ps->P, o);
        t->off[o] = ch.off;
        t->len[o] = ch.len;
        /* fp32 as it is needs no residual: it would stay 0 exactly (e + g minus what
         * decodes), and the pushes go in one pass over the gradient instead of three */
        if (ch.len && !gcoll_ps_exact(ps->comp) &&
            gcoll_state_create(ps->comp, ch.len, &t->st[o]) != GCOLL_OK)
            goto err_nomem;
    }
    t->soff = ps->shard_n;
    ps->model_bytes += count * sizeof(float);
    ps->shard_n += t->len[ps->rank];
    if (id_p)
        *id_p = ps->n;
    ps->n++;
    return GCOLL_OK;
err_nomem:
    for (int o = 0; t->st && o < ps->P; o++)
        gcoll_state_destroy(t->st[o]);
    free(t->st);
    free(t->off);
    free(t->len);
    return GCOLL_ERR_NOMEM;
}

/* ---- messages ------------------------------------------------------------------ */

void gcoll_ps_counts(const gcoll_ps_t *ps, int o, size_t *cnt)
{
    for (int i = 0; i < ps->n; i++)
        cnt[i] = ps->t[i].len[o];
}

/* Size of the largest push to owner o (its shard slices encoded). */
static size_t push_cap(const gcoll_ps_t *ps, int o)
{
    size_t cnt[ps->n];
    gcoll_ps_counts(ps, o, cnt);
    return gcoll_ps_frame_bound(ps->comp, cnt, ps->n);
}

static size_t shard_floats(const gcoll_ps_t *ps, int o)
{
    size_t n = 0;
    for (int i = 0; i < ps->n; i++)
        n += ps->t[i].len[o];
    return n;
}

size_t gcoll_ps_reply_cap(const gcoll_ps_t *ps, int o)
{
    if (ps->pcomp) {
        size_t cnt[ps->n];
        gcoll_ps_counts(ps, o, cnt);
        return gcoll_ps_frame_bound(ps->pcomp, cnt, ps->n);
    }
    return GCOLL_PS_HDR + shard_floats(ps, o) * sizeof(float);
}

/* Under ps->lock. */
void gcoll_ps_enqueue(gcoll_ps_t *ps, ps_msg_t *first, ps_msg_t *last)
{
    if (ps->q_tail)
        ps->q_tail->next = first;
    else
        ps->q_head = first;
    ps->q_tail = last;
    if (ps->server_asleep) {
        uint64_t one = 1;
        ps->server_asleep = 0;
        if (write(ps->comm->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            GCOLL_WARN("parameter server: cannot wake the progress thread: %s", strerror(errno));
    }
}

/* The server's idle wait: on the transport, which also returns when the communicator's
 * wake fd is readable. The worker writes it only while server_asleep is set, so the
 * mailbox needs no polling; the fd is drained afterwards (re-armed if an abort wrote it,
 * which must stay visible to every later wait). */
static gcoll_status_t server_nap(gcoll_ps_t *ps, gcoll_comm_t *comm)
{
    pthread_mutex_lock(&ps->lock);
    int sleep = ps->q_head == NULL;
    ps->server_asleep = sleep;
    pthread_mutex_unlock(&ps->lock);
    if (!sleep)
        return GCOLL_OK;
    gcoll_status_t st = gcoll_net_progress(comm, PS_NAP_MS);
    pthread_mutex_lock(&ps->lock);
    ps->server_asleep = 0;
    pthread_mutex_unlock(&ps->lock);
    uint64_t v;
    if (read(comm->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v) && comm->abort_requested) {
        uint64_t one = 1;
        if (write(comm->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            GCOLL_WARN("parameter server: cannot re-arm the wake fd: %s", strerror(errno));
    }
    return st;
}

/* ---- the server operation (progress thread) --------------------------------------- */

typedef struct {
    gcoll_ps_t *ps;
    gcoll_comm_t *comm;
    uint32_t sig;
    /* [peer][2 channels][2 slots]: two receives posted per channel (sequence numbers s
     * and s + 1, slot s & 1), so a message that comes while the one before it is handled
     * lands in place, not in the transport's store of unexpected messages (a malloc and a
     * copy of up to a model's size: measured on 15-30% of the pushes at batch 64) */
    gcoll_treq_t *rreq;
    uint8_t **rbuf;
    size_t *rcap;
    uint32_t *seq_in, *seq_out; /* [peer][2] */
    ps_msg_t *inflight;
} ps_run_t;

#define IX(p, ch) (2 * (size_t)(p) + (size_t)((ch)-1))
#define IXS(p, ch, seq) (2 * IX(p, ch) + ((seq)&1u))

/* Posts the receive of message seq on channel ch from p, in its slot. */
static gcoll_status_t post_recv(ps_run_t *r, int p, int ch, uint32_t seq)
{
    size_t i = IXS(p, ch, seq);
    return gcoll_net_irecv(r->comm, &r->rreq[i], p, PS_SUB(ch, seq), r->sig, r->rbuf[i], r->rcap[i],
                           GCOLL_TREQ_ANYLEN);
}

static gcoll_status_t send_msg(ps_run_t *r, ps_msg_t *m)
{
    int ch = m->kind == GCOLL_PS_REPLY ? CH_REP : CH_REQ;
    size_t i = IX(m->peer, ch);
    gcoll_status_t st = gcoll_net_isend(r->comm, &m->req, m->peer, PS_SUB(ch, r->seq_out[i]),
                                        r->sig, m->buf, m->len);
    r->seq_out[i]++;
    if (st != GCOLL_OK) {
        gcoll_ps_msg_free(r->ps, m);
        return st;
    }
    m->next = r->inflight;
    r->inflight = m;
    return GCOLL_OK;
}

/* As a worker: owner o's answer, at shard clock k, is in; the last one wakes the pull. */
static gcoll_status_t answered(gcoll_ps_t *ps, int o, uint64_t k)
{
    pthread_mutex_lock(&ps->lock);
    ps->kread[o] = k;
    int left = --ps->pull_left;
    if (left == 0)
        pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    return left < 0 ? GCOLL_ERR_INVALID : GCOLL_OK;
}

/* As a worker: owner o's answer, dense (the shard) or a frame (the change since the last
 * answer, added). Checked against the slices of owner o before anything is written. */
gcoll_status_t gcoll_ps_take_reply(gcoll_ps_t *ps, int o, const uint8_t *b, size_t len)
{
    gcoll_ps_hdr_t h;
    if (gcoll_ps_get_hdr(b, len, &h) != GCOLL_OK || h.kind != GCOLL_PS_REPLY)
        return GCOLL_ERR_INVALID;
    if (ps->pcomp) {
        size_t cnt[ps->n];
        float *dst[ps->n];
        gcoll_ps_counts(ps, o, cnt);
        for (int i = 0; i < ps->n; i++)
            dst[i] = (ps->stage ? ps->t[i].stage : ps->t[i].param) + ps->t[i].off[o];
        if (h.b != 1 || h.c != (uint64_t)ps->n ||
            gcoll_ps_frame_decode(ps->pcomp, b, len, dst, cnt, ps->n, 1, NULL, 0) != GCOLL_OK)
            return GCOLL_ERR_INVALID;
    } else {
        size_t nf = shard_floats(ps, o);
        if (h.b != 0 || h.c != nf || len != GCOLL_PS_HDR + nf * sizeof(float))
            return GCOLL_ERR_INVALID;
        const uint8_t *p = b + GCOLL_PS_HDR;
        for (int i = 0; i < ps->n; i++) {
            ps_tensor_t *t = &ps->t[i];
            memcpy((ps->stage ? t->stage : t->param) + t->off[o], p, t->len[o] * sizeof(float));
            p += t->len[o] * sizeof(float);
        }
    }
    return answered(ps, o, h.a);
}

/* The owner's answer to worker w's pull: the shard as of now, with its clock; or, with a
 * pull codec, the compressed change from what w holds. */
static gcoll_status_t reply(ps_run_t *r, int w)
{
    gcoll_ps_t *ps = r->ps;
    if (w == ps->rank && !ps->pcomp) {
        /* this rank's own pull, dense: the shard straight into the params (or the
         * staging copy), without a message's two copies */
        for (int i = 0; i < ps->n; i++) {
            ps_tensor_t *t = &ps->t[i];
            memcpy((ps->stage ? t->stage : t->param) + t->off[w], ps->sh.w + t->soff,
                   t->len[w] * sizeof(float));
        }
        if (ps->sh.view)
            gcoll_ssp_snapshot(&ps->sh, w);
        ps->pull_want[w] = NONE_CLOCK;
        return answered(ps, w, ps->sh.clock);
    }
    size_t cap = gcoll_ps_reply_cap(ps, ps->rank);
    ps_msg_t *m = gcoll_ps_msg_new(ps, w, GCOLL_PS_REPLY, cap);
    if (!m)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    if (ps->pcomp) {
        size_t cnt[ps->n];
        gcoll_ps_counts(ps, ps->rank, cnt);
        gcoll_ps_put_hdr(m->buf, GCOLL_PS_REPLY, ps->sh.clock, 1, (uint64_t)ps->n);
        st = gcoll_ps_encode_delta(ps->pcomp, ps->sh.w, gcoll_ssp_view(&ps->sh, w), ps->scratch,
                                   cnt, ps->n, m->buf, cap, &m->len);
    } else {
        gcoll_ps_put_hdr(m->buf, GCOLL_PS_REPLY, ps->sh.clock, 0, ps->shard_n);
        if (ps->shard_n)
            memcpy(m->buf + GCOLL_PS_HDR, ps->sh.w, ps->shard_n * sizeof(float));
        m->len = cap;
        if (ps->sh.view)
            gcoll_ssp_snapshot(&ps->sh, w);
    }
    if (st != GCOLL_OK) {
        gcoll_ps_msg_free(ps, m);
        return st;
    }
    ps->pull_want[w] = NONE_CLOCK;
    if (w != ps->rank)
        return send_msg(r, m);
    st = gcoll_ps_take_reply(ps, ps->rank, m->buf, m->len);
    gcoll_ps_msg_free(ps, m);
    return st;
}

static gcoll_status_t serve_pulls(ps_run_t *r)
{
    gcoll_ps_t *ps = r->ps;
    for (int w = 0; w < ps->P; w++)
        if (ps->pull_want[w] != NONE_CLOCK && gcoll_ssp_can_read(&ps->sh, ps->pull_want[w]))
            GCOLL_CHECK(reply(r, w));
    return GCOLL_OK;
}

/* As an owner: worker w's request (push, pull or done). Every field is checked against
 * len and the shard before anything changes. */
static gcoll_status_t take_request(ps_run_t *r, int w, const uint8_t *b, size_t len)
{
    gcoll_ps_t *ps = r->ps;
    gcoll_comm_t *comm = r->comm;
    gcoll_ps_hdr_t h;
    if (gcoll_ps_get_hdr(b, len, &h) != GCOLL_OK) {
        gcoll_comm_set_error(comm, "parameter server: malformed message from rank %d", w);
        return GCOLL_ERR_INVALID;
    }
    uint32_t kind = h.kind;
    uint64_t c = h.a, kread = h.b;
    if (kind == GCOLL_PS_PULL) {
        /* for the worker's next clock, or (prefetched, asked before its push) the one
         * after; the push's check holds the bound either way */
        if (ps->pull_want[w] != NONE_CLOCK || ps->done_clock[w] != NONE_CLOCK ||
            (c != ps->sh.wclock[w] && c != ps->sh.wclock[w] + 1)) {
            gcoll_comm_set_error(comm, "parameter server: unexpected pull from rank %d", w);
            return GCOLL_ERR_INVALID;
        }
        ps->pull_want[w] = c;
        /* answered at once when the bound allows, before the requests queued behind it
         * (a prefetch is then answered before the push that follows it) */
        return gcoll_ssp_can_read(&ps->sh, c) ? reply(r, w) : GCOLL_OK;
    }
    if (kind == GCOLL_PS_DONE) {
        if (ps->done_clock[w] != NONE_CLOCK || c != ps->sh.wclock[w]) {
            gcoll_comm_set_error(comm,
                                 "parameter server: rank %d finished at clock %llu with "
                                 "%llu updates received",
                                 w, (unsigned long long)c, (unsigned long long)ps->sh.wclock[w]);
            return GCOLL_ERR_INVALID;
        }
        ps->done_clock[w] = c;
        ps->ndone++;
        return GCOLL_OK;
    }
    if (kind != GCOLL_PS_PUSH) {
        gcoll_comm_set_error(comm, "parameter server: message kind %u from rank %d", kind, w);
        return GCOLL_ERR_INVALID;
    }
    char why[256];
    if (gcoll_ssp_check(&ps->sh, w, c, kread, why, sizeof(why)) != GCOLL_OK) {
        gcoll_comm_set_error(comm, "parameter server: push from rank %d: %s", w, why);
        return GCOLL_ERR_INVALID;
    }
    if (h.c != (uint64_t)ps->n) {
        gcoll_comm_set_error(comm, "parameter server: rank %d pushed %llu tensors, %d registered",
                             w, (unsigned long long)h.c, ps->n);
        return GCOLL_ERR_MISMATCH;
    }
    size_t cnt[ps->n];
    float *dst[ps->n];
    gcoll_ps_counts(ps, ps->rank, cnt);
    float scale;
    float *row = gcoll_ssp_row(&ps->sh, c, kread, &scale);
    const int fused = ps->cfg.dc_lambda <= 0 && gcoll_ps_exact(ps->comp);
    for (int i = 0; i < ps->n; i++) /* fp32 as it is goes into the clock's sum directly */
        dst[i] = (fused ? row : ps->tmp) + ps->t[i].soff;
    gcoll_status_t st =
        fused ? gcoll_ps_frame_axpy(ps->comp, b, len, dst, cnt, ps->n, scale, why, sizeof(why))
              : gcoll_ps_frame_decode(ps->comp, b, len, dst, cnt, ps->n, 0, why, sizeof(why));
    if (st != GCOLL_OK) {
        gcoll_comm_set_error(comm, "parameter server: push from rank %d: %s", w, why);
        return st;
    }
    if (!fused) {
        if (ps->cfg.dc_lambda > 0)
            gcoll_ssp_compensate(&ps->sh, w, ps->tmp, ps->cfg.dc_lambda);
        for (size_t j = 0; j < ps->shard_n; j++)
            row[j] += scale * ps->tmp[j];
    }
    if (gcoll_ssp_commit(&ps->sh, w, c, kread))
        GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "parameter server: shard at clock %llu",
                    (unsigned long long)ps->sh.clock);
    return GCOLL_OK;
}

static int finished(const ps_run_t *r)
{
    const gcoll_ps_t *ps = r->ps;
    if (ps->ndone < ps->P || r->inflight)
        return 0;
    for (int w = 0; w < ps->P; w++)
        if (ps->done_clock[w] != ps->sh.clock || ps->pull_want[w] != NONE_CLOCK)
            return 0;
    return 1;
}

/* The receive buffers of every peer's two channels, sized for the largest message each
 * can carry. */
static gcoll_status_t run_alloc(ps_run_t *r)
{
    gcoll_ps_t *ps = r->ps;
    const int P = ps->P, me = ps->rank;
    r->rreq = calloc(4 * (size_t)P, sizeof(*r->rreq));
    r->rbuf = calloc(4 * (size_t)P, sizeof(*r->rbuf));
    r->rcap = calloc(4 * (size_t)P, sizeof(*r->rcap));
    r->seq_in = calloc(2 * (size_t)P, sizeof(uint32_t));
    r->seq_out = calloc(2 * (size_t)P, sizeof(uint32_t));
    if (!r->rreq || !r->rbuf || !r->rcap || !r->seq_in || !r->seq_out)
        return GCOLL_ERR_NOMEM;
    for (int p = 0; p < P; p++) {
        if (p == me)
            continue;
        for (uint32_t k = 0; k < 2; k++) {
            r->rcap[IXS(p, CH_REQ, k)] = push_cap(ps, me);
            r->rcap[IXS(p, CH_REP, k)] = gcoll_ps_reply_cap(ps, p);
            for (int ch = CH_REQ; ch <= CH_REP; ch++)
                if (!(r->rbuf[IXS(p, ch, k)] = malloc(r->rcap[IXS(p, ch, k)])))
                    return GCOLL_ERR_NOMEM;
        }
    }
    return GCOLL_OK;
}

/* The worker's messages: its own requests are taken here, the others sent. On an error the
 * rest of the queue is dropped. */
static gcoll_status_t run_queue(ps_run_t *r, int *events)
{
    gcoll_ps_t *ps = r->ps;
    gcoll_status_t st = GCOLL_OK;
    pthread_mutex_lock(&ps->lock);
    ps_msg_t *q = ps->q_head;
    ps->q_head = ps->q_tail = NULL;
    pthread_mutex_unlock(&ps->lock);
    while (q) {
        ps_msg_t *m = q;
        q = q->next;
        m->next = NULL;
        (*events)++;
        if (m->peer == ps->rank) {
            st = take_request(r, ps->rank, m->buf, m->len);
            gcoll_ps_msg_free(ps, m);
        } else {
            st = send_msg(r, m);
        }
        if (st != GCOLL_OK) {
            while (q) {
                m = q;
                q = q->next;
                gcoll_ps_msg_free(ps, m);
            }
            return st;
        }
    }
    return GCOLL_OK;
}

/* Peers' messages: handle each that arrived, in order per channel, and post the receive
 * two messages on in the slot it freed. */
static gcoll_status_t run_peers(ps_run_t *r, int *events)
{
    gcoll_ps_t *ps = r->ps;
    gcoll_comm_t *comm = r->comm;
    for (int p = 0; p < ps->P; p++) {
        for (int ch = CH_REQ; ch <= CH_REP && p != ps->rank;) {
            uint32_t seq = r->seq_in[IX(p, ch)];
            size_t i = IXS(p, ch, seq);
            int done;
            GCOLL_CHECK(gcoll_net_done(comm, &r->rreq[i], &done));
            if (!done) {
                ch++;
                continue;
            }
            (*events)++;
            size_t nb = r->rreq[i].nbytes;
            if (ch == CH_REQ) {
                GCOLL_CHECK(take_request(r, p, r->rbuf[i], nb));
            } else if (gcoll_ps_take_reply(ps, p, r->rbuf[i], nb) != GCOLL_OK) {
                gcoll_comm_set_error(comm,
                                     "parameter server: malformed or unexpected "
                                     "reply from rank %d",
                                     p);
                return GCOLL_ERR_INVALID;
            }
            r->seq_in[IX(p, ch)]++;
            memset(&r->rreq[i], 0, sizeof(r->rreq[i]));
            GCOLL_CHECK(post_recv(r, p, ch, seq + 2)); /* then this channel's next */
        }
    }
    return GCOLL_OK;
}

/* Frees the sends that completed. */
static gcoll_status_t run_reap(ps_run_t *r, int *events)
{
    for (ps_msg_t **pm = &r->inflight; *pm;) {
        int done;
        GCOLL_CHECK(gcoll_net_done(r->comm, &(*pm)->req, &done));
        if (!done) {
            pm = &(*pm)->next;
            continue;
        }
        ps_msg_t *m = *pm;
        *pm = m->next;
        gcoll_ps_msg_free(r->ps, m);
        (*events)++;
    }
    return GCOLL_OK;
}

/* After a pass with no event: spin briefly, then nap; GCOLL_ERR_TIMEOUT once nothing has
 * come for the deadline. */
static gcoll_status_t run_idle(ps_run_t *r, int events, uint64_t *quiet_since, uint64_t *quiet_ns)
{
    gcoll_comm_t *comm = r->comm;
    uint64_t now = gcoll_time_ms();
    if (events) {
        *quiet_since = now;
        *quiet_ns = gcoll_time_ns();
    } else if (now - *quiet_since > (uint64_t)comm->cfg.timeout_ms) {
        gcoll_comm_set_error(comm,
                             "parameter server: no message for %lld ms "
                             "(GCOLL_TIMEOUT_MS)",
                             (long long)comm->cfg.timeout_ms);
        return GCOLL_ERR_TIMEOUT;
    } else if (gcoll_time_ns() - *quiet_ns < PS_SPIN_NS) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    } else {
        GCOLL_CHECK(server_nap(r->ps, comm));
    }
    return GCOLL_OK;
}

/* Withdraws the posted receives (once posted) and the sends in flight, frees the buffers. */
static void run_free(ps_run_t *r, int posted)
{
    const int P = r->ps->P;
    if (posted && r->rreq)
        gcoll_net_cancel(r->comm, r->rreq, 4 * P);
    while (r->inflight) {
        ps_msg_t *m = r->inflight;
        r->inflight = m->next;
        if (!m->req.done)
            gcoll_net_cancel(r->comm, &m->req, 1);
        gcoll_ps_msg_free(r->ps, m);
    }
    for (size_t i = 0; r->rbuf && i < 4 * (size_t)P; i++)
        free(r->rbuf[i]);
    free(r->rbuf);
    free(r->rreq);
    free(r->rcap);
    free(r->seq_in);
    free(r->seq_out);
}

static gcoll_status_t ps_run(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_ps_t *ps = req->a.ext;
    const int P = ps->P, me = ps->rank;
    ps_run_t r = {.ps = ps, .comm = comm};
    /* not the shard size, which differs between ranks */
    r.sig = gcoll_call_sig(PS_SIG_KIND, (size_t)ps->n, 0, 0, ps->cfg.staleness);
    int posted = 0;
    gcoll_status_t st = run_alloc(&r);
    if (st != GCOLL_OK)
        goto out;
    for (int p = 0; p < P; p++)
        for (int ch = CH_REQ; ch <= CH_REP && p != me; ch++)
            for (uint32_t seq = 0; seq < 2; seq++)
                GCOLL_CHECK_GOTO(post_recv(&r, p, ch, seq), st, out);
    posted = 1;
    uint64_t quiet_since = gcoll_time_ms(), quiet_ns = gcoll_time_ns();
    for (;;) {
        int events = 0;
        if ((st = run_queue(&r, &events)) != GCOLL_OK)
            goto out;
        if (comm->abort_requested) {
            gcoll_comm_set_error(comm, "gcoll_comm_abort was called");
            st = GCOLL_ERR_ABORTED;
            goto out;
        }
        GCOLL_CHECK_GOTO(gcoll_net_progress(comm, 0), st, out);
        GCOLL_CHECK_GOTO(run_peers(&r, &events), st, out);
        GCOLL_CHECK_GOTO(run_reap(&r, &events), st, out);
        GCOLL_CHECK_GOTO(serve_pulls(&r), st, out);
        if (finished(&r)) {
            st = GCOLL_OK;
            goto out;
        }
        GCOLL_CHECK_GOTO(run_idle(&r, events, &quiet_since, &quiet_ns), st, out);
    }
out:
    run_free(&r, posted);
    pthread_mutex_lock(&ps->lock);
    if (st != GCOLL_OK && ps->err == GCOLL_OK)
        ps->err = st;
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    return st;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_start(gcoll_ps_t *ps)
{
    if (!ps)
        return GCOLL_ERR_INVALID;
    if (ps->started)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_start", "already started");
    if (ps->n == 0)
        return gcoll_ps_invalid(ps->comm, "gcoll_ps_start", "no tensors registered");
    /* every shard starts from this rank's (equal) initial params */
    float *init = malloc((ps->shard_n ? ps->shard_n : 1) * sizeof(float));
    ps->tmp = malloc((ps->shard_n ? ps->shard_n : 1) * sizeof(float));
    ps->scratch = malloc((ps->shard_n ? ps->shard_n : 1) * sizeof(float));
    if (!init || !ps->tmp || !ps->scratch) {
        free(init);
        return GCOLL_ERR_NOMEM;
    }
    for (int i = 0; i < ps->n; i++)
        memcpy(init + ps->t[i].soff, ps->t[i].param + ps->t[i].off[ps->rank],
               ps->t[i].len[ps->rank] * sizeof(float));
    gcoll_status_t st = gcoll_ssp_init(&ps->sh, ps->P, ps->cfg.staleness, ps->shard_n, init,
                                       ps->cfg.lr, ps->cfg.weighting);
    free(init);
    if (st == GCOLL_OK && (ps->pcomp || ps->cfg.dc_lambda > 0))
        st = gcoll_ssp_enable_views(&ps->sh);
    if (st == GCOLL_OK && ps->cfg.prefetch) {
        /* the staging copy starts as the params, which compressed pulls' deltas update */
        size_t total = 0;
        for (int i = 0; i < ps->n; i++)
            total += ps->t[i].count;
        ps->stage = malloc(total * sizeof(float));
        ps->own = calloc(total, sizeof(float));
        ps->own_scale = calloc((size_t)ps->P, sizeof(float));
        if (!ps->stage || !ps->own || !ps->own_scale)
            st = GCOLL_ERR_NOMEM;
        size_t off = 0;
        for (int i = 0; st == GCOLL_OK && i < ps->n; off += ps->t[i].count, i++) {
            ps->t[i].stage = ps->stage + off;
            ps->t[i].own = ps->own + off;
            memcpy(ps->t[i].stage, ps->t[i].param, ps->t[i].count * sizeof(float));
        }
    }
    if (st != GCOLL_OK)
        return st;
    gcoll_args_t a = {.ext = ps};
    gcoll_request_t *req = gcoll_request_new(ps->comm, "gcoll_ps", ps_run, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    GCOLL_CHECK(gcoll_comm_submit(ps->comm, req, &ps->req));
    ps->started = 1;
    return GCOLL_OK;
}

GCOLL_EXPORT void gcoll_ps_destroy(gcoll_ps_t *ps)
{
    if (!ps)
        return;
    if (ps->req) { /* still running: stop the server, or its thread uses freed memory */
        gcoll_comm_abort(ps->comm);
        (void)gcoll_wait(ps->req);
    }
    while (ps->q_head) {
        ps_msg_t *m = ps->q_head;
        ps->q_head = m->next;
        gcoll_ps_msg_free(ps, m);
    }
    for (int i = 0; i < ps->n; i++) {
        for (int o = 0; o < ps->P; o++)
            gcoll_state_destroy(ps->t[i].st[o]);
        free(ps->t[i].st);
        free(ps->t[i].off);
        free(ps->t[i].len);
    }
    free(ps->t);
    gcoll_ssp_free(&ps->sh);
    free(ps->tmp);
    free(ps->scratch);
    free(ps->kread);
    free(ps->kuse);
    free(ps->stage);
    free(ps->own);
    free(ps->own_scale);
    free(ps->pull_want);
    free(ps->done_clock);
    gcoll_compressor_destroy(ps->comp);
    gcoll_compressor_destroy(ps->pcomp);
    while (ps->pool) {
        ps_msg_t *m = ps->pool;
        ps->pool = m->next;
        free(m->buf);
        free(m);
    }
    pthread_mutex_destroy(&ps->pool_lock);
    pthread_mutex_destroy(&ps->lock);
    pthread_cond_destroy(&ps->cond);
    free(ps);
}
