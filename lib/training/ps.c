/* ps.c: the in-job sharded parameter server with SSP's staleness bound (Ho et al. 2013),
 * as BytePS's summation service runs beside the workers. Every rank owns a shard of every
 * tensor; its server part is one long operation on the communicator's progress thread that
 * answers pulls once the clock bound allows and applies pushes (lib/training/ssp.c), while the
 * worker, on the caller's thread, talks to it through a mailbox. Messages between ranks are
 * point-to-point on the running operation's tags: a request channel (worker to owner: push,
 * pull, done) and a reply channel (owner to worker), each numbered in order per peer. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "compressed.h"
#include "ssp.h"
#include "util.h"

enum { PS_MAGIC = 0x31535047u /* "GPS1" */, K_PUSH = 1, K_PULL = 2, K_DONE = 3, K_REPLY = 4 };
enum { CH_REQ = 1, CH_REP = 2 };
enum { PS_HDR = 32 };
/* kind hashed into the messages' signature: the collectives' kinds stay below it */
enum { PS_SIG_KIND = 64 };
#define PS_SUB(ch, seq) (((uint32_t)(ch) << 28) | ((uint32_t)(seq)&0x0fffffffu))
#define NONE_CLOCK UINT64_MAX
/* after its last event the server looks at the mailbox every 50 us for this long, then
 * waits on the transport 1 ms at a time */
#define PS_FAST_NS 20000000ull

typedef struct {
    float *param;
    size_t count;
    size_t *off, *len;           /* per owner */
    size_t soff;                 /* this rank's slice within its shard */
    gcoll_tensor_state_t **st;   /* per owner: the worker's residual of that slice */
} ps_tensor_t;

typedef struct ps_msg {
    struct ps_msg *next;
    int peer, kind;
    uint8_t *buf;
    size_t len;
    gcoll_treq_t req;
} ps_msg_t;

struct gcoll_ps {
    gcoll_comm_t *comm;
    gcoll_ps_config_t cfg;
    gcoll_compressor_t *comp;
    ps_tensor_t *t;
    int n, cap, P, rank;
    size_t shard_n;
    int started;
    /* worker side: the caller's thread; kread is written by the server thread during a
     * pull, while the worker waits */
    uint64_t clock, max_gap;
    int pulled;
    uint64_t *kread;
    double wait_s;
    /* mailbox, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ps_msg_t *q_head, *q_tail;
    int pull_left;
    gcoll_status_t err;
    gcoll_request_t *req;
    /* server side: the progress thread only */
    gcoll_ssp_shard_t sh;
    uint64_t *pull_want, *done_clock;
    int ndone;
    float *tmp; /* decoded push */
    /* after finish */
    gcoll_ps_stats_t fin;
    int finished;
};

static gcoll_status_t ps_invalid(gcoll_comm_t *comm, const char *what, const char *msg)
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
        return ps_invalid(comm, w, "staleness must be in [0, 1000]");
    if (!(cfg->lr >= 0.0f) || !isfinite(cfg->lr))
        return ps_invalid(comm, w, "lr must be a finite number >= 0");
    if (cfg->weighting != GCOLL_PS_WEIGHT_INVERSE && cfg->weighting != GCOLL_PS_WEIGHT_NONE)
        return ps_invalid(comm, w, "weighting must be inverse or none");
    const char *spec = cfg->compressor && *cfg->compressor ? cfg->compressor : "none";
    char err[256];
    if (gcoll_compressor_check(spec, err, sizeof(err)) != GCOLL_OK)
        return gcoll_comm_check_args(comm, w, 0, "push compressor: %s", err);
    gcoll_ps_t *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return GCOLL_ERR_NOMEM;
    ps->comm = comm;
    ps->cfg = *cfg;
    ps->cfg.compressor = NULL;
    ps->P = gcoll_comm_size(comm);
    ps->rank = gcoll_comm_rank(comm);
    pthread_mutex_init(&ps->lock, NULL);
    pthread_cond_init(&ps->cond, NULL);
    ps->kread = calloc((size_t)ps->P, sizeof(uint64_t));
    ps->pull_want = malloc((size_t)ps->P * sizeof(uint64_t));
    ps->done_clock = malloc((size_t)ps->P * sizeof(uint64_t));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!ps->kread || !ps->pull_want || !ps->done_clock)
        goto err_ps;
    for (int p = 0; p < ps->P; p++)
        ps->pull_want[p] = ps->done_clock[p] = NONE_CLOCK;
    GCOLL_CHECK_GOTO(gcoll_compressor_create(spec, &ps->comp), st, err_ps);
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
        return ps_invalid(ps->comm, "gcoll_ps_add_tensor", "tensors must be added before start");
    if (!param || count == 0 || count > UINT32_MAX)
        return ps_invalid(ps->comm, "gcoll_ps_add_tensor", "param NULL or count not in [1, 2^32)");
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
        if (ch.len && gcoll_state_create(ps->comp, ch.len, &t->st[o]) != GCOLL_OK)
            goto err_nomem;
    }
    t->soff = ps->shard_n;
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

static ps_msg_t *msg_new(int peer, int kind, size_t cap)
{
    ps_msg_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->buf = malloc(cap < PS_HDR ? PS_HDR : cap);
    if (!m->buf) {
        free(m);
        return NULL;
    }
    m->peer = peer;
    m->kind = kind;
    return m;
}

static void msg_free(ps_msg_t *m)
{
    if (m) {
        free(m->buf);
        free(m);
    }
}

static void put_hdr(uint8_t *b, int kind, uint64_t a, uint64_t c)
{
    gcoll_put_u32(b, PS_MAGIC);
    gcoll_put_u32(b + 4, (uint32_t)kind);
    gcoll_put_u64(b + 8, a);
    gcoll_put_u64(b + 16, c);
    gcoll_put_u64(b + 24, 0);
}

/* Size of the largest push to owner o (its shard slices encoded) and of its reply. */
static size_t push_cap(const gcoll_ps_t *ps, int o)
{
    size_t cap = PS_HDR;
    for (int i = 0; i < ps->n; i++)
        cap += 4 + (ps->t[i].len[o] ? gcoll_compressor_bound(ps->comp, ps->t[i].len[o]) : 0);
    return cap;
}

static size_t reply_len(const gcoll_ps_t *ps, int o)
{
    size_t n = 0;
    for (int i = 0; i < ps->n; i++)
        n += ps->t[i].len[o];
    return PS_HDR + n * sizeof(float);
}

static void enqueue(gcoll_ps_t *ps, ps_msg_t *first, ps_msg_t *last)
{
    if (ps->q_tail)
        ps->q_tail->next = first;
    else
        ps->q_head = first;
    ps->q_tail = last;
}

/* ---- the server operation (progress thread) --------------------------------------- */

typedef struct {
    gcoll_ps_t *ps;
    gcoll_comm_t *comm;
    uint32_t sig;
    gcoll_treq_t *rreq;   /* [peer][2]: the posted receive of each channel */
    uint8_t **rbuf;       /* [peer][2] */
    size_t *rcap;         /* [peer][2] */
    uint32_t *seq_in, *seq_out; /* [peer][2] */
    ps_msg_t *inflight;
} ps_run_t;

#define IX(p, ch) (2 * (size_t)(p) + (size_t)((ch)-1))

static gcoll_status_t post_recv(ps_run_t *r, int p, int ch)
{
    size_t i = IX(p, ch);
    return gcoll_net_irecv(r->comm, &r->rreq[i], p, PS_SUB(ch, r->seq_in[i]), r->sig, r->rbuf[i],
                           r->rcap[i], GCOLL_TREQ_ANYLEN);
}

static gcoll_status_t send_msg(ps_run_t *r, ps_msg_t *m)
{
    int ch = m->kind == K_REPLY ? CH_REP : CH_REQ;
    size_t i = IX(m->peer, ch);
    gcoll_status_t st = gcoll_net_isend(r->comm, &m->req, m->peer, PS_SUB(ch, r->seq_out[i]),
                                        r->sig, m->buf, m->len);
    r->seq_out[i]++;
    if (st != GCOLL_OK) {
        msg_free(m);
        return st;
    }
    m->next = r->inflight;
    r->inflight = m;
    return GCOLL_OK;
}

/* The owner's answer to worker w's pull: the shard as of now, with its clock. */
static gcoll_status_t reply(ps_run_t *r, int w);

/* As a worker: owner o's reply lands in the params. */
static gcoll_status_t take_reply(gcoll_ps_t *ps, int o, const uint8_t *b, size_t len)
{
    if (len != reply_len(ps, o) || gcoll_get_u32(b) != PS_MAGIC || gcoll_get_u32(b + 4) != K_REPLY)
        return GCOLL_ERR_INVALID;
    const uint8_t *p = b + PS_HDR;
    for (int i = 0; i < ps->n; i++) {
        ps_tensor_t *t = &ps->t[i];
        memcpy(t->param + t->off[o], p, t->len[o] * sizeof(float));
        p += t->len[o] * sizeof(float);
    }
    pthread_mutex_lock(&ps->lock);
    ps->kread[o] = gcoll_get_u64(b + 8);
    int left = --ps->pull_left;
    if (left == 0)
        pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    return left < 0 ? GCOLL_ERR_INVALID : GCOLL_OK;
}

static gcoll_status_t reply(ps_run_t *r, int w)
{
    gcoll_ps_t *ps = r->ps;
    size_t len = reply_len(ps, ps->rank);
    ps_msg_t *m = msg_new(w, K_REPLY, len);
    if (!m)
        return GCOLL_ERR_NOMEM;
    put_hdr(m->buf, K_REPLY, ps->sh.clock, ps->shard_n);
    if (ps->shard_n)
        memcpy(m->buf + PS_HDR, ps->sh.w, ps->shard_n * sizeof(float));
    m->len = len;
    ps->pull_want[w] = NONE_CLOCK;
    if (w != ps->rank)
        return send_msg(r, m);
    gcoll_status_t st = take_reply(ps, ps->rank, m->buf, m->len);
    msg_free(m);
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
    if (len < PS_HDR || gcoll_get_u32(b) != PS_MAGIC) {
        gcoll_comm_set_error(comm, "parameter server: malformed message from rank %d", w);
        return GCOLL_ERR_INVALID;
    }
    uint32_t kind = gcoll_get_u32(b + 4);
    uint64_t c = gcoll_get_u64(b + 8), kread = gcoll_get_u64(b + 16);
    if (kind == K_PULL) {
        if (ps->pull_want[w] != NONE_CLOCK || ps->done_clock[w] != NONE_CLOCK ||
            c != ps->sh.wclock[w]) {
            gcoll_comm_set_error(comm, "parameter server: unexpected pull from rank %d", w);
            return GCOLL_ERR_INVALID;
        }
        ps->pull_want[w] = c;
        return GCOLL_OK;
    }
    if (kind == K_DONE) {
        if (ps->done_clock[w] != NONE_CLOCK || c != ps->sh.wclock[w]) {
            gcoll_comm_set_error(comm, "parameter server: rank %d finished at clock %llu with "
                                       "%llu updates received",
                                 w, (unsigned long long)c,
                                 (unsigned long long)ps->sh.wclock[w]);
            return GCOLL_ERR_INVALID;
        }
        ps->done_clock[w] = c;
        ps->ndone++;
        return GCOLL_OK;
    }
    if (kind != K_PUSH) {
        gcoll_comm_set_error(comm, "parameter server: message kind %u from rank %d", kind, w);
        return GCOLL_ERR_INVALID;
    }
    char why[256];
    if (gcoll_ssp_check(&ps->sh, w, c, kread, why, sizeof(why)) != GCOLL_OK) {
        gcoll_comm_set_error(comm, "parameter server: push from rank %d: %s", w, why);
        return GCOLL_ERR_INVALID;
    }
    if (gcoll_get_u64(b + 24) != (uint64_t)ps->n) {
        gcoll_comm_set_error(comm, "parameter server: rank %d pushed %llu tensors, %d registered",
                             w, (unsigned long long)gcoll_get_u64(b + 24), ps->n);
        return GCOLL_ERR_MISMATCH;
    }
    size_t pos = PS_HDR;
    for (int i = 0; i < ps->n; i++) {
        ps_tensor_t *t = &ps->t[i];
        size_t n = t->len[ps->rank];
        if (len - pos < 4) {
            gcoll_comm_set_error(comm, "parameter server: push from rank %d truncated", w);
            return GCOLL_ERR_INVALID;
        }
        size_t l = gcoll_get_u32(b + pos);
        pos += 4;
        if (l > len - pos || (n == 0 && l != 0)) {
            gcoll_comm_set_error(comm, "parameter server: push from rank %d: tensor %d length %zu "
                                       "past the message", w, i, l);
            return GCOLL_ERR_INVALID;
        }
        if (n) {
            gcoll_status_t st = gcoll_decode(ps->comp, b + pos, l, ps->tmp + t->soff, n, 0);
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "parameter server: push from rank %d: tensor %d does "
                                           "not decode (%s)", w, i, gcoll_status_string(st));
                return st;
            }
        }
        pos += l;
    }
    if (pos != len) {
        gcoll_comm_set_error(comm, "parameter server: push from rank %d: %zu trailing bytes", w,
                             len - pos);
        return GCOLL_ERR_INVALID;
    }
    float scale;
    float *row = gcoll_ssp_row(&ps->sh, c, kread, &scale);
    for (size_t j = 0; j < ps->shard_n; j++)
        row[j] += scale * ps->tmp[j];
    int done = gcoll_ssp_commit(&ps->sh, w, c, kread);
    if (done)
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

static gcoll_status_t ps_run(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_ps_t *ps = req->a.ext;
    const int P = ps->P, me = ps->rank;
    ps_run_t r = {.ps = ps, .comm = comm};
    /* not the shard size, which differs between ranks */
    r.sig = gcoll_call_sig(PS_SIG_KIND, (size_t)ps->n, 0, 0, ps->cfg.staleness);
    r.rreq = calloc(2 * (size_t)P, sizeof(*r.rreq));
    r.rbuf = calloc(2 * (size_t)P, sizeof(*r.rbuf));
    r.rcap = calloc(2 * (size_t)P, sizeof(*r.rcap));
    r.seq_in = calloc(2 * (size_t)P, sizeof(uint32_t));
    r.seq_out = calloc(2 * (size_t)P, sizeof(uint32_t));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    int posted = 0;
    if (!r.rreq || !r.rbuf || !r.rcap || !r.seq_in || !r.seq_out)
        goto out;
    for (int p = 0; p < P; p++) {
        if (p == me)
            continue;
        r.rcap[IX(p, CH_REQ)] = push_cap(ps, me);
        r.rcap[IX(p, CH_REP)] = reply_len(ps, p);
        for (int ch = CH_REQ; ch <= CH_REP; ch++)
            if (!(r.rbuf[IX(p, ch)] = malloc(r.rcap[IX(p, ch)])))
                goto out;
    }
    for (int p = 0; p < P; p++)
        for (int ch = CH_REQ; ch <= CH_REP && p != me; ch++)
            GCOLL_CHECK_GOTO(post_recv(&r, p, ch), st, out);
    posted = 1;
    uint64_t quiet_since = gcoll_time_ms(), quiet_ns = gcoll_time_ns();
    for (;;) {
        int events = 0;
        /* the worker's messages */
        pthread_mutex_lock(&ps->lock);
        ps_msg_t *q = ps->q_head;
        ps->q_head = ps->q_tail = NULL;
        pthread_mutex_unlock(&ps->lock);
        while (q) {
            ps_msg_t *m = q;
            q = q->next;
            m->next = NULL;
            events++;
            if (m->peer == me) {
                st = take_request(&r, me, m->buf, m->len);
                msg_free(m);
            } else {
                st = send_msg(&r, m);
            }
            if (st != GCOLL_OK) {
                while (q) {
                    m = q;
                    q = q->next;
                    msg_free(m);
                }
                goto out;
            }
        }
        if (comm->abort_requested) {
            gcoll_comm_set_error(comm, "gcoll_comm_abort was called");
            st = GCOLL_ERR_ABORTED;
            goto out;
        }
        GCOLL_CHECK_GOTO(gcoll_net_progress(comm, 0), st, out);
        /* peers' messages: handle, then receive the next on that channel */
        for (int p = 0; p < P; p++) {
            for (int ch = CH_REQ; ch <= CH_REP && p != me; ch++) {
                size_t i = IX(p, ch);
                int done;
                GCOLL_CHECK_GOTO(gcoll_net_done(comm, &r.rreq[i], &done), st, out);
                if (!done)
                    continue;
                events++;
                size_t nb = r.rreq[i].nbytes;
                if (ch == CH_REQ) {
                    GCOLL_CHECK_GOTO(take_request(&r, p, r.rbuf[i], nb), st, out);
                } else if (take_reply(ps, p, r.rbuf[i], nb) != GCOLL_OK) {
                    gcoll_comm_set_error(comm, "parameter server: malformed or unexpected "
                                               "reply from rank %d", p);
                    st = GCOLL_ERR_INVALID;
                    goto out;
                }
                r.seq_in[i]++;
                memset(&r.rreq[i], 0, sizeof(r.rreq[i]));
                GCOLL_CHECK_GOTO(post_recv(&r, p, ch), st, out);
            }
        }
        for (ps_msg_t **pm = &r.inflight; *pm;) {
            int done;
            GCOLL_CHECK_GOTO(gcoll_net_done(comm, &(*pm)->req, &done), st, out);
            if (!done) {
                pm = &(*pm)->next;
                continue;
            }
            ps_msg_t *m = *pm;
            *pm = m->next;
            msg_free(m);
            events++;
        }
        GCOLL_CHECK_GOTO(serve_pulls(&r), st, out);
        if (finished(&r)) {
            st = GCOLL_OK;
            goto out;
        }
        uint64_t now = gcoll_time_ms();
        if (events) {
            quiet_since = now;
            quiet_ns = gcoll_time_ns();
        } else if (now - quiet_since > (uint64_t)comm->cfg.timeout_ms) {
            gcoll_comm_set_error(comm, "parameter server: no message for %lld ms "
                                       "(GCOLL_TIMEOUT_MS)", (long long)comm->cfg.timeout_ms);
            st = GCOLL_ERR_TIMEOUT;
            goto out;
        } else if (gcoll_time_ns() - quiet_ns < PS_FAST_NS) {
            /* the worker's mailbox is not one of the transport's descriptors: shortly
             * after an event, when the next push or pull is due, look at it every 50 us */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        } else {
            GCOLL_CHECK_GOTO(gcoll_net_progress(comm, 1), st, out);
        }
    }
out:
    if (posted && r.rreq)
        gcoll_net_cancel(comm, r.rreq, 2 * P);
    while (r.inflight) {
        ps_msg_t *m = r.inflight;
        r.inflight = m->next;
        if (!m->req.done)
            gcoll_net_cancel(comm, &m->req, 1);
        msg_free(m);
    }
    for (size_t i = 0; r.rbuf && i < 2 * (size_t)P; i++)
        free(r.rbuf[i]);
    free(r.rbuf);
    free(r.rreq);
    free(r.rcap);
    free(r.seq_in);
    free(r.seq_out);
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
        return ps_invalid(ps->comm, "gcoll_ps_start", "already started");
    if (ps->n == 0)
        return ps_invalid(ps->comm, "gcoll_ps_start", "no tensors registered");
    /* every shard starts from this rank's (equal) initial params */
    float *init = malloc((ps->shard_n ? ps->shard_n : 1) * sizeof(float));
    ps->tmp = malloc((ps->shard_n ? ps->shard_n : 1) * sizeof(float));
    if (!init || !ps->tmp) {
        free(init);
        return GCOLL_ERR_NOMEM;
    }
    for (int i = 0; i < ps->n; i++)
        memcpy(init + ps->t[i].soff, ps->t[i].param + ps->t[i].off[ps->rank],
               ps->t[i].len[ps->rank] * sizeof(float));
    gcoll_status_t st = gcoll_ssp_init(&ps->sh, ps->P, ps->cfg.staleness, ps->shard_n, init,
                                       ps->cfg.lr, ps->cfg.weighting);
    free(init);
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
            enqueue(ps, msgs[o], msgs[o]);
        if (set_pull)
            ps->pull_left = ps->P;
    }
    pthread_mutex_unlock(&ps->lock);
    if (st != GCOLL_OK)
        for (int o = 0; o < ps->P; o++)
            msg_free(msgs[o]);
    return st;
}

static gcoll_status_t ctl_msgs(gcoll_ps_t *ps, int kind, ps_msg_t **msgs)
{
    for (int o = 0; o < ps->P; o++) {
        msgs[o] = msg_new(o, kind, PS_HDR);
        if (!msgs[o]) {
            for (int k = 0; k < o; k++)
                msg_free(msgs[k]);
            return GCOLL_ERR_NOMEM;
        }
        put_hdr(msgs[o]->buf, kind, ps->clock, 0);
        msgs[o]->len = PS_HDR;
    }
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_ps_pull(gcoll_ps_t *ps)
{
    if (!ps)
        return GCOLL_ERR_INVALID;
    if (!ps->started || ps->finished)
        return ps_invalid(ps->comm, "gcoll_ps_pull", "the server is not running");
    if (ps->pulled)
        return ps_invalid(ps->comm, "gcoll_ps_pull", "pulled twice without a push");
    ps_msg_t *msgs[ps->P];
    GCOLL_CHECK(ctl_msgs(ps, K_PULL, msgs));
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK(queue_all(ps, msgs, 1));
    struct timespec dl;
    wait_deadline(ps, &dl);
    pthread_mutex_lock(&ps->lock);
    int rc = 0;
    while (ps->pull_left > 0 && ps->err == GCOLL_OK && rc == 0)
        rc = pthread_cond_timedwait(&ps->cond, &ps->lock, &dl);
    gcoll_status_t st = ps->err;
    if (st == GCOLL_OK && ps->pull_left > 0)
        st = GCOLL_ERR_TIMEOUT;
    uint64_t lo = UINT64_MAX;
    for (int o = 0; o < ps->P; o++)
        if (ps->kread[o] < lo)
            lo = ps->kread[o];
    pthread_mutex_unlock(&ps->lock);
    ps->wait_s += 1e-9 * (double)(gcoll_time_ns() - t0);
    if (st == GCOLL_ERR_TIMEOUT && ps->err == GCOLL_OK) {
        gcoll_comm_set_error(ps->comm, "gcoll_ps_pull: no answer in GCOLL_TIMEOUT_MS + 2 s");
        gcoll_comm_abort(ps->comm);
    }
    if (st != GCOLL_OK && ps->req) {
        /* the server failed: let its operation end, so the communicator's error (which
         * names the cause) is set when the caller reads it */
        (void)gcoll_wait(ps->req);
        ps->req = NULL;
    }
    if (st != GCOLL_OK)
        return st;
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
        return ps_invalid(ps->comm, w, "the server is not running");
    if (!ps->pulled)
        return ps_invalid(ps->comm, w, "push without a pull before it");
    for (int i = 0; i < ps->n; i++) {
        if (!grads[i])
            return ps_invalid(ps->comm, w, "NULL gradient");
        for (size_t j = 0; j < ps->t[i].count; j++)
            if (!isfinite(grads[i][j]))
                return ps_invalid(ps->comm, w, "NaN or Inf in a gradient");
    }
    ps_msg_t *msgs[ps->P];
    for (int o = 0; o < ps->P; o++) {
        size_t cap = push_cap(ps, o);
        ps_msg_t *m = msgs[o] = msg_new(o, K_PUSH, cap);
        gcoll_status_t st = m ? GCOLL_OK : GCOLL_ERR_NOMEM;
        if (m) {
            put_hdr(m->buf, K_PUSH, ps->clock, ps->kread[o]);
            gcoll_put_u64(m->buf + 24, (uint64_t)ps->n);
            size_t pos = PS_HDR;
            for (int i = 0; i < ps->n && st == GCOLL_OK; i++) {
                ps_tensor_t *t = &ps->t[i];
                size_t l = 0;
                if (t->len[o])
                    st = gcoll_encode(ps->comp, t->st[o], grads[i] + t->off[o], t->len[o],
                                      m->buf + pos + 4, cap - pos - 4, &l);
                gcoll_put_u32(m->buf + pos, (uint32_t)l);
                pos += 4 + l;
            }
            m->len = pos;
        }
        if (st != GCOLL_OK) {
            for (int k = 0; k <= o; k++)
                msg_free(msgs[k]);
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
        return ps_invalid(ps->comm, "gcoll_ps_finish", "the server is not running");
    ps_msg_t *msgs[ps->P];
    gcoll_status_t st = ctl_msgs(ps, K_DONE, msgs);
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
        msg_free(m);
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
    free(ps->kread);
    free(ps->pull_want);
    free(ps->done_clock);
    gcoll_compressor_destroy(ps->comp);
    pthread_mutex_destroy(&ps->lock);
    pthread_cond_destroy(&ps->cond);
    free(ps);
}
