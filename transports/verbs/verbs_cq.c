/* verbs_cq.c: the verbs transport's arrival side: completions (send, receive, errors),
 * what each immediate means (slot message, credit return, end of a rendezvous), progress
 * on the completion channel, the side channel (abort notices, peers leaving) and abort. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

#define ABORT_MAGIC 0xab
#define ABORT_MAX_REASON 1000

/* ---------------------------------------------------------------------------------- */
/* Receive side                                                                         */

/* A matched rendezvous: register the posted buffer and tell the sender where to write. */
void gcoll_vb_rdv_recv_start(gcoll_transport_t *t, int peer, gcoll_treq_t *req, size_t len,
                             uint32_t sid)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    char err[256];
    gcoll_vb_reg_t *reg = NULL;
    gcoll_status_t st = gcoll_vb_reg_acquire(&t->reg, req->buf, len, 0, &reg, err, sizeof(err));
    gcoll_vb_rdv_t *r = st == GCOLL_OK ? gcoll_vb_rdv_new(&p->rdv_rx, &p->nrx) : NULL;
    if (!r) {
        if (st == GCOLL_OK) {
            gcoll_vb_reg_release(&t->reg, reg);
            st = GCOLL_ERR_NOMEM;
            snprintf(err, sizeof(err), "out of memory");
        }
        gcoll_vb_set_error(t, "verbs: receiving %zu bytes from rank %d: %s", len, peer, err);
        gcoll_vb_complete(req, st);
        gcoll_vb_queue_nack(t, peer, sid, st);
        return;
    }
    r->state = GCOLL_VB_RDV_RECV;
    r->req = req;
    r->reg = reg;
    r->len = len;
    gcoll_vb_hdr_t h = {.type = GCOLL_VB_MSG_CTS,
                        .len = len,
                        .addr = (uintptr_t)req->buf,
                        .rkey = reg->mr->rkey,
                        .id1 = sid,
                        .id2 = r->id};
    if (gcoll_vb_queue_msg(p, &h, NULL) != GCOLL_OK)
        gcoll_vb_peer_fail(t, peer, GCOLL_ERR_NOMEM);
}

/* An eager message (from a slot, or a send to oneself). */
void gcoll_vb_deliver_data(gcoll_transport_t *t, int peer, uint64_t tag, uint32_t sig,
                           const uint8_t *data, size_t len)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    gcoll_status_t st;
    gcoll_treq_t *req = gcoll_match_arrived(&p->rx, tag, len, sig, &st);
    if (req)
        gcoll_match_land(&p->rx, req, data, len);
    else if (st == GCOLL_OK &&
             !gcoll_match_keep(&p->rx, tag, sig, len, len, data, GCOLL_UNEXP_WHOLE))
        gcoll_vb_peer_fail(t, peer, GCOLL_ERR_NOMEM);
}

static void deliver_rts(gcoll_transport_t *t, int peer, const gcoll_vb_hdr_t *h)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    gcoll_status_t st;
    gcoll_treq_t *req = gcoll_match_arrived(&p->rx, h->tag, h->len, h->sig, &st);
    if (req) {
        gcoll_vb_rdv_recv_start(t, peer, req, h->len, h->id1);
        return;
    }
    if (st != GCOLL_OK) {
        gcoll_vb_queue_nack(t, peer, h->id1, st);
        return;
    }
    gcoll_unexp_t *u = gcoll_match_keep(&p->rx, h->tag, h->sig, h->len, 0, NULL, 0);
    if (!u) {
        gcoll_vb_peer_fail(t, peer, GCOLL_ERR_NOMEM);
        return;
    }
    u->kind = GCOLL_VB_UNEXP_RTS;
    u->aux = h->id1;
}

static void on_cts(gcoll_transport_t *t, int peer, const gcoll_vb_hdr_t *h)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    gcoll_vb_rdv_t *r = h->id1 < p->ntx ? p->rdv_tx[h->id1] : NULL;
    if (!r || r->state != GCOLL_VB_RDV_WAIT_CTS) {
        gcoll_vb_proto_error(t, peer, "clear-to-send for an unknown rendezvous");
        return;
    }
    if (h->len != r->len) {
        gcoll_vb_proto_error(t, peer, "clear-to-send with another length than offered");
        return;
    }
    r->raddr = h->addr;
    r->rkey = h->rkey;
    r->rid = h->id2;
    r->qp = (int)(p->rr++ % (unsigned)t->nqp);
    r->state = GCOLL_VB_RDV_WRITING;
    r->next = NULL;
    if (p->wq_tail)
        p->wq_tail->next = r;
    else
        p->wq = r;
    p->wq_tail = r;
}

static void on_nack(gcoll_transport_t *t, int peer, const gcoll_vb_hdr_t *h)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    gcoll_vb_rdv_t *r = h->id1 < p->ntx ? p->rdv_tx[h->id1] : NULL;
    if (!r || r->state != GCOLL_VB_RDV_WAIT_CTS) {
        gcoll_vb_proto_error(t, peer, "refusal of an unknown rendezvous");
        return;
    }
    int st = -(int)h->status;
    if (st < GCOLL_ERR_INTERNAL)
        st = GCOLL_ERR_MISMATCH;
    gcoll_vb_set_error(t, "verbs: rank %d refused a %zu-byte message: %s", peer, r->len,
                       gcoll_status_string((gcoll_status_t)st));
    gcoll_vb_complete(r->req, (gcoll_status_t)st);
    gcoll_vb_rdv_free(t, p->rdv_tx, r);
}

/* Slot i is processed. Credits go back only for the contiguous prefix of processed slots:
 * with several QPs slots can complete out of order, and the sender reuses them in order. */
static void slot_free(gcoll_transport_t *t, gcoll_vb_peer_t *p, uint32_t i)
{
    p->rx_done[i] = 1;
    while (p->rx_done[p->rx_head % t->nslots]) {
        p->rx_done[p->rx_head % t->nslots] = 0;
        p->rx_head++;
        p->owed++;
    }
}

static void on_imm(gcoll_transport_t *t, int peer, uint32_t imm, uint32_t byte_len)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    uint32_t val = imm & GCOLL_VB_IMM_MAX;
    switch (imm >> 30) {
    case GCOLL_VB_IMM_SLOT: {
        if (val >= t->nslots) {
            gcoll_vb_proto_error(t, peer, "slot index out of range");
            return;
        }
        if (p->rx_count - p->rx_head >= t->nslots || p->rx_done[val]) {
            gcoll_vb_proto_error(t, peer, "wrote into a slot it held no credit for");
            return;
        }
        p->rx_count++;
        const uint8_t *slot = t->rx_mem + ((size_t)peer * t->nslots + val) * t->slot_size;
        gcoll_vb_hdr_t h;
        const char *why = gcoll_vb_hdr_decode(slot, byte_len, t->eager_max, &h);
        if (why) {
            gcoll_vb_proto_error(t, peer, why);
            return;
        }
        if (h.credits) {
            if (p->tx_acked + h.credits > p->tx_seq) {
                gcoll_vb_proto_error(t, peer, "returned more credits than it was given");
                return;
            }
            p->tx_acked += h.credits;
        }
        switch (h.type) {
        case GCOLL_VB_MSG_DATA:
            gcoll_vb_deliver_data(t, peer, h.tag, h.sig, slot + GCOLL_VB_HDR_LEN, h.len);
            break;
        case GCOLL_VB_MSG_RTS:
            deliver_rts(t, peer, &h);
            break;
        case GCOLL_VB_MSG_CTS:
            on_cts(t, peer, &h);
            break;
        case GCOLL_VB_MSG_NACK:
            on_nack(t, peer, &h);
            break;
        }
        slot_free(t, p, val);
        return;
    }
    case GCOLL_VB_IMM_CREDIT:
        if (val == 0 || p->tx_acked + val > p->tx_seq) {
            gcoll_vb_proto_error(t, peer, "returned more credits than it was given");
            return;
        }
        p->tx_acked += val;
        return;
    case GCOLL_VB_IMM_FIN: {
        gcoll_vb_rdv_t *r = val < p->nrx ? p->rdv_rx[val] : NULL;
        if (!r) {
            gcoll_vb_proto_error(t, peer, "end of an unknown rendezvous");
            return;
        }
        r->req->nbytes = r->len;
        gcoll_vb_complete(r->req, GCOLL_OK);
        gcoll_vb_rdv_free(t, p->rdv_rx, r);
        return;
    }
    default:
        gcoll_vb_proto_error(t, peer, "unknown immediate type");
    }
}

/* ---------------------------------------------------------------------------------- */
/* Completions and progress                                                             */

static int qp_index(gcoll_transport_t *t, gcoll_vb_peer_t *p, uint32_t qp_num)
{
    for (int q = 0; q < t->nqp; q++)
        if (p->qps[q].qp && p->qps[q].qp->qp_num == qp_num)
            return q;
    return -1;
}

static void on_sock(gcoll_transport_t *t, int peer);

static void on_wc(gcoll_transport_t *t, const struct ibv_wc *wc)
{
    unsigned kind = (unsigned)(wc->wr_id >> 60);
    int peer = (int)((wc->wr_id >> 32) & 0xfffffff);
    uint32_t val = (uint32_t)wc->wr_id;
    if (peer >= t->size || peer == t->rank || kind < GCOLL_VB_WR_SLOT || kind > GCOLL_VB_WR_RECV) {
        GCOLL_WARN("verbs: completion with a foreign work request id 0x%llx",
                   (unsigned long long)wc->wr_id);
        return;
    }
    gcoll_vb_peer_t *p = &t->peers[peer];
    if (p->rx.failed)
        return; /* flushed after the failure was reported */
    if (kind != GCOLL_VB_WR_RECV) {
        int q = kind == GCOLL_VB_WR_RDV && val < p->ntx && p->rdv_tx[val]
                    ? p->rdv_tx[val]->qp
                    : qp_index(t, p, wc->qp_num);
        if (q >= 0)
            p->qps[q].sq_free++;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        static const char *const what[] = {"", "eager send", "credit return", "rendezvous write",
                                           "receive"};
        gcoll_status_t st = gcoll_vb_wc_status(wc->status);
        /* A peer that fails a call (a mismatch, say) tells everyone on the side channel and
         * then tears down its queue pairs; our sends to it then fail. Its notice, already
         * waiting on the socket, says why: read it first, so that every rank reports the
         * mismatch rather than the transport error it caused. */
        uint8_t b;
        if (p->fd >= 0 && recv(p->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 1 && b == ABORT_MAGIC)
            on_sock(t, peer);
        if (t->abort_status < 0)
            st = t->abort_status;
        gcoll_vb_set_error(t,
                           "verbs: %s to rank %d failed: %s (%s, vendor error 0x%x, qp "
                           "0x%x)",
                           what[kind], peer, t->ibv->wc_status_str(wc->status),
                           gcoll_vb_wc_name(wc->status), wc->vendor_err, wc->qp_num);
        GCOLL_WARN("verbs: %s to rank %d failed: %s (%s, vendor error 0x%x, qp 0x%x)", what[kind],
                   peer, t->ibv->wc_status_str(wc->status), gcoll_vb_wc_name(wc->status),
                   wc->vendor_err, wc->qp_num);
        gcoll_vb_peer_fail(t, peer, st);
        return;
    }
    switch (kind) {
    case GCOLL_VB_WR_SLOT:
        if (val < t->nslots) {
            gcoll_treq_t *req = p->stage[val].req;
            p->stage[val].busy = 0;
            p->stage[val].req = NULL;
            gcoll_vb_complete(req, GCOLL_OK);
        }
        break;
    case GCOLL_VB_WR_CREDIT:
        break;
    case GCOLL_VB_WR_RDV: {
        gcoll_vb_rdv_t *r = val < p->ntx ? p->rdv_tx[val] : NULL;
        if (r && --r->chunks_out == 0 && r->state == GCOLL_VB_RDV_POSTED) {
            gcoll_vb_complete(r->req, GCOLL_OK);
            gcoll_vb_rdv_free(t, p->rdv_tx, r);
        }
        break;
    }
    case GCOLL_VB_WR_RECV: {
        int q = (int)val < t->nqp ? (int)val : 0;
        struct ibv_recv_wr wr = {.wr_id = wc->wr_id}, *bad = NULL;
        int rc = t->ibv->post_recv(p->qps[q].qp, &wr, &bad);
        if (rc != 0) {
            gcoll_vb_set_error(t, "verbs: ibv_post_recv for rank %d: %s", peer, strerror(rc));
            gcoll_vb_peer_fail(t, peer, GCOLL_ERR_TRANSPORT);
            return;
        }
        if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
            gcoll_vb_proto_error(t, peer, "a receive that is not an RDMA write with immediate");
            return;
        }
        on_imm(t, peer, ntohl(wc->imm_data), wc->byte_len);
        break;
    }
    }
}

int gcoll_vb_drain(gcoll_transport_t *t)
{
    struct ibv_wc wc[32];
    int total = 0;
    for (;;) {
        int n = t->ibv->poll_cq(t->cq, 32, wc);
        if (n < 0) {
            gcoll_vb_set_error(t, "verbs: ibv_poll_cq failed on %s", t->dev_name);
            for (int i = 0; i < t->size; i++)
                if (i != t->rank)
                    gcoll_vb_peer_fail(t, i, GCOLL_ERR_TRANSPORT);
            return total;
        }
        for (int i = 0; i < n; i++)
            on_wc(t, &wc[i]);
        total += n;
        if (n < 32)
            return total;
    }
}

static void peer_fail_all(gcoll_transport_t *t, gcoll_status_t st)
{
    for (int i = 0; i < t->size; i++)
        if (i != t->rank)
            gcoll_vb_peer_fail(t, i, st);
}

static int peer_busy(gcoll_transport_t *t, gcoll_vb_peer_t *p)
{
    if (p->rx.posted || p->txq || p->wq)
        return 1;
    for (uint32_t i = 0; i < p->ntx; i++)
        if (p->rdv_tx[i])
            return 1;
    for (uint32_t i = 0; i < p->nrx; i++)
        if (p->rdv_rx[i])
            return 1;
    for (uint32_t i = 0; i < t->nslots; i++)
        if (p->stage[i].req)
            return 1;
    return 0;
}

/* The side channel is readable: an abort notice, or the peer is gone. */
static void on_sock(gcoll_transport_t *t, int peer)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    if (p->fd < 0)
        return;
    uint8_t hdr[4];
    ssize_t n = recv(p->fd, hdr, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n == 1) {
        char reason[ABORT_MAX_REASON + 1] = "";
        uint64_t dl = gcoll_time_ms() + 1000;
        if (hdr[0] != ABORT_MAGIC || gcoll_sock_read_all(p->fd, hdr + 1, 3, dl) != GCOLL_OK ||
            gcoll_get_u16(hdr + 2) > ABORT_MAX_REASON ||
            gcoll_sock_read_all(p->fd, reason, gcoll_get_u16(hdr + 2), dl) != GCOLL_OK) {
            gcoll_vb_set_error(t, "verbs: garbage on the side channel of rank %d", peer);
            gcoll_vb_peer_fail(t, peer, GCOLL_ERR_TRANSPORT);
            return;
        }
        reason[gcoll_get_u16(hdr + 2)] = '\0';
        gcoll_vb_set_error(t, "rank %d aborted: %s", peer, reason);
        GCOLL_WARN("rank %d aborted: %s", peer, reason);
        int mismatch = -(int)hdr[1] == GCOLL_ERR_MISMATCH;
        if (t->abort_status == GCOLL_OK || mismatch)
            t->abort_status = mismatch ? GCOLL_ERR_MISMATCH : GCOLL_ERR_PEER;
        t->abort_quiet_since = gcoll_time_ms();
        return;
    }
    /* End of file (or reset). Whatever landed before the peer left still counts. */
    gcoll_vb_drain(t);
    if (p->rx.failed)
        return;
    epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
    close(p->fd);
    p->fd = -1;
    if (peer_busy(t, p)) {
        gcoll_vb_set_error(t,
                           "verbs: connection to rank %d closed with operations pending "
                           "(rank %d exited or died)",
                           peer, peer);
        GCOLL_WARN("%s", t->errmsg);
        gcoll_vb_peer_fail(t, peer, t->abort_status < 0 ? t->abort_status : GCOLL_ERR_PEER);
    } else {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "verbs: rank %d closed its connection", peer);
        p->closed = 1;
    }
}

#define VB_ABORT_GRACE_MS 200

/* After a peer's abort notice: once nothing has completed for the grace period, fail
 * everything pending (see abort_status in verbs.h). */
static void abort_grace(gcoll_transport_t *t, int progressed)
{
    if (t->abort_status == GCOLL_OK || t->abort_final)
        return;
    uint64_t now = gcoll_time_ms();
    if (progressed) {
        t->abort_quiet_since = now;
    } else if (now - t->abort_quiet_since >= VB_ABORT_GRACE_MS) {
        t->abort_final = 1;
        peer_fail_all(t, t->abort_status);
    }
}

static gcoll_status_t vb_progress(gcoll_transport_t *t, int timeout_ms, int *progressed);

gcoll_status_t gcoll_vb_progress(gcoll_transport_t *t, int timeout_ms)
{
    int progressed = 0;
    gcoll_status_t st =
        vb_progress(t, t->abort_status < 0 ? GCOLL_MIN(timeout_ms, 20) : timeout_ms, &progressed);
    abort_grace(t, progressed);
    return st;
}

static gcoll_status_t vb_progress(gcoll_transport_t *t, int timeout_ms, int *progressed)
{
    if (gcoll_vb_drain(t) > 0) {
        *progressed = 1;
        gcoll_vb_push_all(t);
        return GCOLL_OK;
    }
    /* Arm, then look again: a completion between the poll and the arm raises no event. */
    if (t->ibv->req_notify_cq(t->cq, 0) != 0) {
        gcoll_vb_set_error(t, "verbs: ibv_req_notify_cq failed on %s", t->dev_name);
        return GCOLL_ERR_TRANSPORT;
    }
    if (gcoll_vb_drain(t) > 0) {
        *progressed = 1;
        gcoll_vb_push_all(t);
        return GCOLL_OK;
    }
    struct epoll_event ev[64];
    int n = epoll_wait(t->epfd, ev, 64, timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return GCOLL_OK;
        gcoll_vb_set_error(t, "verbs: epoll_wait: %s", strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u64 == 0) {
            struct ibv_cq *cq;
            void *ctx;
            while (t->ibv->get_cq_event(t->chan, &cq, &ctx) == 0)
                t->ibv->ack_cq_events(cq, 1);
        } else if (ev[i].data.u64 >= 2) {
            on_sock(t, (int)(ev[i].data.u64 - 2));
        }
    }
    if (gcoll_vb_drain(t) > 0)
        *progressed = 1;
    gcoll_vb_push_all(t);
    return GCOLL_OK;
}

void gcoll_vb_abort(gcoll_transport_t *t, gcoll_status_t status, const char *reason)
{
    size_t len = GCOLL_MIN(strlen(reason), (size_t)ABORT_MAX_REASON);
    uint8_t frame[4 + ABORT_MAX_REASON];
    frame[0] = ABORT_MAGIC;
    frame[1] = (uint8_t)(-(int)status);
    gcoll_put_u16(frame + 2, (uint16_t)len);
    memcpy(frame + 4, reason, len);
    uint64_t deadline = gcoll_time_ms() + 1000;
    for (int peer = 0; peer < t->size; peer++) {
        gcoll_vb_peer_t *p = &t->peers[peer];
        if (peer == t->rank || p->rx.failed || p->fd < 0)
            continue;
        if (gcoll_sock_write_all(p->fd, frame, 4 + len, deadline) != GCOLL_OK)
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "verbs: cannot tell rank %d about the abort", peer);
    }
}
