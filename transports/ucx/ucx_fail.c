/* ucx_fail.c: the UCX transport's peer failures: a failed peer's operations end with its
 * status, the messages it sent whole are kept, and its endpoint is force-closed once out of
 * UCX's callbacks; a closed connection waits a while for an abort explaining it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

/* How long a closed connection waits for an abort explaining it. A rank that failed (say
 * on a mismatch) tells everyone and exits; its neighbour can see the exit before the
 * abort of another rank reaches it, and must still report the real cause. */
#define EP_ERROR_GRACE_MS 500

/* A peer given up at GCOLL_UNEXPECTED_BYTES (or whose message could not be buffered) is
 * told before its endpoint goes, as tcp's closed socket tells it: UCX completes its eager
 * sends whether or not anyone keeps them, so it would otherwise learn only at its next
 * receive from this rank, or at its deadline. It gets an abort notice with the bound
 * (the peer's operations then fail with GCOLL_ERR_PEER naming this rank); its send is
 * given 200 ms before the forced close. */
static void tell_nomem(gcoll_transport_t *t, ucx_peer_t *p)
{
    char why[GCOLL_UCX_ABORT_INLINE + 1];
    int n = snprintf(why, sizeof(why), "your msgs passed GCOLL_UNEXPECTED_BYTES=%zu",
                     p->rx.m ? p->rx.m->unexp_max : (size_t)0);
    ucx_hdr_t h = {.type = UCX_MSG_ABORT,
                   .status = GCOLL_ERR_NOMEM,
                   .src = (uint32_t)t->rank,
                   .cookie = p->cookie};
    size_t len = GCOLL_MIN((size_t)(n > 0 ? n : 0), (size_t)GCOLL_UCX_ABORT_INLINE);
    if (gcoll_ucx_send_op(t, p->rank, NULL, &h, why, len) != GCOLL_OK)
        return;
    uint64_t end = gcoll_time_ms() + 200;
    for (;;) {
        int pending = 0;
        for (ucx_op_t *op = t->ops; op && !pending; op = op->next)
            pending = op->is_ctl && op->peer == p->rank;
        if (!pending || gcoll_time_ms() >= end)
            break;
        if (!ucp_worker_progress(t->worker))
            usleep(100);
    }
}

void gcoll_ucx_close_failed_eps(gcoll_transport_t *t)
{
    if (!t->close_any) /* every progress round comes here: most find nothing to close */
        return;
    t->close_any = 0;
    for (int i = 0; i < t->size; i++) {
        ucx_peer_t *p = &t->peers[i];
        if (!p->close_pending)
            continue;
        p->close_pending = 0;
        if (!p->ep)
            continue;
        if (p->tell_nomem) {
            p->tell_nomem = 0;
            tell_nomem(t, p);
            if (!p->ep) /* closed meanwhile (its own failure, seen in the progress) */
                continue;
        }
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &prm);
        p->ep = NULL;
        /* A forced close completes without the peer; the request only needs releasing. */
        if (UCS_PTR_IS_PTR(sp)) {
            uint64_t end = gcoll_time_ms() + 100;
            while (ucp_request_check_status(sp) == UCS_INPROGRESS && gcoll_time_ms() < end)
                if (!ucp_worker_progress(t->worker))
                    usleep(100); /* idle: do not spin a core for the whole 100 ms */
            ucp_request_free(sp);
        }
    }
}

void gcoll_ucx_peer_fail(gcoll_transport_t *t, int peer, gcoll_status_t st)
{
    ucx_peer_t *p = &t->peers[peer];
    if (p->rx.failed)
        return;
    gcoll_ucx_shm_drain(t, p); /* what it left in its ring came before it failed */
    /* A message whose data arrived before the peer left is still delivered (an orderly
     * close follows the peer's last message, whose receive may not be posted yet); one
     * whose data is still at the peer (rendezvous, single copy) cannot be. */
    gcoll_match_fail(&p->rx, st, GCOLL_MATCH_KEEP_WHOLE);
    for (gcoll_treq_t *r = p->failing; r; r = r->next)
        gcoll_ucx_complete(t, r, st);
    p->failing = p->failing_tail = NULL;
    gcoll_ucx_shm_end_waits(t, p, st);
    /* Single-copy sends waiting for this peer's answer are ours to end. */
    for (ucx_op_t *op = t->ops, *next; op; op = next) {
        next = op->next;
        if (op->cma && op->peer == peer)
            gcoll_ucx_cma_send_end(t, op, st);
    }
    /* Operations UCX still owns complete through their callbacks once the endpoint is
     * closed (UCX purges them); until then their buffers stay in UCX's hands, so the
     * requests are not completed here. */
    if (peer != t->rank && p->ep) {
        p->tell_nomem = st == GCOLL_ERR_NOMEM;
        p->close_pending = 1;
        t->close_any = 1;
        if (!t->in_cb)
            gcoll_ucx_close_failed_eps(t);
    }
}

/* UCX reports a failed endpoint from inside its progress. The peer may have told us why
 * (an abort) in a message still queued on another lane (shared memory: its fifo), so the
 * failure is taken up after the queue is drained, in gcoll_ucx_handle_ep_errors. */
void gcoll_ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *p = arg;
    (void)ep;
    if (p->rx.failed || p->ep_error != UCS_OK)
        return;
    p->ep_error = status;
    p->ep_error_ms = gcoll_time_ms();
    p->t->ep_errors = 1;
}

void gcoll_ucx_handle_ep_errors(gcoll_transport_t *t)
{
    if (!t->ep_errors)
        return;
    t->ep_errors = 0;
    for (int i = 0; i < 16 && ucp_worker_progress(t->worker); i++)
        ;
    uint64_t now = gcoll_time_ms();
    for (int r = 0; r < t->size; r++) {
        ucx_peer_t *p = &t->peers[r];
        ucs_status_t status = p->ep_error;
        if (status == UCS_OK || p->rx.failed)
            continue;
        int busy = p->rx.posted != NULL || p->failing != NULL;
        for (ucx_op_t *op = t->ops; op && !busy; op = op->next)
            busy = op->peer == r && op->req;
        if (busy && now < p->ep_error_ms + EP_ERROR_GRACE_MS) {
            t->ep_errors = 1; /* look again on the next progress */
            continue;
        }
        if (busy) {
            gcoll_ucx_set_error(t,
                                "connection to rank %d failed with operations pending: %s "
                                "(rank %d exited or died)",
                                r, ucs_status_string(status), r);
            GCOLL_WARN("ucx: connection to rank %d failed with operations pending: %s (rank %d "
                       "exited or died)",
                       r, ucs_status_string(status), r);
        } else {
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: connection to rank %d closed: %s", r,
                        ucs_status_string(status));
        }
        gcoll_ucx_peer_fail(t, r, GCOLL_ERR_PEER);
    }
}
