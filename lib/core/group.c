/* group.c: point-to-point operations and groups of calls (NCCL's ncclGroupStart/End).
 *
 * A send or receive is a queued operation like a collective, but it takes no sequence
 * number among the collectives (ranks that exchange nothing make no matching call): its
 * tag is GCOLL_P2P_TAG and the count of messages this rank sent to (or received from)
 * that peer so far, so the n-th send from a to b meets b's n-th receive from a whatever
 * else either rank does in between, and two messages to one peer never overtake.
 *
 * A group keeps the calls its thread makes on the communicator until gcoll_group_end,
 * then runs them as one queued operation: every send and receive is posted first (a ring
 * shift of blocking calls cannot then wait on itself), the collectives run in issue order
 * each with its own sequence number, consecutive small allreduces of one dtype and op as
 * one, and the sends and receives are waited for last.
 *
 * A receive from any source (MPI_ANY_SOURCE's semantics, MPI 4.0 section 3.5) does not
 * know its tag when it is posted: it waits until the next point-to-point message of some
 * peer (tag GCOLL_P2P_TAG | that peer's receive count) has arrived, takes the first come
 * (the transport's peek), and then receives it as a receive from that peer would, advancing
 * that peer's count. Operations run one after the other, so every receive issued after it
 * is posted once it has matched: a receive from p issued before it gets p's earlier
 * message, and one issued after it the next, as the non-overtaking rule requires. A group
 * posts its receives together, before any arrives: an any-source receive cannot join one. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "core/comm.h"
#include "core/ops.h"

/* In point-to-point signatures: apart from every collective's kind (collectives/coll.h). */
#define P2P_SIG_KIND 0x7050

static gcoll_status_t run_p2p(gcoll_comm_t *comm, gcoll_request_t *req);

/* A send or a receive from a named peer (a receive from any source is neither: it is never
 * posted ahead with a group's others). */
static int is_p2p(const gcoll_request_t *r)
{
    return r->noseq && r->run == run_p2p;
}

/* comm->p2p_count: sent and received per peer (2 * size), then a receive from any source's
 * tags (size more), allocated at the first point-to-point call. */
static gcoll_status_t p2p_counters(gcoll_comm_t *comm)
{
    if (!comm->p2p_count &&
        !(comm->p2p_count = calloc(3 * (size_t)comm->size, sizeof(*comm->p2p_count)))) {
        gcoll_comm_set_error(comm, "no memory for the point-to-point counters");
        return GCOLL_ERR_NOMEM;
    }
    return GCOLL_OK;
}

static gcoll_status_t p2p_post(gcoll_comm_t *comm, const gcoll_args_t *a, gcoll_treq_t *t)
{
    GCOLL_CHECK(p2p_counters(comm));
    int peer = a->root;
    size_t bytes = a->count * gcoll_dtype_size(a->dtype);
    uint32_t sig = gcoll_call_sig(P2P_SIG_KIND, a->count, a->dtype, 0, 0);
    uint64_t *n = &comm->p2p_count[2 * (size_t)peer + (a->kind == GCOLL_P2P_RECV)];
    uint64_t tag = GCOLL_P2P_TAG | (*n & ~GCOLL_P2P_TAG);
    (*n)++;
    if (a->kind == GCOLL_P2P_SEND)
        return gcoll_channel_isend_tag(&comm->chan, t, peer, tag, sig, a->sendbuf, bytes);
    return gcoll_channel_irecv_tag(&comm->chan, t, peer, tag, sig, a->recvbuf, bytes, 0);
}

/* Names the peer and the call in a failed transfer's error (first message wins). */
static void p2p_failed(gcoll_comm_t *comm, const gcoll_args_t *a, gcoll_status_t st)
{
    const char *detail = gcoll_channel_last_error(&comm->chan);
    if (a->kind == GCOLL_P2P_RECV && st == GCOLL_ERR_MISMATCH)
        gcoll_comm_set_error(comm,
                             "receive of %zu %s from rank %d: the matching send's count or "
                             "dtype differs (%s)",
                             a->count, gcoll_dtype_name(a->dtype), a->root, detail);
    else
        gcoll_comm_set_error(comm, "%s of %zu %s %s rank %d: %s%s%s",
                             a->kind == GCOLL_P2P_SEND ? "send" : "receive", a->count,
                             gcoll_dtype_name(a->dtype), a->kind == GCOLL_P2P_SEND ? "to" : "from",
                             a->root, gcoll_status_string(st), *detail ? ": " : "", detail);
}

static gcoll_status_t run_p2p(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_treq_t t;
    gcoll_status_t st = p2p_post(comm, &req->a, &t);
    if (st == GCOLL_OK)
        st = gcoll_channel_waitall(&comm->chan, &t, 1);
    if (st != GCOLL_OK) {
        gcoll_channel_cancel(&comm->chan, &t, 1);
        p2p_failed(comm, &req->a, st);
        return st;
    }
    comm->chan.counters.bytes_raw += req->a.count * gcoll_dtype_size(req->a.dtype);
    return GCOLL_OK;
}

/* The receive from any source: finds the first peer whose next message came, then receives
 * it as run_p2p would from that peer (a->ext: where its rank goes, or NULL). */
static gcoll_status_t run_p2p_any(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_args_t *a = &req->a;
    GCOLL_CHECK(p2p_counters(comm));
    int n = comm->size, peer = -1;
    uint64_t *tags = comm->p2p_count + 2 * (size_t)n;
    for (int i = 0; i < n; i++)
        tags[i] = GCOLL_P2P_TAG | (comm->p2p_count[2 * (size_t)i + 1] & ~GCOLL_P2P_TAG);
    gcoll_status_t st;
    /* bounded: gcoll_channel_poll fails past GCOLL_TIMEOUT_MS without a message */
    while ((st = gcoll_channel_peek(&comm->chan, tags, &peer)) == GCOLL_OK && peer < 0)
        if ((st = gcoll_channel_poll(&comm->chan, NULL)) != GCOLL_OK)
            break;
    if (st != GCOLL_OK) {
        const char *detail = gcoll_channel_last_error(&comm->chan);
        if (peer >= 0)
            gcoll_comm_set_error(comm,
                                 "receive of %zu %s from any source: rank %d failed before a "
                                 "message came: %s%s%s",
                                 a->count, gcoll_dtype_name(a->dtype), peer,
                                 gcoll_status_string(st), *detail ? ": " : "", detail);
        else
            gcoll_comm_set_error(comm, "receive of %zu %s from any source: %s%s%s", a->count,
                                 gcoll_dtype_name(a->dtype), gcoll_status_string(st),
                                 *detail ? ": " : "", detail);
        /* nothing was taken: a transport without it fails this call only */
        comm->chan.op_local = st == GCOLL_ERR_UNSUPPORTED;
        return st;
    }
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "receive from any source: rank %d's message %llu", peer,
                (unsigned long long)(tags[peer] & ~GCOLL_P2P_TAG));
    a->root = peer;
    if (a->ext)
        *(int *)a->ext = peer; /* before the completion the caller waits for */
    return run_p2p(comm, req);
}

gcoll_status_t gcoll_op_p2p_any(gcoll_comm_t *comm, const char *what, void *recvbuf, size_t count,
                                gcoll_dtype_t dtype, int *source, gcoll_request_t **req_p)
{
    gcoll_args_t a = {.recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = -1,
                      .kind = GCOLL_P2P_RECV,
                      .ext = source};
    if (source)
        *source = -1;
    return gcoll_op_submit_noseq(comm, what, run_p2p_any, &a, req_p);
}

gcoll_status_t gcoll_op_p2p(gcoll_comm_t *comm, const char *what, int kind, const void *sendbuf,
                            void *recvbuf, size_t count, gcoll_dtype_t dtype, int peer,
                            gcoll_request_t **req_p)
{
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = peer,
                      .kind = kind};
    return gcoll_op_submit_noseq(comm, what, run_p2p, &a, req_p);
}

/* ---- groups ----------------------------------------------------------------------- */

/* Completes every request of the list with st (a group that never ran, or the rest of a
 * failed one). */
static void complete_all(gcoll_request_t *r, gcoll_status_t st)
{
    while (r) {
        gcoll_request_t *next = r->next;
        gcoll_request_complete(r, st);
        r = next;
    }
}

static void group_release(void *ext)
{
    complete_all(ext, GCOLL_ERR_ABORTED);
}

static size_t req_bytes(const gcoll_request_t *r)
{
    return r->a.count * gcoll_dtype_size(r->a.dtype);
}

/* Whether r may join a fused allreduce that has the dtype and op of first and sum bytes. */
static int fusable(const gcoll_comm_t *comm, const gcoll_request_t *first, const gcoll_request_t *r,
                   size_t sum)
{
    return r && !is_p2p(r) && r->run == gcoll_op_run_allreduce && r->a.dtype == first->a.dtype &&
           r->a.op == first->a.op && sum + req_bytes(r) <= comm->cfg.coll.group_fuse_bytes;
}

/* One allreduce over the n requests of v (packed into one buffer, unpacked after). */
static gcoll_status_t run_fused(gcoll_comm_t *comm, gcoll_request_t **v, int n, size_t bytes)
{
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        gcoll_comm_set_error(comm, "no memory to fuse %d allreduces (%zu bytes)", n, bytes);
        return GCOLL_ERR_NOMEM;
    }
    size_t off = 0, count = 0;
    for (int i = 0; i < n; i++) {
        memcpy(buf + off, v[i]->a.sendbuf, req_bytes(v[i]));
        off += req_bytes(v[i]);
        count += v[i]->a.count;
    }
    gcoll_request_t fused = {.comm = comm, .name = "gcoll_group_end (fused allreduce)"};
    fused.a = (gcoll_args_t){
        .sendbuf = buf, .recvbuf = buf, .count = count, .dtype = v[0]->a.dtype, .op = v[0]->a.op};
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "group: %d allreduces (%zu bytes) fused into one", n, bytes);
    gcoll_channel_begin(&comm->chan);
    gcoll_status_t st = gcoll_op_run_allreduce(comm, &fused);
    if (st == GCOLL_OK) {
        off = 0;
        for (int i = 0; i < n; i++) {
            memcpy(v[i]->a.recvbuf, buf + off, req_bytes(v[i]));
            off += req_bytes(v[i]);
        }
    }
    free(buf);
    return st;
}

#define GROUP_SMALL 8

static gcoll_status_t run_group(gcoll_comm_t *comm, gcoll_request_t *greq)
{
    gcoll_request_t *list = greq->a.ext;
    int n = 0, np = 0;
    for (gcoll_request_t *r = list; r; r = r->next) {
        n++;
        np += is_p2p(r);
    }
    /* a small group (a send and a receive) on the stack: no allocation per call */
    gcoll_request_t *v_small[GROUP_SMALL], **v = v_small;
    gcoll_treq_t t_small[GROUP_SMALL + 1], *t = t_small;
    if (n > GROUP_SMALL) {
        v = malloc((size_t)n * sizeof(*v));
        t = calloc((size_t)np + 1, sizeof(*t));
    }
    if (!v || !t) {
        if (v != v_small)
            free(v);
        if (t != t_small)
            free(t);
        gcoll_comm_set_error(comm, "no memory for a group of %d calls", n);
        return GCOLL_ERR_NOMEM; /* the release completes the calls */
    }
    int i = 0;
    for (gcoll_request_t *r = list; r; r = r->next)
        v[i++] = r;
    /* the calls are completed one by one below: the release must not see them again */
    greq->a.ext = NULL;
    gcoll_status_t st = GCOLL_OK;
    int posted = 0;
    for (i = 0; i < n && st == GCOLL_OK; i++) {
        if (!is_p2p(v[i]))
            continue;
        st = p2p_post(comm, &v[i]->a, &t[posted]);
        if (st != GCOLL_OK)
            p2p_failed(comm, &v[i]->a, st);
        else
            posted++;
    }
    /* the collectives in issue order; a call's status becomes GCOLL_OK once it ran */
    for (i = 0; i < n && st == GCOLL_OK;) {
        if (is_p2p(v[i])) {
            i++;
            continue;
        }
        /* the run of fusable allreduces from here (p2p calls in between do not break it) */
        int m = 0, j = i;
        size_t sum = 0;
        gcoll_request_t *run[64];
        while (j < n && m < 64 && (is_p2p(v[j]) || fusable(comm, v[i], v[j], sum))) {
            if (!is_p2p(v[j])) {
                run[m++] = v[j];
                sum += req_bytes(v[j]);
            }
            j++;
        }
        if (m >= 2) {
            st = run_fused(comm, run, m, sum);
            for (int k = 0; k < m && st == GCOLL_OK; k++)
                run[k]->status = GCOLL_OK; /* marks it run: completed below */
            i = j;
            continue;
        }
        gcoll_channel_begin(&comm->chan);
        st = v[i]->run(comm, v[i]);
        if (st == GCOLL_OK)
            v[i]->status = GCOLL_OK;
        i++;
    }
    if (st == GCOLL_OK && posted) {
        st = gcoll_channel_waitall(&comm->chan, t, posted);
        for (int k = 0, p = 0; st != GCOLL_OK && k < n && p < posted; k++) {
            if (!is_p2p(v[k]))
                continue;
            if (t[p].done && t[p].status < 0) { /* the transfer that failed, named */
                p2p_failed(comm, &v[k]->a, t[p].status);
                break;
            }
            p++;
        }
    }
    if (st != GCOLL_OK)
        gcoll_channel_cancel(&comm->chan, t, posted);
    for (i = 0; i < n; i++) {
        int ok = st == GCOLL_OK || (!is_p2p(v[i]) && v[i]->status == GCOLL_OK);
        if (ok && is_p2p(v[i]))
            comm->chan.counters.bytes_raw += req_bytes(v[i]);
        gcoll_request_complete(v[i], ok ? GCOLL_OK : st);
    }
    comm->chan.op_local = 0; /* the calls' sequence numbers are spent: never undone */
    if (t != t_small)
        free(t);
    if (v != v_small)
        free(v);
    return st;
}

gcoll_status_t gcoll_op_group_start(gcoll_comm_t *comm)
{
    uintptr_t me = (uintptr_t)pthread_self(), none = 0;
    if (gcoll_comm_group_mine(comm)) { /* nested: one group */
        comm->group_depth++;
        return GCOLL_OK;
    }
    if (!__atomic_compare_exchange_n(&comm->group_owner, &none, me, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED)) {
        GCOLL_WARN("gcoll_group_start: another thread has a group open on this "
                   "communicator");
        return GCOLL_ERR_INVALID;
    }
    comm->group_depth = 1;
    return GCOLL_OK;
}

gcoll_status_t gcoll_op_group_end(gcoll_comm_t *comm)
{
    if (!gcoll_comm_group_mine(comm)) {
        int none = __atomic_load_n(&comm->group_owner, __ATOMIC_RELAXED) == 0;
        GCOLL_WARN("gcoll_group_end: %s",
                   none ? "no group is open on this communicator (gcoll_group_start "
                          "first)"
                        : "the group was opened by another thread");
        return GCOLL_ERR_INVALID;
    }
    if (--comm->group_depth > 0)
        return GCOLL_OK;
    gcoll_request_t *list = comm->ghead;
    comm->ghead = comm->gtail = NULL;
    for (gcoll_request_t *r = list; r; r = r->next)
        __atomic_store_n(&r->grouped, 0, __ATOMIC_RELAXED);
    /* the next owner, another thread perhaps, finds the list empty */
    __atomic_store_n(&comm->group_owner, 0, __ATOMIC_RELEASE);
    if (!list)
        return GCOLL_OK;
    gcoll_args_t a = {.ext = list, .release = group_release};
    gcoll_request_t *req = gcoll_request_new(comm, "gcoll_group_end", run_group, &a);
    if (!req) {
        complete_all(list, GCOLL_ERR_NOMEM);
        return GCOLL_ERR_NOMEM;
    }
    req->noseq = 1;
    return gcoll_comm_submit(comm, req, NULL);
}
