/* ucx.c: the UCX transport's data path: one UCP active message per gcoll message, matched
 * by (peer, tag) with length and signature checks (match.c), rendezvous data received
 * straight into the caller's buffer; progress sleeps on UCX's event fd. Setup is in
 * ucx_setup.c, single copy between ranks of one host in ucx_cma.c, peer failure in
 * ucx_fail.c, the wire's parsing in ucx_wire.c. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

/* How long cancel waits for UCX to finish an operation it already owns before giving up the
 * peer's endpoint (UCX 1.13 cannot cancel sends or started rendezvous receives). */
#define CANCEL_DRAIN_MS 200

void gcoll_ucx_set_error(gcoll_transport_t *t, const char *fmt, ...)
{
    if (t->errmsg[0] != '\0')
        return; /* the first failure is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->errmsg, sizeof(t->errmsg), fmt, ap);
    va_end(ap);
}

void gcoll_ucx_complete(gcoll_transport_t *t, gcoll_treq_t *req, gcoll_status_t st)
{
    if (req->done)
        return;
    if (req->flags & GCOLL_TREQ_RECEIVER_BUSY)
        t->nbusy--;
    req->priv = NULL;
    req->status = st;
    req->done = 1;
    t->events++;
}

void gcoll_ucx_match_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st)
{
    gcoll_ucx_complete(ctx, req, st);
}

/* ---------------------------------------------------------------------------------- */
/* Operations owned by UCX                                                              */

void gcoll_ucx_op_link(gcoll_transport_t *t, ucx_op_t *op)
{
    op->prev = NULL;
    op->next = t->ops;
    if (t->ops)
        t->ops->prev = op;
    t->ops = op;
}

void gcoll_ucx_op_unlink(gcoll_transport_t *t, ucx_op_t *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        t->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->next = op->prev = NULL;
}

/* Operations come from a small cache: a malloc and a free per message were a sixth of an
 * 8-byte allreduce over shared memory. */
#define OP_CACHE_MAX 64

ucx_op_t *gcoll_ucx_op_alloc(gcoll_transport_t *t)
{
    ucx_op_t *op = t->op_cache;
    if (!op)
        return calloc(1, sizeof(*op));
    t->op_cache = op->next;
    t->op_cached--;
    memset(op, 0, sizeof(*op));
    return op;
}

void gcoll_ucx_op_release(gcoll_transport_t *t, ucx_op_t *op)
{
    free(op->owned);
    if (t->op_cached >= OP_CACHE_MAX) {
        free(op);
        return;
    }
    op->next = t->op_cache;
    t->op_cache = op;
    t->op_cached++;
}

/* A peer's operation failed before any abort from it arrived (it may be failing a call on
 * a mismatch it is telling everyone about): the request is held like one on a failed
 * endpoint, so that the abort, if one is on its way, decides the status
 * (gcoll_ucx_handle_ep_errors, gcoll_ucx_peer_fail). */
void gcoll_ucx_hold_for_abort(gcoll_transport_t *t, ucx_peer_t *p, gcoll_treq_t *req,
                              ucs_status_t status)
{
    if (p->ep_error == UCS_OK) {
        p->ep_error = status;
        p->ep_error_ms = gcoll_time_ms();
    }
    t->ep_errors = 1;
    req->priv = NULL;
    gcoll_treq_list_push(&p->failing, &p->failing_tail, req);
}

static void op_finish(ucx_op_t *op, void *ucp_req, ucs_status_t status)
{
    gcoll_transport_t *t = op->t;
    gcoll_ucx_op_unlink(t, op);
    if (op->req) {
        gcoll_status_t st = gcoll_ucx_status(status);
        ucx_peer_t *p = &t->peers[op->peer];
        if (st != GCOLL_OK && p->rx.failed)
            st = p->rx.status; /* the peer's failure says more than UCX's purge status */
        if (st != GCOLL_OK && !p->rx.failed && !t->closing) {
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: %s rank %d failed: %s; waiting for an abort",
                        op->is_recv ? "receive from" : "send to", op->peer,
                        ucs_status_string(status));
            gcoll_ucx_hold_for_abort(t, p, op->req, status);
            op->req = NULL;
        }
        if (op->req && st == GCOLL_OK && op->is_recv)
            op->req->nbytes = op->len;
        if (op->req)
            gcoll_ucx_complete(t, op->req, st);
    }
    t->events++;
    if (ucp_req)
        ucp_request_free(ucp_req);
    gcoll_ucx_op_release(t, op);
}

/* UCX may complete an operation (typically with an error) from inside the call that
 * starts it and still return its request: the op is then finished by the poster. */
static void op_callback(ucx_op_t *op, void *request, ucs_status_t status)
{
    if (op->posting) {
        op->inline_done = 1;
        op->inline_req = request;
        op->inline_status = status;
        return;
    }
    op_finish(op, request, status);
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    op_callback(user_data, request, status);
}

static void recv_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    op_callback(user_data, request, status);
}

/* Takes over what the starting call returned. */
static void op_posted(ucx_op_t *op, ucs_status_ptr_t sp)
{
    op->posting = 0;
    if (op->inline_done)
        op_finish(op, op->inline_req ? op->inline_req : (UCS_PTR_IS_PTR(sp) ? sp : NULL),
                  op->inline_status);
    else if (UCS_PTR_IS_PTR(sp))
        op->ucp_req = sp;
    else
        op_finish(op, NULL, UCS_PTR_STATUS(sp));
}

/* Starts the data phase of a matched rendezvous message into req->buf. Returns 0 if it
 * could not (out of memory), in which case the descriptor is still the caller's. */
static int rndv_recv(gcoll_transport_t *t, int peer, gcoll_treq_t *req, void *desc, size_t len)
{
    ucx_op_t *op = gcoll_ucx_op_alloc(t);
    if (!op) {
        gcoll_ucx_set_error(t, "out of memory receiving %zu bytes from rank %d", len, peer);
        gcoll_ucx_complete(t, req, GCOLL_ERR_NOMEM);
        return 0;
    }
    op->t = t;
    op->req = req;
    op->peer = peer;
    op->is_recv = 1;
    op->len = len;
    ucp_request_param_t prm = {.op_attr_mask =
                                   UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.recv_am = recv_data_cb,
                               .user_data = op};
    ucp_mem_h memh = gcoll_ucx_reg_lookup(t, req->buf, len);
    if (memh) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = memh;
    }
    gcoll_ucx_op_link(t, op);
    req->priv = op;
    op->posting = 1;
    op_posted(op, ucp_am_recv_data_nbx(t->worker, desc, req->buf, len, &prm));
    return 1;
}

void gcoll_ucx_match_release(void *ctx, gcoll_unexp_t *u)
{
    gcoll_transport_t *t = ctx;
    if (u->priv)
        ucp_am_data_release(t->worker, u->priv); /* rendezvous: tells the sender it is done */
    u->priv = NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Delivery                                                                             */

/* Delivers an arrived message to a posted receive, or keeps it as unexpected. Returns what
 * the AM handler returns: UCS_INPROGRESS when UCX's descriptor is kept. cma: data is a
 * single-copy descriptor of a len-byte message. */
static ucs_status_t deliver(gcoll_transport_t *t, int peer, uint64_t tag, uint32_t sig, void *data,
                            size_t len, int rndv, int persistent, int cma)
{
    ucx_peer_t *p = &t->peers[peer];
    t->events++;
    gcoll_status_t st;
    gcoll_treq_t *req = gcoll_match_arrived(&p->rx, tag, len, sig, &st);
    if (st != GCOLL_OK) {
        if (cma) /* the sender waits for an answer */
            gcoll_ucx_fin_queue(t, peer, gcoll_get_u64((uint8_t *)data + 24), st);
        return UCS_OK; /* dropped; for rendezvous UCX acknowledges the sender */
    }
    if (req) {
        if (cma) {
            gcoll_ucx_cma_take(t, peer, req, data);
            return UCS_OK;
        }
        if (rndv) /* UCS_INPROGRESS: the descriptor now belongs to the receive */
            return rndv_recv(t, peer, req, data, len) ? UCS_INPROGRESS : UCS_OK;
        gcoll_match_land(&p->rx, req, data, len);
        return UCS_OK;
    }
    int kind = cma          ? UCX_UNEXP_CMA
               : rndv       ? UCX_UNEXP_RNDV
               : persistent ? UCX_UNEXP_DESC
                            : UCX_UNEXP_COPY;
    size_t bytes = kind == UCX_UNEXP_CMA ? GCOLL_UCX_CMA_DESC : kind == UCX_UNEXP_COPY ? len : 0;
    gcoll_unexp_t *u =
        gcoll_match_keep(&p->rx, tag, sig, len, bytes, bytes ? data : NULL,
                         kind == UCX_UNEXP_COPY || kind == UCX_UNEXP_DESC ? GCOLL_UNEXP_WHOLE : 0);
    if (!u) {
        gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_NOMEM);
        return UCS_OK;
    }
    u->kind = kind;
    if (kind == UCX_UNEXP_DESC || kind == UCX_UNEXP_RNDV) {
        u->priv = data; /* UCX's until released */
        return UCS_INPROGRESS;
    }
    return UCS_OK;
}

void gcoll_ucx_deliver(gcoll_transport_t *t, int peer, uint64_t tag, uint32_t sig, const void *data,
                       size_t len)
{
    deliver(t, peer, tag, sig, (void *)data, len, 0, 0, 0); /* copies, never keeps data */
}

void gcoll_ucx_on_abort(gcoll_transport_t *t, int peer, int status, const void *data, size_t len)
{
    char why[GCOLL_UCX_MAX_REASON + 1];
    len = GCOLL_MIN(len, (size_t)GCOLL_UCX_MAX_REASON);
    if (len && data)
        memcpy(why, data, len);
    why[len] = '\0';
    gcoll_ucx_set_error(t, "rank %d aborted with %s: %s", peer, gcoll_status_string(status), why);
    GCOLL_WARN("rank %d aborted with %s: %s", peer, gcoll_status_string(status), why);
    gcoll_status_t st = status == GCOLL_ERR_MISMATCH ? GCOLL_ERR_MISMATCH : GCOLL_ERR_PEER;
    t->aborted = 1;
    for (int i = 0; i < t->size; i++)
        if (i != t->rank)
            gcoll_ucx_peer_fail(t, i, st);
}

ucs_status_t gcoll_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    gcoll_transport_t *t = arg;
    ucx_hdr_t h;
    const char *why = gcoll_ucx_hdr_decode(header, header_length, &h);
    if (!why && h.cookie != t->cookie)
        why = "wrong cookie (not from a rank of this communicator)";
    if (!why && (h.src >= (uint32_t)t->size || h.src == (uint32_t)t->rank))
        why = "source rank out of range";
    if (why) {
        /* a stranger may send many: the first few, then one in 1024 */
        if (t->dropped++ < 8 || (t->dropped & 1023) == 0)
            GCOLL_WARN("ucx: dropped a message of %zu bytes: %s (%lu dropped so far)", length, why,
                       t->dropped);
        return UCS_OK;
    }
    int peer = (int)h.src;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    GCOLL_TRACE(GCOLL_SUBSYS_NET, "ucx: from rank %d: type %d tag %016llx sig %08x, %zu bytes%s",
                peer, h.type, (unsigned long long)h.tag, h.sig, length, rndv ? " (rndv)" : "");
    if (t->peers[peer].rx.failed || t->closing)
        return UCS_OK;
    switch (h.type) {
    case UCX_MSG_HELLO:
        /* the round a hello belongs to travels in the status byte (1 hello, 2 ready), and
         * whether the peer can read our memory in its flag byte */
        t->peers[peer].hello = GCOLL_MAX(t->peers[peer].hello, -h.status);
        if (!rndv && length >= 1 && (*(const uint8_t *)data & GCOLL_UCX_HELLO_CMA) && t->cma_min)
            t->peers[peer].cma_send = 1;
        if (!rndv && length >= 1 && (*(const uint8_t *)data & GCOLL_UCX_HELLO_SHM))
            gcoll_ucx_shm_expect(t, peer);
        if (!rndv && length >= 5 && -h.status == 2) /* ready: its mailbox mesh size */
            t->peers[peer].shm_mesh = gcoll_get_u32((const uint8_t *)data + 1);
        /* fall through */
    case UCX_MSG_BELL: /* the mailbox is polled by the progress that runs this */
        t->events++;
        return UCS_OK;
    case UCX_MSG_FIN:
        t->in_cb++;
        gcoll_ucx_on_fin(t, peer, h.status, rndv ? NULL : data, rndv ? 0 : length);
        t->in_cb--;
        return UCS_OK;
    case UCX_MSG_PUT:
    case UCX_MSG_PUTFIN:
        t->in_cb++;
        if (h.type == UCX_MSG_PUT)
            gcoll_ucx_on_put(t, peer, rndv ? NULL : data, rndv ? 0 : length);
        else
            gcoll_ucx_on_putfin(t, peer, h.status, rndv ? NULL : data, rndv ? 0 : length);
        t->in_cb--;
        return UCS_OK;
    case UCX_MSG_CMA:
        if (rndv || length != GCOLL_UCX_CMA_DESC || !t->peers[peer].cma_pid) {
            gcoll_ucx_set_error(t, "rank %d sent a malformed single-copy message (%zu bytes%s)",
                                peer, length,
                                t->peers[peer].cma_pid ? "" : ", and we cannot read its memory");
            t->in_cb++;
            gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_PEER);
            t->in_cb--;
            return UCS_OK;
        }
        t->in_cb++;
        deliver(t, peer, h.tag, h.sig, data, gcoll_get_u64((const uint8_t *)data + 8), 0, 0, 1);
        t->in_cb--;
        return UCS_OK;
    case UCX_MSG_ABORT:
        t->in_cb++;
        gcoll_ucx_on_abort(t, peer, h.status, rndv ? NULL : data, rndv ? 0 : length);
        t->in_cb--;
        return UCS_OK;
    default:
        break;
    }
    t->in_cb++;
    ucs_status_t ret = deliver(t, peer, h.tag, h.sig, data, length, rndv,
                               (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0, 0);
    t->in_cb--;
    return ret;
}

/* ---------------------------------------------------------------------------------- */
/* Posting                                                                              */

/* Sends one message; a control message's payload is copied (owned by the op). */
gcoll_status_t gcoll_ucx_send_op(gcoll_transport_t *t, int peer, gcoll_treq_t *req,
                                 const ucx_hdr_t *h, const void *buf, size_t len)
{
    ucx_peer_t *p = &t->peers[peer];
    ucx_op_t *op = gcoll_ucx_op_alloc(t);
    if (!op)
        return GCOLL_ERR_NOMEM;
    if (!req && len) {
        if (!(op->owned = malloc(len))) {
            gcoll_ucx_op_release(t, op);
            return GCOLL_ERR_NOMEM;
        }
        memcpy(op->owned, buf, len);
        buf = op->owned;
    }
    op->is_ctl = req == NULL;
    op->t = t;
    op->req = req;
    op->peer = peer;
    gcoll_ucx_hdr_encode(h, op->hdr);
    ucp_request_param_t prm = {.op_attr_mask =
                                   UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = send_cb,
                               .user_data = op};
    ucp_mem_h memh = len ? gcoll_ucx_reg_lookup(t, buf, len) : NULL;
    if (memh) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = memh;
    }
    gcoll_ucx_op_link(t, op);
    if (req)
        req->priv = op;
    op->posting = 1;
    op_posted(op,
              ucp_am_send_nbx(p->ep, GCOLL_UCX_AM_ID, op->hdr, GCOLL_UCX_HDR_LEN, buf, len, &prm));
    return GCOLL_OK;
}

gcoll_status_t gcoll_ucx_send_ctl(gcoll_transport_t *t, int peer, int type, int status,
                                  const void *data, size_t len)
{
    if (t->peers[peer].rx.failed || !t->peers[peer].ep)
        return GCOLL_ERR_PEER;
    ucx_hdr_t h = {
        .type = type, .status = status, .src = (uint32_t)t->rank, .cookie = t->peers[peer].cookie};
    return gcoll_ucx_send_op(t, peer, NULL, &h, data, len);
}

static gcoll_status_t check_req(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->peer < 0 || req->peer >= t->size || (req->len && !req->buf))
        return GCOLL_ERR_INVALID;
    req->done = 0;
    req->status = GCOLL_INPROGRESS;
    req->priv = NULL;
    return GCOLL_OK;
}

static gcoll_status_t ucx_isend(gcoll_transport_t *t, gcoll_treq_t *req)
{
    GCOLL_CHECK(check_req(t, req));
    if (req->peer == t->rank) {
        /* Sends to oneself never touch UCX: delivered (copied) into the receive side. */
        deliver(t, t->rank, req->tag, req->sig, req->buf, req->len, 0, 0, 0);
        if (t->peers[t->rank].rx.failed)
            return GCOLL_ERR_NOMEM;
        gcoll_ucx_complete(t, req, GCOLL_OK);
        return GCOLL_OK;
    }
    ucx_peer_t *p = &t->peers[req->peer];
    if (p->rx.failed) {
        gcoll_ucx_complete(t, req, p->rx.status);
        return GCOLL_OK;
    }
    if (p->shm_ring && req->len <= t->shm_max && gcoll_ucx_shm_send(t, p, req))
        return GCOLL_OK;
    return gcoll_ucx_send_data(t, req);
}

gcoll_status_t gcoll_ucx_send_data(gcoll_transport_t *t, gcoll_treq_t *req)
{
    ucx_peer_t *p = &t->peers[req->peer];
    ucx_hdr_t h = {.type = UCX_MSG_DATA,
                   .src = (uint32_t)t->rank,
                   .sig = req->sig,
                   .cookie = p->cookie,
                   .tag = req->tag};
    if (p->cma_send && req->len >= t->cma_min)
        return gcoll_ucx_cma_send(t, req, &h);
    return gcoll_ucx_send_op(t, req->peer, req, &h, req->buf, req->len);
}

static gcoll_status_t ucx_irecv(gcoll_transport_t *t, gcoll_treq_t *req)
{
    GCOLL_CHECK(check_req(t, req));
    req->nbytes = 0;
    if (req->flags & GCOLL_TREQ_RECEIVER_BUSY)
        t->nbusy++;
    ucx_peer_t *p = &t->peers[req->peer];
    gcoll_status_t st;
    gcoll_unexp_t *u = gcoll_match_claim(&p->rx, req, &st);
    if (!u) {
        gcoll_match_post(&p->rx, req);
        return GCOLL_OK;
    }
    if (st != GCOLL_OK) {
        if (u->kind == UCX_UNEXP_CMA) /* the sender waits for an answer */
            gcoll_ucx_fin_queue(t, req->peer, gcoll_get_u64(u->data + 24), st);
    } else if (u->kind == UCX_UNEXP_CMA) {
        gcoll_ucx_cma_take(t, req->peer, req, u->data);
    } else if (u->kind == UCX_UNEXP_RNDV) {
        if (rndv_recv(t, req->peer, req, u->priv, u->len))
            u->priv = NULL; /* UCX took the descriptor over */
    } else {
        gcoll_match_land(&p->rx, req, u->kind == UCX_UNEXP_DESC ? u->priv : u->data, u->len);
    }
    gcoll_match_unexp_free(&p->rx, u);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Progress, cancel, abort                                                              */

/* A round that found messages in the mailbox leaves UCX's own progress (hundreds of
 * cycles when idle) to the next, at most SHM_ONLY_MAX - 1 rounds in a row: the waiter
 * goes on with its message sooner. */
#define SHM_ONLY_MAX 8u

unsigned gcoll_ucx_drive(gcoll_transport_t *t)
{
    unsigned total = t->shm_box ? gcoll_ucx_shm_poll(t) : 0, n;
    if (t->nshm_wait)
        total += gcoll_ucx_shm_retry(t);
    if (total && !t->nfin && ++t->shm_only < SHM_ONLY_MAX)
        return total;
    t->shm_only = 0;
    int rounds = 0;
    do {
        n = ucp_worker_progress(t->worker);
        total += n;
    } while (n && ++rounds < 64);
    if (!t->closing)
        gcoll_ucx_handle_ep_errors(t);
    gcoll_ucx_close_failed_eps(t);
    if (t->nfin) /* last: the progress in the two calls above may have queued some */
        gcoll_ucx_fin_flush(t);
    if (t->nput_reads) { /* our share of receives the sender writes, their PUTs out */
        gcoll_ucx_cma_put_reads(t);
        if (t->nfin)
            gcoll_ucx_fin_flush(t);
    }
    return total;
}

/* UCX cannot sleep while it holds sends it could not start: ucp_worker_arm reports BUSY for
 * as long as any are queued (on shared memory: the fragments of a large message queued
 * behind the peer's full receive fifo, 64 elements of 8 KiB), and nothing signals us when
 * the peer drains that fifo, so UCX has to be polled. Polling hot starves the very peer
 * that must drain it whenever the ranks share cores with each other or with other work:
 * every rendezvous beyond the fifo's 512 KiB then waits for the scheduler to take the CPU
 * away from the poller (2 ranks on 2 loaded cores: 1 MiB allreduce 14 ms instead of
 * 0.3 ms). So between fruitless polls the CPU is given away (sched_yield), and after
 * HELD_YIELD_NS of them we nap, at most HELD_NAP_MAX_NS at a time, so that a peer busy
 * elsewhere does not cost us a core. A nap still ends on the communicator's wake fd. */
#define HELD_YIELD_NS 200000ull
#define HELD_NAP_MAX_NS 1000000ull

static void held_poll_wait(gcoll_transport_t *t, int timeout_ms)
{
    uint64_t now = gcoll_time_ns();
    t->st_held_polls++;
    if (!t->held_since_ns)
        t->held_since_ns = now;
    uint64_t stuck = now - t->held_since_ns;
    if (stuck < HELD_YIELD_NS) {
        sched_yield();
        return;
    }
    t->st_held_naps++;
    uint64_t nap = GCOLL_MIN(stuck / 4, HELD_NAP_MAX_NS);
    nap = GCOLL_MIN(nap, (uint64_t)timeout_ms * 1000000ull);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
    struct pollfd pfd = {.fd = t->wake_fd, .events = POLLIN};
    if (ppoll(&pfd, t->wake_fd >= 0 ? 1 : 0, &ts, NULL) < 0 && errno != EINTR)
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: ppoll: %s", strerror(errno));
}

static gcoll_status_t ucx_progress(gcoll_transport_t *t, int timeout_ms)
{
    unsigned long ev = t->events;
    if (gcoll_ucx_drive(t) || t->events != ev || timeout_ms <= 0) {
        t->held_since_ns = 0;
        return GCOLL_OK;
    }
    if (t->ep_errors) /* a failed connection is in its grace period: look again soon */
        timeout_ms = GCOLL_MIN(timeout_ms, 50);
    if (t->nshm_wait) { /* room in a peer's ring makes no event: poll for it */
        held_poll_wait(t, timeout_ms);
        return GCOLL_OK;
    }
    /* Idle: sleep on UCX's event fd (and the communicator's wake fd) rather than spin.
     * Arming reports BUSY when events are already pending (UCX's wakeup protocol): progress
     * again; if that finds nothing either, UCX is holding queued sends (above). Senders
     * into our mailbox see that we sleep and ring (UCX_MSG_BELL). */
    if (gcoll_ucx_shm_sleep(t)) {
        t->held_since_ns = 0;
        return GCOLL_OK;
    }
    ucs_status_t s = ucp_worker_arm(t->worker);
    if (s != UCS_OK) /* not sleeping after all */
        gcoll_ucx_shm_wake(t);
    if (s == UCS_ERR_BUSY) {
        if (gcoll_ucx_drive(t) || t->events != ev)
            t->held_since_ns = 0;
        else
            held_poll_wait(t, timeout_ms);
        return GCOLL_OK;
    }
    if (s != UCS_OK) {
        gcoll_ucx_set_error(t, "ucp_worker_arm: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    t->held_since_ns = 0;
    t->st_sleeps++;
    struct epoll_event e[2];
    int n = epoll_wait(t->epfd, e, 2, timeout_ms);
    gcoll_ucx_shm_wake(t);
    if (n < 0 && errno != EINTR) {
        gcoll_ucx_set_error(t, "epoll_wait: %s", strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    /* Armed and then woken by nothing while operations were in flight: either a peer was
     * silent for that long, or a wake-up was lost. Counted, for test-ucx.sh. */
    if (n == 0 && (t->ops || t->ep_errors))
        t->st_sleep_timeouts++;
    gcoll_ucx_drive(t);
    return GCOLL_OK;
}

static void ucx_cancel(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->done || req->peer < 0 || req->peer >= t->size)
        return;
    ucx_peer_t *p = &t->peers[req->peer];
    if (gcoll_match_cancel(&p->rx, req))
        return;
    if (gcoll_treq_list_remove(&p->failing, &p->failing_tail, req)) {
        gcoll_ucx_complete(t, req, GCOLL_ERR_ABORTED);
        return;
    }
    ucx_op_t *op = req->priv;
    if (!op) {
        gcoll_ucx_complete(t, req, GCOLL_ERR_ABORTED);
        return;
    }
    if (op->shm_wait) { /* not yet written to the peer's ring */
        gcoll_ucx_shm_unwait(t, op);
        gcoll_ucx_complete(t, req, GCOLL_ERR_ABORTED);
        return;
    }
    if (op->cma && !op->is_recv) { /* ours, not UCX's: withdrawn at once (the token goes first) */
        gcoll_ucx_cma_send_end(t, op, GCOLL_ERR_ABORTED);
        return;
    }
    /* A receive the sender may be writing: its token goes first (a write not yet started
     * never starts), then the PUTFIN says a write under way has ended (below). */
    if (op->cma)
        __atomic_store_n(&op->cma_token, 0, __ATOMIC_SEQ_CST);
    /* UCX owns the buffer (a send, or a rendezvous receive under way). ucp_request_cancel
     * only withdraws unmatched tag receives in UCX 1.13, so let the operation finish for a
     * short while; if it does not, close the endpoint so that UCX lets go of the buffer
     * before the caller frees it. The communicator is failing at this point anyway. */
    if (!op->cma)
        ucp_request_cancel(t->worker, op->ucp_req);
    uint64_t end = gcoll_time_ms() + CANCEL_DRAIN_MS;
    while (!req->done && !p->rx.failed && gcoll_time_ms() < end)
        ucx_progress(t, gcoll_ms_left(end, 10)); /* sleeps when idle */
    if (req->done)
        return;
    if (!p->rx.failed) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET,
                    "ucx: cancel: %s rank %d did not finish in %d ms; "
                    "closing the endpoint",
                    req == op->req && op->is_recv ? "receive from" : "send to", req->peer,
                    CANCEL_DRAIN_MS);
        gcoll_ucx_peer_fail(t, req->peer, GCOLL_ERR_ABORTED);
    }
    if (!req->done) {
        op->req = NULL; /* UCX's completion will find nobody to tell */
        gcoll_ucx_complete(t, req, GCOLL_ERR_ABORTED);
    }
}

/* The reason without the status's own text (the status travels in the header), cut to
 * what fits a short message. */
static size_t compact_reason(gcoll_status_t status, const char *reason, char *out)
{
    const char *ss = gcoll_status_string(status);
    const char *at = strstr(reason, ss);
    size_t o = 0;
    for (const char *r = reason; *r && o < GCOLL_UCX_ABORT_INLINE;) {
        if (r == at) {
            r += strlen(ss);
            r += strspn(r, ": ");
            continue;
        }
        out[o++] = *r++;
    }
    return o;
}

/* Whether a control message (an abort, a FIN) to a live peer is still in UCX's hands. */
static int ctl_pending(const gcoll_transport_t *t)
{
    for (const ucx_op_t *op = t->ops; op; op = op->next)
        if (op->is_ctl && !t->peers[op->peer].rx.failed)
            return 1;
    return 0;
}

static void ucx_abort(gcoll_transport_t *t, gcoll_status_t status, const char *full)
{
    char reason[GCOLL_UCX_ABORT_INLINE];
    size_t len = compact_reason(status, full, reason);
    int sent = 0;
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank || t->peers[peer].rx.failed || !t->peers[peer].ep)
            continue;
        gcoll_ucx_shm_abort(&t->peers[peer], status, reason, len);
        if (gcoll_ucx_send_ctl(t, peer, UCX_MSG_ABORT, status, reason, len) == GCOLL_OK)
            sent++;
    }
    /* Bounded drain: the aborts are small eager messages, out in microseconds normally.
     * The reason string is ours until they complete, so wait for the control sends. */
    uint64_t t0 = gcoll_time_ms(), end = t0 + 1000;
    while (ctl_pending(t) && gcoll_time_ms() < end)
        ucx_progress(t, 10);
    GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: abort sent to %d peer(s) in %llu ms", sent,
                (unsigned long long)(gcoll_time_ms() - t0));
}

/* A FIN answers a peer's single-copy send, which completes only with it; UCX queues an
 * active message when the peer's shared-memory FIFO is full, and moves it only inside
 * ucp_worker_progress. Seen as a hang: two communicators in one process, 4 ranks on 2
 * cores, 16 MiB allreduces on each in turn: a rank went on to the other communicator with
 * its FIN still queued, while the peer that waited for it could not join there. */
static void ucx_flush(gcoll_transport_t *t, int64_t timeout_ms)
{
    if (!ctl_pending(t)) /* the usual case, without a clock read (22 ns each on this VM) */
        return;
    uint64_t now = gcoll_time_ms(), deadline_ms = now + (uint64_t)timeout_ms, nap_from = now + 2;
    while (ctl_pending(t) && now < deadline_ms) {
        t->st_flush_polls++;
        /* a peer in its own wait drains at once: poll, yielding the CPU it may need; one
         * busy elsewhere (computing) may take long: then nap between polls */
        ucx_progress(t, now >= nap_from ? 5 : 0);
        sched_yield();
        now = gcoll_time_ms();
    }
}

static const char *ucx_last_error(gcoll_transport_t *t)
{
    return t->errmsg;
}

/* A failed peer's receives fail through its store (ucx_fail.c): nothing more to add here. */
static gcoll_status_t ucx_peek(gcoll_transport_t *t, const uint64_t *tags, int *peer_p)
{
    gcoll_match_peek_t pk;
    gcoll_ucx_shm_drain_all(t); /* the rings hold what no receive took in yet */
    gcoll_match_peek_init(&pk);
    for (int i = 0; i < t->size; i++)
        gcoll_match_peek_add(&pk, &t->peers[i].rx, tags[i], GCOLL_OK);
    return gcoll_match_peek_result(&pk, peer_p);
}

const gcoll_transport_ops_t gcoll_ucx_ops = {
    .size = sizeof(gcoll_transport_ops_t),
    .name = "ucx",
    .probe = gcoll_ucx_probe,
    .create = gcoll_ucx_create,
    .address = gcoll_ucx_address,
    .connect = gcoll_ucx_connect,
    .isend = ucx_isend,
    .irecv = ucx_irecv,
    .progress = ucx_progress,
    .cancel = ucx_cancel,
    .abort = ucx_abort,
    .last_error = ucx_last_error,
    .mem_reg = gcoll_ucx_mem_reg,
    .mem_dereg = gcoll_ucx_mem_dereg,
    .destroy = gcoll_ucx_destroy,
    .peer_shares_cpu = gcoll_ucx_shm_peer_cpu,
    .rdma_capable = gcoll_ucx_rdma_capable,
    .local_capable = gcoll_ucx_local_capable,
    .flush = ucx_flush,
    .peek = ucx_peek,
    .mesh_max = gcoll_ucx_shm_mesh_max,
    .send_held = gcoll_ucx_cma_held,
};
