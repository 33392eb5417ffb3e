/* ucx_cma.c: the UCX transport's single copy between ranks of one host (GCOLL_UCX_CMA_MIN;
 * protocol in ucx_int.h): the descriptor sent in place of the data, the receiver's read
 * with process_vm_readv, the FIN that ends the send. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

/* Sends the FINs queued by receives that completed inside UCX's callbacks. */
void gcoll_ucx_fin_flush(gcoll_transport_t *t)
{
    for (int i = 0; i < t->nfin; i++) {
        struct ucx_fin *f = &t->fin[i];
        uint8_t tok[8];
        gcoll_put_u64(tok, f->token);
        /* a failed peer (or one whose endpoint is closed) needs no answer */
        if (gcoll_ucx_send_ctl(t, f->peer, UCX_MSG_FIN, f->status, tok, sizeof(tok)) ==
            GCOLL_ERR_NOMEM)
            gcoll_ucx_peer_fail(t, f->peer, GCOLL_ERR_NOMEM);
    }
    t->nfin = 0;
}

/* Tells the sender its single-copy send is over (status: how the read went). */
void gcoll_ucx_fin_queue(gcoll_transport_t *t, int peer, uint64_t token, gcoll_status_t status)
{
    if (t->nfin == t->capfin) {
        int cap = t->capfin ? 2 * t->capfin : 16;
        struct ucx_fin *f = realloc(t->fin, (size_t)cap * sizeof(*f));
        if (!f) {
            gcoll_ucx_set_error(t, "out of memory answering a single-copy send of rank %d", peer);
            gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_NOMEM);
            return;
        }
        t->fin = f;
        t->capfin = cap;
    }
    t->fin[t->nfin++] = (struct ucx_fin){.peer = peer, .status = status, .token = token};
    if (!t->in_cb)
        gcoll_ucx_fin_flush(t);
}

/* Reads a matched single-copy message (desc: GCOLL_UCX_CMA_DESC bytes off the wire, length
 * already matched against req) from the sender's memory into req->buf, then checks that
 * the send was still live when the read ended (its token word unchanged). */
void gcoll_ucx_cma_pull(gcoll_transport_t *t, int peer, gcoll_treq_t *req, const uint8_t *desc)
{
    ucx_peer_t *p = &t->peers[peer];
    uint64_t addr = gcoll_get_u64(desc), len = gcoll_get_u64(desc + 8);
    uint64_t tok_addr = gcoll_get_u64(desc + 16), token = gcoll_get_u64(desc + 24), now = 0;
    const char *what = NULL;
    int err = 0;
    size_t done = 0;
    while (done < len) {
        struct iovec l = {.iov_base = (uint8_t *)req->buf + done, .iov_len = len - done};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(addr + done), .iov_len = len - done};
        ssize_t n = process_vm_readv(p->cma_pid, &l, 1, &r, 1, 0);
        if (n <= 0) {
            err = n < 0 ? errno : EFAULT;
            what = "reading its buffer";
            break;
        }
        done += (size_t)n;
    }
    if (!what) {
        struct iovec l = {.iov_base = &now, .iov_len = sizeof(now)};
        struct iovec r = {.iov_base = (void *)(uintptr_t)tok_addr, .iov_len = sizeof(now)};
        if (process_vm_readv(p->cma_pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(now)) {
            err = errno;
            what = "reading its token";
        } else if (now != token) {
            what = "its send was withdrawn during the read";
        }
    }
    if (what) {
        /* The sender withdrew (it is failing: an abort may be on its way, with the
         * status that should decide, say a mismatch elsewhere) or died: held as an
         * operation on a failing endpoint, as UCX's own failures are (op_finish). */
        gcoll_ucx_set_error(t, "single-copy receive of %llu bytes from rank %d failed: %s%s%s",
                            (unsigned long long)len, peer, what, err ? ": " : "",
                            err ? strerror(err) : "");
        if (!p->rx.failed && !t->closing)
            gcoll_ucx_hold_for_abort(t, p, req, UCS_ERR_IO_ERROR);
        else
            gcoll_ucx_complete(t, req, p->rx.failed ? p->rx.status : GCOLL_ERR_PEER);
        gcoll_ucx_fin_queue(t, peer, token, GCOLL_ERR_PEER);
        return;
    }
    req->nbytes = (size_t)len;
    t->st_cma_recvs++;
    gcoll_ucx_complete(t, req, GCOLL_OK);
    gcoll_ucx_fin_queue(t, peer, token, GCOLL_OK);
}

/* A FIN for one of our single-copy sends. */
void gcoll_ucx_on_fin(gcoll_transport_t *t, int peer, int status, const void *data, size_t len)
{
    if (len != 8 || !data) {
        gcoll_ucx_set_error(t, "rank %d sent a malformed single-copy answer (%zu bytes)", peer,
                            len);
        gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_PEER);
        return;
    }
    uint64_t token = gcoll_get_u64(data);
    for (ucx_op_t *op = t->ops; op; op = op->next) {
        if (!op->cma || op->peer != peer || op->cma_token != token)
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
    uint64_t token = t->cma_next++;
    if (token == 0)
        token = t->cma_next++;
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
