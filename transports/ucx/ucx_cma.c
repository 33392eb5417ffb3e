/* ucx_cma.c: the UCX transport's single copy between ranks of one host (GCOLL_UCX_CMA_MIN;
 * protocol in ucx_int.h): the descriptor sent in place of the data, the receiver's read
 * with process_vm_readv, the FIN that ends the send; for a busy receiver, the PUT that
 * asks the sender to write with process_vm_writev instead, and its PUTFIN. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

/* Sends the single-copy messages (FIN, PUT, PUTFIN) queued inside UCX's callbacks. */
void gcoll_ucx_fin_flush(gcoll_transport_t *t)
{
    for (int i = 0; i < t->nfin; i++) {
        struct ucx_fin *f = &t->fin[i];
        /* a failed peer (or one whose endpoint is closed) needs no answer */
        if (gcoll_ucx_send_ctl(t, f->peer, f->type, f->status, f->data, f->len) == GCOLL_ERR_NOMEM)
            gcoll_ucx_peer_fail(t, f->peer, GCOLL_ERR_NOMEM);
    }
    t->nfin = 0;
}

/* Queues a single-copy control message (sent at once outside UCX's callbacks). 0 if out of
 * memory (the peer is then failed). */
static int ctl_queue(gcoll_transport_t *t, int peer, int type, gcoll_status_t status,
                     const uint8_t *data, size_t len)
{
    if (t->nfin == t->capfin) {
        int cap = t->capfin ? 2 * t->capfin : 16;
        struct ucx_fin *f = realloc(t->fin, (size_t)cap * sizeof(*f));
        if (!f) {
            gcoll_ucx_set_error(t, "out of memory answering a single-copy send of rank %d", peer);
            gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_NOMEM);
            return 0;
        }
        t->fin = f;
        t->capfin = cap;
    }
    struct ucx_fin *f = &t->fin[t->nfin++];
    *f = (struct ucx_fin){.peer = peer, .type = type, .status = status, .len = len};
    memcpy(f->data, data, len);
    if (!t->in_cb)
        gcoll_ucx_fin_flush(t);
    return 1;
}

/* Tells the sender its single-copy send is over (status: how the read went). */
void gcoll_ucx_fin_queue(gcoll_transport_t *t, int peer, uint64_t token, gcoll_status_t status)
{
    uint8_t tok[8];
    gcoll_put_u64(tok, token);
    ctl_queue(t, peer, UCX_MSG_FIN, status, tok, sizeof(tok));
}

static uint64_t next_token(gcoll_transport_t *t)
{
    uint64_t token = t->cma_next++;
    if (token == 0)
        token = t->cma_next++;
    return token;
}

/* Moves len bytes between our buffer and the peer's (write: ours into its); an errno. */
static int vm_move(int pid, int write, void *ours, uint64_t theirs, size_t len)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {.iov_base = (uint8_t *)ours + done, .iov_len = len - done};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(theirs + done), .iov_len = len - done};
        ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n <= 0)
            return n < 0 ? errno : EFAULT;
        done += (size_t)n;
    }
    return 0;
}

/* Whether the peer's token word still holds token. */
static int token_live(int pid, uint64_t tok_addr, uint64_t token)
{
    uint64_t now = 0;
    return vm_move(pid, 0, &now, tok_addr, sizeof(now)) == 0 && now == token;
}

/* Reads a matched single-copy message (desc: GCOLL_UCX_CMA_DESC bytes off the wire, length
 * already matched against req) from byte off on, from the sender's memory into req->buf,
 * then checks that the send was still live when the read ended (its token word
 * unchanged). NULL, else what failed (*err: its errno, or 0). */
static const char *read_from(const ucx_peer_t *p, gcoll_treq_t *req, const uint8_t *desc,
                             uint64_t off, int *err)
{
    *err = vm_move(p->cma_pid, 0, (uint8_t *)req->buf + off, gcoll_get_u64(desc) + off,
                   (size_t)(gcoll_get_u64(desc + 8) - off));
    if (*err)
        return "reading its buffer";
    if (!token_live(p->cma_pid, gcoll_get_u64(desc + 16), gcoll_get_u64(desc + 24)))
        return "its send was withdrawn during the read";
    return NULL;
}

/* A single-copy receive whose sender withdrew (it is failing: an abort may be on its way,
 * with the status that should decide, say a mismatch elsewhere) or died: held as an
 * operation on a failing endpoint, as UCX's own failures are (op_finish). */
static void recv_failed(gcoll_transport_t *t, int peer, gcoll_treq_t *req, uint64_t len,
                        const char *what, int err)
{
    ucx_peer_t *p = &t->peers[peer];
    gcoll_ucx_set_error(t, "single-copy receive of %llu bytes from rank %d failed: %s%s%s",
                        (unsigned long long)len, peer, what, err ? ": " : "",
                        err ? strerror(err) : "");
    req->priv = NULL;
    if (!p->rx.failed && !t->closing)
        gcoll_ucx_hold_for_abort(t, p, req, UCS_ERR_IO_ERROR);
    else
        gcoll_ucx_complete(t, req, p->rx.failed ? p->rx.status : GCOLL_ERR_PEER);
}

void gcoll_ucx_cma_pull(gcoll_transport_t *t, int peer, gcoll_treq_t *req, const uint8_t *desc)
{
    uint64_t len = gcoll_get_u64(desc + 8), token = gcoll_get_u64(desc + 24);
    int err;
    const char *what = read_from(&t->peers[peer], req, desc, 0, &err);
    if (what) {
        recv_failed(t, peer, req, len, what, err);
        gcoll_ucx_fin_queue(t, peer, token, GCOLL_ERR_PEER);
        return;
    }
    req->nbytes = (size_t)len;
    t->st_cma_recvs++;
    gcoll_ucx_complete(t, req, GCOLL_OK);
    gcoll_ucx_fin_queue(t, peer, token, GCOLL_OK);
}

/* The token a FIN or PUTFIN carries (8 bytes); a malformed one fails the peer: 0. */
static int answer_token(gcoll_transport_t *t, int peer, const void *data, size_t len,
                        uint64_t *token)
{
    if (len != 8 || !data) {
        gcoll_ucx_set_error(t, "rank %d sent a malformed single-copy answer (%zu bytes)", peer,
                            len);
        gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_PEER);
        return 0;
    }
    *token = gcoll_get_u64(data);
    return 1;
}

/* A FIN for one of our single-copy sends. */
void gcoll_ucx_on_fin(gcoll_transport_t *t, int peer, int status, const void *data, size_t len)
{
    uint64_t token;
    if (!answer_token(t, peer, data, len, &token))
        return;
    for (ucx_op_t *op = t->ops; op; op = op->next) {
        if (!op->cma || op->is_recv || op->peer != peer || op->cma_token != token)
            continue;
        /* Whatever the receiver made of it, the send is over, as UCX's rendezvous
         * completes a send its receiver dropped: a receiver that failed (a mismatch, a
         * read that failed) fails its call and tells everyone, with the status that
         * decides; failing the send here would race that abort with a PEER error. */
        if (status != GCOLL_OK)
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: rank %d did not take a single-copy send: %s", peer,
                        gcoll_status_string(status));
        gcoll_ucx_cma_send_end(t, op, GCOLL_OK);
        return;
    }
    /* a send withdrawn (cancelled) before its FIN came: nothing to do */
}

/* Fails (or withdraws) a single-copy send: its token goes first, so that a read still
 * racing with this fails its check instead of delivering a buffer handed back. */
void gcoll_ucx_cma_send_end(gcoll_transport_t *t, ucx_op_t *op, gcoll_status_t st)
{
    __atomic_store_n(&op->cma_token, 0, __ATOMIC_SEQ_CST);
    if (op->put_reading) { /* a receive the sender writes, ended before our read */
        op->put_reading = 0;
        t->nput_reads--;
    }
    gcoll_ucx_op_unlink(t, op);
    if (op->req)
        gcoll_ucx_complete(t, op->req, st);
    gcoll_ucx_op_release(t, op);
    t->events++;
}

/* A single-copy send: the descriptor goes as a control message; the send itself is an op
 * of ours (not UCX's) that the receiver's FIN finishes. */
gcoll_status_t gcoll_ucx_cma_send(gcoll_transport_t *t, gcoll_treq_t *req, ucx_hdr_t *h)
{
    ucx_op_t *op = gcoll_ucx_op_alloc(t);
    if (!op)
        return GCOLL_ERR_NOMEM;
    op->t = t;
    op->req = req;
    op->peer = req->peer;
    op->cma = 1;
    uint64_t token = next_token(t);
    op->cma_token = token;
    uint8_t desc[GCOLL_UCX_CMA_DESC];
    gcoll_put_u64(desc, (uint64_t)(uintptr_t)req->buf);
    gcoll_put_u64(desc + 8, (uint64_t)req->len);
    gcoll_put_u64(desc + 16, (uint64_t)(uintptr_t)&op->cma_token);
    gcoll_put_u64(desc + 24, token);
    gcoll_ucx_op_link(t, op);
    req->priv = op;
    h->type = UCX_MSG_CMA;
    gcoll_status_t st = gcoll_ucx_send_op(t, req->peer, NULL, h, desc, sizeof(desc));
    if (st != GCOLL_OK) {
        req->priv = NULL;
        op->req = NULL;
        gcoll_ucx_cma_send_end(t, op, st);
        return st;
    }
    t->st_cma_sends++;
    return GCOLL_OK;
}

int gcoll_ucx_cma_held(gcoll_transport_t *t, int peer, size_t len)
{
    if (peer < 0 || peer >= t->size || peer == t->rank)
        return 0;
    ucx_peer_t *p = &t->peers[peer];
    /* the order of ucx_isend's choice: the mailbox first */
    if (p->rx.failed || (p->shm_ring && len <= t->shm_max))
        return 0;
    return p->cma_send && len >= t->cma_min;
}

/* ---- the sender writes (a busy receiver) ------------------------------------------ */

/* With one such receive pending, the sender writes the first PUT_SHARE/4 of the message
 * and the receiver reads the rest once its request is out: process_vm_writev and _readv
 * moved a page at half memcpy's speed on a 2-vCPU VM, so a gather's root copying its own
 * block took 1 MiB from its peer in 49 us written whole, 43 with a quarter read (60 %: 49;
 * 16 MiB: 762, 626 and 701 us; Open MPI 58 and 1536). Where the kernel copies as fast as
 * memcpy, the whole written would be ahead by a quarter. With several pending (a root of
 * 4 ranks) the senders write it all: the root has their reads to do on top of its copy (1
 * MiB on 4 ranks: 66 us written whole, 93 with quarters read). A share to read under
 * PUT_READ_MIN is left to the sender. */
#define PUT_SHARE 3
#define PUT_READ_MIN ((uint64_t)64 << 10)

static uint64_t put_wlen(const gcoll_transport_t *t, uint64_t len)
{
    uint64_t w = (len / 4 * PUT_SHARE) & ~(uint64_t)4095;
    return t->nbusy > 1 || len - w < PUT_READ_MIN ? len : w;
}

/* The end of a receive the sender was asked to write: its PUTFIN came (status), and our
 * own read of the rest, if any, is done. Frees op. */
static void put_done(gcoll_transport_t *t, ucx_op_t *op, gcoll_status_t status)
{
    gcoll_treq_t *req = op->req;
    int live = op->cma_token != 0, peer = op->peer;
    int split = op->put_wlen < op->len; /* the sender waits for our FIN */
    uint8_t desc[GCOLL_UCX_CMA_DESC];
    memcpy(desc, op->cma_desc, sizeof(desc));
    gcoll_ucx_op_unlink(t, op);
    gcoll_ucx_op_release(t, op);
    t->events++;
    if (!req)
        return;
    req->priv = NULL;
    if (status == GCOLL_OK && live) {
        if (split)
            gcoll_ucx_fin_queue(t, peer, gcoll_get_u64(desc + 24), GCOLL_OK);
        req->nbytes = (size_t)gcoll_get_u64(desc + 8);
        t->st_cma_recvs++;
        t->st_cma_puts++;
        gcoll_ucx_complete(t, req, GCOLL_OK);
    } else if (status == GCOLL_ERR_UNSUPPORTED && live) {
        gcoll_ucx_cma_pull(t, peer, req, desc); /* it cannot write here: we read it all */
    } else if (!live) {
        if (split && status != GCOLL_ERR_ABORTED)
            gcoll_ucx_fin_queue(t, peer, gcoll_get_u64(desc + 24), GCOLL_ERR_ABORTED);
        gcoll_ucx_complete(t, req, GCOLL_ERR_ABORTED); /* our cancel waits for this */
    } else {
        recv_failed(t, peer, req, gcoll_get_u64(desc + 8), "its send was withdrawn", 0);
    }
}

/* Our share of a split receive: the rest of the message after the sender's part. */
static void put_read(gcoll_transport_t *t, ucx_op_t *op)
{
    op->put_reading = 0;
    t->nput_reads--;
    int err;
    const char *what = read_from(&t->peers[op->peer], op->req, op->cma_desc, op->put_wlen, &err);
    if (what) {
        /* the sender withdrew or died (its write, if any, is over: it writes only inside
         * its progress, before it could withdraw) */
        gcoll_treq_t *req = op->req;
        int peer = op->peer;
        uint64_t token = gcoll_get_u64(op->cma_desc + 24), len = op->len;
        gcoll_ucx_op_unlink(t, op);
        gcoll_ucx_op_release(t, op);
        t->events++;
        recv_failed(t, peer, req, len, what, err);
        gcoll_ucx_fin_queue(t, peer, token, GCOLL_ERR_PEER);
        return;
    }
    if (op->put_fin) /* the sender's answer came first */
        put_done(t, op, op->put_fin - 1);
}

void gcoll_ucx_cma_put_reads(gcoll_transport_t *t)
{
    for (ucx_op_t *op = t->ops, *next; op && t->nput_reads; op = next) {
        next = op->next;
        if (op->put_reading)
            put_read(t, op);
    }
}

void gcoll_ucx_cma_take(gcoll_transport_t *t, int peer, gcoll_treq_t *req, const uint8_t *desc)
{
    uint64_t len = gcoll_get_u64(desc + 8);
    ucx_op_t *op = NULL;
    if (!(req->flags & GCOLL_TREQ_RECEIVER_BUSY) || len == 0 || !(op = gcoll_ucx_op_alloc(t))) {
        gcoll_ucx_cma_pull(t, peer, req, desc);
        return;
    }
    op->t = t;
    op->req = req;
    op->peer = peer;
    op->is_recv = 1;
    op->cma = 1;
    op->len = (size_t)len;
    op->put_wlen = put_wlen(t, len);
    op->put_token = next_token(t);
    op->cma_token = op->put_token;
    memcpy(op->cma_desc, desc, GCOLL_UCX_CMA_DESC);
    ucx_put_t m = {.send_token = gcoll_get_u64(desc + 24),
                   .addr = (uint64_t)(uintptr_t)req->buf,
                   .len = len,
                   .wlen = op->put_wlen,
                   .tok_addr = (uint64_t)(uintptr_t)&op->cma_token,
                   .token = op->put_token};
    uint8_t msg[GCOLL_UCX_PUT_LEN];
    gcoll_ucx_put_encode(&m, msg);
    gcoll_ucx_op_link(t, op);
    req->priv = op;
    if (op->put_wlen < len) {
        op->put_reading = 1;
        t->nput_reads++;
    }
    if (!ctl_queue(t, peer, UCX_MSG_PUT, GCOLL_OK, msg, sizeof(msg)))
        return; /* the peer was failed, which ended op */
    /* our share once the request is out: inside UCX's callbacks it is only queued, and
     * the read waits for gcoll_ucx_drive to send it */
    if (op->put_reading && !t->in_cb)
        put_read(t, op);
}

/* Ends our side of a single-copy send the receiver asked us to write. */
static void put_answer(gcoll_transport_t *t, int peer, uint64_t token, gcoll_status_t st)
{
    uint8_t tok[8];
    gcoll_put_u64(tok, token);
    ctl_queue(t, peer, UCX_MSG_PUTFIN, st, tok, sizeof(tok));
}

void gcoll_ucx_on_put(gcoll_transport_t *t, int peer, const void *data, size_t len)
{
    ucx_put_t m;
    const char *why = gcoll_ucx_put_decode(data, len, &m);
    ucx_op_t *op = NULL;
    if (!why) {
        for (op = t->ops; op; op = op->next)
            if (op->cma && !op->is_recv && op->peer == peer && op->cma_token == m.send_token)
                break;
        if (op && op->req && m.len != op->req->len)
            why = "its length is not the send's";
    }
    if (why) {
        gcoll_ucx_set_error(t, "rank %d sent a malformed single-copy request: %s", peer, why);
        gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_PEER);
        return;
    }
    if (!op || !op->req) { /* withdrawn: the receiver learns why from our abort */
        put_answer(t, peer, m.token, GCOLL_ERR_ABORTED);
        return;
    }
    int pid = t->peers[peer].cma_pid;
    if (!pid || !token_live(pid, m.tok_addr, m.token)) {
        /* we cannot reach its memory (it reads ours: the FIN ends the send), or it
         * withdrew the receive (it is failing; the send is over as after a FIN) */
        put_answer(t, peer, m.token, pid ? GCOLL_ERR_ABORTED : GCOLL_ERR_UNSUPPORTED);
        if (pid)
            gcoll_ucx_cma_send_end(t, op, GCOLL_OK);
        return;
    }
    int err = vm_move(pid, 1, op->req->buf, m.addr, (size_t)m.wlen);
    if (err) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: cannot write rank %d's receive (%s): it reads", peer,
                    strerror(err));
        put_answer(t, peer, m.token, GCOLL_ERR_UNSUPPORTED);
        return;
    }
    int live = token_live(pid, m.tok_addr, m.token);
    put_answer(t, peer, m.token, live ? GCOLL_OK : GCOLL_ERR_ABORTED);
    /* written whole, or withdrawn: over; else the receiver reads the rest, and its FIN
     * ends the send */
    if (m.wlen == m.len || !live)
        gcoll_ucx_cma_send_end(t, op, GCOLL_OK);
}

void gcoll_ucx_on_putfin(gcoll_transport_t *t, int peer, int status, const void *data, size_t len)
{
    uint64_t token;
    if (!answer_token(t, peer, data, len, &token))
        return;
    ucx_op_t *op = t->ops;
    while (op && !(op->cma && op->is_recv && op->peer == peer && op->put_token == token))
        op = op->next;
    if (!op || op->put_fin)
        return;            /* withdrawn and given up, or a second answer */
    if (op->put_reading) { /* our share is still to read (gcoll_ucx_drive): then */
        op->put_fin = status + 1;
        return;
    }
    put_done(t, op, status);
}
