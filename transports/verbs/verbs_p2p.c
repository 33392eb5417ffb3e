/* verbs_p2p.c: the verbs transport's posting side: slot-message wire format, isend/irecv/
 * cancel (receives matched in match.c), and pushing slot messages (credit flow control),
 * credit returns and rendezvous chunks onto the queue pairs. Arrivals are in verbs_cq.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

/* ---------------------------------------------------------------------------------- */
/* Wire format                                                                          */

void gcoll_vb_hdr_encode(const gcoll_vb_hdr_t *h, uint8_t *p)
{
    gcoll_put_u16(p, GCOLL_VB_MAGIC);
    p[2] = GCOLL_VB_VERSION;
    p[3] = h->type;
    gcoll_put_u32(p + 4, h->sig);
    gcoll_put_u64(p + 8, h->tag);
    gcoll_put_u64(p + 16, h->len);
    gcoll_put_u64(p + 24, h->addr);
    gcoll_put_u32(p + 32, h->rkey);
    gcoll_put_u32(p + 36, h->id1);
    gcoll_put_u32(p + 40, h->id2);
    gcoll_put_u16(p + 44, h->credits);
    p[46] = h->status;
    p[47] = 0;
}

const char *gcoll_vb_hdr_decode(const uint8_t *p, size_t byte_len, size_t eager_max,
                                gcoll_vb_hdr_t *h)
{
    if (byte_len < GCOLL_VB_HDR_LEN)
        return "message shorter than its header";
    if (gcoll_get_u16(p) != GCOLL_VB_MAGIC)
        return "bad magic";
    if (p[2] != GCOLL_VB_VERSION)
        return "unsupported protocol version";
    if (p[47] != 0)
        return "reserved header byte set";
    h->type = p[3];
    h->sig = gcoll_get_u32(p + 4);
    h->tag = gcoll_get_u64(p + 8);
    h->len = gcoll_get_u64(p + 16);
    h->addr = gcoll_get_u64(p + 24);
    h->rkey = gcoll_get_u32(p + 32);
    h->id1 = gcoll_get_u32(p + 36);
    h->id2 = gcoll_get_u32(p + 40);
    h->credits = gcoll_get_u16(p + 44);
    h->status = p[46];
    switch (h->type) {
    case GCOLL_VB_MSG_DATA:
        if (h->len > eager_max)
            return "eager payload larger than a slot";
        if (byte_len != GCOLL_VB_HDR_LEN + h->len)
            return "payload length disagrees with the bytes written";
        return NULL;
    case GCOLL_VB_MSG_RTS:
    case GCOLL_VB_MSG_CTS:
    case GCOLL_VB_MSG_NACK:
        if (byte_len != GCOLL_VB_HDR_LEN)
            return "control message with a payload";
        if (h->id1 > GCOLL_VB_IMM_MAX || h->id2 > GCOLL_VB_IMM_MAX)
            return "rendezvous id out of range";
        if (h->type != GCOLL_VB_MSG_NACK && h->len == 0)
            return "empty rendezvous";
        if (h->type == GCOLL_VB_MSG_NACK && h->status == 0)
            return "refusal without a status";
        return NULL;
    default:
        return "unknown message type";
    }
}

/* ---------------------------------------------------------------------------------- */
/* Small helpers                                                                        */

void gcoll_vb_proto_error(gcoll_transport_t *t, int peer, const char *why)
{
    gcoll_vb_set_error(t, "verbs: malformed message from rank %d: %s; connection dropped", peer,
                       why);
    GCOLL_WARN("verbs: malformed message from rank %d: %s; connection dropped", peer, why);
    gcoll_vb_peer_fail(t, peer, GCOLL_ERR_TRANSPORT);
}

/* Lowest free index of a rendezvous table (grown by doubling); -1 when out of memory. */
static long rdv_slot(gcoll_vb_rdv_t ***tab, uint32_t *n)
{
    for (uint32_t i = 0; i < *n; i++)
        if (!(*tab)[i])
            return i;
    uint32_t nn = *n ? 2 * *n : 16;
    if (nn > GCOLL_VB_IMM_MAX)
        return -1;
    gcoll_vb_rdv_t **t2 = realloc(*tab, nn * sizeof(*t2));
    if (!t2)
        return -1;
    memset(t2 + *n, 0, (nn - *n) * sizeof(*t2));
    long id = *n;
    *tab = t2;
    *n = nn;
    return id;
}

gcoll_vb_rdv_t *gcoll_vb_rdv_new(gcoll_vb_rdv_t ***tab, uint32_t *n)
{
    long id = rdv_slot(tab, n);
    gcoll_vb_rdv_t *r = id >= 0 ? calloc(1, sizeof(*r)) : NULL;
    if (!r)
        return NULL;
    r->id = (uint32_t)id;
    (*tab)[id] = r;
    return r;
}

void gcoll_vb_rdv_free(gcoll_transport_t *t, gcoll_vb_rdv_t **tab, gcoll_vb_rdv_t *r)
{
    tab[r->id] = NULL;
    gcoll_vb_reg_release(&t->reg, r->reg);
    free(r);
}

gcoll_status_t gcoll_vb_queue_msg(gcoll_vb_peer_t *p, const gcoll_vb_hdr_t *h, gcoll_treq_t *req)
{
    gcoll_vb_txop_t *op = calloc(1, sizeof(*op));
    if (!op)
        return GCOLL_ERR_NOMEM;
    op->hdr = *h;
    op->req = req;
    if (p->txq_tail)
        p->txq_tail->next = op;
    else
        p->txq = op;
    p->txq_tail = op;
    return GCOLL_OK;
}

void gcoll_vb_queue_nack(gcoll_transport_t *t, int peer, uint32_t sid, gcoll_status_t st)
{
    gcoll_vb_hdr_t h = {.type = GCOLL_VB_MSG_NACK, .id1 = sid, .status = (uint8_t)(-(int)st)};
    if (gcoll_vb_queue_msg(&t->peers[peer], &h, NULL) != GCOLL_OK)
        gcoll_vb_peer_fail(t, peer, GCOLL_ERR_NOMEM);
}

/* ---------------------------------------------------------------------------------- */
/* Send side                                                                            */

static int pick_qp(gcoll_transport_t *t, gcoll_vb_peer_t *p)
{
    for (int i = 0; i < t->nqp; i++) {
        int q = (int)((p->rr + (unsigned)i) % (unsigned)t->nqp);
        if (p->qps[q].sq_free > 0) {
            p->rr = (unsigned)q + 1;
            p->qps[q].sq_free--;
            return q;
        }
    }
    return -1;
}

/* One signaled RDMA write (with immediate when imm_p is set). 0 or -1 (peer failed). */
static int post_write(gcoll_transport_t *t, int peer, int q, const void *laddr, size_t len,
                      uint32_t lkey, uint64_t raddr, uint32_t rkey, const uint32_t *imm_p,
                      uint64_t wrid)
{
    struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = (uint32_t)len, .lkey = lkey};
    struct ibv_send_wr wr = {
        .wr_id = wrid,
        .sg_list = len ? &sge : NULL,
        .num_sge = len ? 1 : 0,
        .opcode = imm_p ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = imm_p ? htonl(*imm_p) : 0,
        .wr.rdma = {.remote_addr = raddr, .rkey = rkey},
    };
    struct ibv_send_wr *bad = NULL;
    int rc = t->ibv->post_send(t->peers[peer].qps[q].qp, &wr, &bad);
    if (rc == 0)
        return 0;
    gcoll_vb_set_error(t, "verbs: ibv_post_send to rank %d (qp 0x%x): %s", peer,
                       t->peers[peer].qps[q].qp->qp_num, strerror(rc));
    GCOLL_WARN("%s", t->errmsg);
    gcoll_vb_peer_fail(t, peer, GCOLL_ERR_TRANSPORT);
    return -1;
}

void gcoll_vb_push(gcoll_transport_t *t, int peer)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    if (p->rx.failed || peer == t->rank)
        return;
    /* Slot messages, in order, while the receiver has room and we have a staging slot. */
    while (p->txq) {
        uint32_t idx = (uint32_t)(p->tx_seq % t->nslots);
        if (p->tx_seq - p->tx_acked >= t->nslots || p->stage[idx].busy) {
            t->n_stalls++;
            break;
        }
        int q = pick_qp(t, p);
        if (q < 0)
            break;
        gcoll_vb_txop_t *op = p->txq;
        p->txq = op->next;
        if (!p->txq)
            p->txq_tail = NULL;
        size_t off = ((size_t)peer * t->nslots + idx) * t->slot_size;
        uint8_t *slot = t->tx_mem + off;
        uint64_t give = GCOLL_MIN(p->owed, (uint64_t)0xffff);
        op->hdr.credits = (uint16_t)give;
        p->owed -= give;
        gcoll_vb_hdr_encode(&op->hdr, slot);
        size_t plen = op->hdr.type == GCOLL_VB_MSG_DATA ? op->hdr.len : 0;
        if (plen)
            memcpy(slot + GCOLL_VB_HDR_LEN, op->req->buf, plen);
        uint32_t imm = gcoll_vb_imm(GCOLL_VB_IMM_SLOT, idx);
        p->stage[idx].busy = 1;
        p->stage[idx].req = op->hdr.type == GCOLL_VB_MSG_DATA ? op->req : NULL;
        p->tx_seq++;
        free(op);
        if (post_write(t, peer, q, slot, GCOLL_VB_HDR_LEN + plen, t->tx_mr->lkey,
                       p->ring_raddr + (uint64_t)idx * t->slot_size, p->ring_rkey, &imm,
                       gcoll_vb_wrid(GCOLL_VB_WR_SLOT, peer, idx)) != 0)
            return;
    }
    /* Credits nobody piggybacked: a zero-length write with immediate, consuming no slot,
     * so returning credits can never wait for credits. */
    if (p->owed >= GCOLL_MAX(t->nslots / 2, 1u)) {
        int q = pick_qp(t, p);
        if (q >= 0) {
            uint32_t imm = gcoll_vb_imm(GCOLL_VB_IMM_CREDIT, (uint32_t)p->owed);
            p->owed = 0;
            t->n_credit_msgs++;
            if (post_write(t, peer, q, NULL, 0, 0, p->ring_raddr, p->ring_rkey, &imm,
                           gcoll_vb_wrid(GCOLL_VB_WR_CREDIT, peer, 0)) != 0)
                return;
        }
    }
    /* Rendezvous writes: chunks of at most chunk_max (the port's max_msg_sz), the last
     * one with the receiver's id in its immediate. */
    while (p->wq) {
        gcoll_vb_rdv_t *r = p->wq;
        gcoll_vb_qp_t *qp = &p->qps[r->qp];
        while (r->off < r->len && qp->sq_free > 0) {
            size_t n = GCOLL_MIN(t->chunk_max, r->len - r->off);
            int last = r->off + n == r->len;
            uint32_t imm = gcoll_vb_imm(GCOLL_VB_IMM_FIN, r->rid);
            qp->sq_free--;
            r->chunks_out++;
            t->n_chunks++;
            size_t off = r->off;
            r->off += n;
            if (post_write(t, peer, r->qp, (const uint8_t *)r->req->buf + off, n, r->reg->mr->lkey,
                           r->raddr + off, r->rkey, last ? &imm : NULL,
                           gcoll_vb_wrid(GCOLL_VB_WR_RDV, peer, r->id)) != 0)
                return;
        }
        if (r->off < r->len)
            break;
        r->state = GCOLL_VB_RDV_POSTED;
        p->wq = r->next;
        if (!p->wq)
            p->wq_tail = NULL;
    }
}

void gcoll_vb_push_all(gcoll_transport_t *t)
{
    for (int i = 0; i < t->size; i++) {
        gcoll_vb_peer_t *p = &t->peers[i];
        if (i != t->rank && !p->rx.failed && (p->txq || p->wq || p->owed))
            gcoll_vb_push(t, i);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Operations                                                                           */

gcoll_status_t gcoll_vb_isend(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->peer < 0 || req->peer >= t->size || (req->len && !req->buf))
        return GCOLL_ERR_INVALID;
    req->done = 0;
    req->status = GCOLL_INPROGRESS;
    if (req->peer == t->rank) { /* in memory, never through the adapter */
        gcoll_vb_deliver_data(t, t->rank, req->tag, req->sig, req->buf, req->len);
        gcoll_vb_complete(req, GCOLL_OK);
        return GCOLL_OK;
    }
    gcoll_vb_peer_t *p = &t->peers[req->peer];
    if (p->rx.failed || p->closed) {
        gcoll_vb_complete(req, p->rx.failed ? p->rx.status : GCOLL_ERR_PEER);
        return GCOLL_OK;
    }
    gcoll_vb_hdr_t h = {
        .type = GCOLL_VB_MSG_DATA, .sig = req->sig, .tag = req->tag, .len = req->len};
    if (req->len > t->eager_max) {
        char err[256];
        gcoll_vb_reg_t *reg = NULL;
        gcoll_status_t st =
            gcoll_vb_reg_acquire(&t->reg, req->buf, req->len, 0, &reg, err, sizeof(err));
        if (st != GCOLL_OK) {
            gcoll_vb_set_error(t, "verbs: sending %zu bytes to rank %d: %s", req->len, req->peer,
                               err);
            return st;
        }
        gcoll_vb_rdv_t *r = gcoll_vb_rdv_new(&p->rdv_tx, &p->ntx);
        if (!r) {
            gcoll_vb_reg_release(&t->reg, reg);
            return GCOLL_ERR_NOMEM;
        }
        r->state = GCOLL_VB_RDV_WAIT_CTS;
        r->req = req;
        r->reg = reg;
        r->len = req->len;
        h.type = GCOLL_VB_MSG_RTS;
        h.id1 = r->id;
    }
    if (gcoll_vb_queue_msg(p, &h, req) != GCOLL_OK) {
        if (h.type == GCOLL_VB_MSG_RTS)
            gcoll_vb_rdv_free(t, p->rdv_tx, p->rdv_tx[h.id1]);
        return GCOLL_ERR_NOMEM;
    }
    gcoll_vb_push(t, req->peer);
    return GCOLL_OK;
}

gcoll_status_t gcoll_vb_irecv(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->peer < 0 || req->peer >= t->size || (req->len && !req->buf))
        return GCOLL_ERR_INVALID;
    req->done = 0;
    req->status = GCOLL_INPROGRESS;
    req->nbytes = 0;
    gcoll_vb_peer_t *p = &t->peers[req->peer];
    gcoll_status_t st;
    gcoll_unexp_t *u = gcoll_match_claim(&p->rx, req, &st);
    if (u) {
        if (u->kind == GCOLL_VB_UNEXP_RTS) {
            if (st == GCOLL_OK)
                gcoll_vb_rdv_recv_start(t, req->peer, req, u->len, (uint32_t)u->aux);
            else
                gcoll_vb_queue_nack(t, req->peer, (uint32_t)u->aux, st);
            gcoll_vb_push(t, req->peer);
        } else if (st == GCOLL_OK) {
            gcoll_match_land(&p->rx, req, u->data, u->len);
        }
        gcoll_match_unexp_free(&p->rx, u);
        return GCOLL_OK;
    }
    if (req->peer != t->rank && p->closed && !p->rx.failed) {
        gcoll_vb_set_error(t, "verbs: rank %d has left (it closed its connection)", req->peer);
        gcoll_vb_complete(req, GCOLL_ERR_PEER);
        return GCOLL_OK;
    }
    gcoll_match_post(&p->rx, req);
    return GCOLL_OK;
}

gcoll_status_t gcoll_vb_peek(gcoll_transport_t *t, const uint64_t *tags, int *peer_p)
{
    gcoll_match_peek_t pk;
    gcoll_match_peek_init(&pk);
    for (int i = 0; i < t->size; i++) {
        gcoll_vb_peer_t *p = &t->peers[i];
        /* a peer that left cleanly sends no more: its receives fail (gcoll_vb_irecv) */
        int left = i != t->rank && p->closed && !p->rx.failed;
        gcoll_match_peek_add(&pk, &p->rx, tags[i], left ? GCOLL_ERR_PEER : GCOLL_OK);
    }
    gcoll_status_t st = gcoll_match_peek_result(&pk, peer_p);
    if (st == GCOLL_ERR_PEER && !t->peers[*peer_p].rx.failed)
        gcoll_vb_set_error(t, "verbs: rank %d has left (it closed its connection)", *peer_p);
    return st;
}

void gcoll_vb_cancel(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->done || req->peer < 0 || req->peer >= t->size)
        return;
    gcoll_vb_peer_t *p = &t->peers[req->peer];
    if (gcoll_match_cancel(&p->rx, req))
        return;
    gcoll_vb_txop_t *oprev = NULL;
    for (gcoll_vb_txop_t **op = &p->txq; *op; oprev = *op, op = &(*op)->next) {
        gcoll_vb_txop_t *o = *op;
        if (o->req != req)
            continue;
        *op = o->next;
        if (p->txq_tail == o)
            p->txq_tail = oprev;
        if (o->hdr.type == GCOLL_VB_MSG_RTS)
            gcoll_vb_rdv_free(t, p->rdv_tx, p->rdv_tx[o->hdr.id1]);
        free(o);
        gcoll_vb_complete(req, GCOLL_ERR_ABORTED);
        return;
    }
    for (uint32_t i = 0; p->stage && i < t->nslots; i++) {
        if (p->stage[i].req == req) { /* copied out already: only forget the request */
            p->stage[i].req = NULL;
            gcoll_vb_complete(req, GCOLL_ERR_ABORTED);
            return;
        }
    }
    /* A rendezvous under way: the adapter may be reading or writing the buffer, so the
     * connection is given up (the communicator is broken at this point anyway). */
    gcoll_vb_peer_fail(t, req->peer, GCOLL_ERR_ABORTED);
}

void gcoll_vb_peer_release(gcoll_transport_t *t, gcoll_vb_peer_t *p, gcoll_status_t st)
{
    int fail = st < 0;
    for (uint32_t i = 0; p->stage && i < t->nslots; i++) {
        if (fail)
            gcoll_vb_complete(p->stage[i].req, st);
        p->stage[i].req = NULL;
    }
    while (p->txq) {
        gcoll_vb_txop_t *o = p->txq;
        p->txq = o->next;
        if (fail)
            gcoll_vb_complete(o->req, st);
        free(o);
    }
    p->txq_tail = NULL;
    for (uint32_t i = 0; i < p->ntx; i++) {
        if (p->rdv_tx[i]) {
            if (fail)
                gcoll_vb_complete(p->rdv_tx[i]->req, st);
            gcoll_vb_rdv_free(t, p->rdv_tx, p->rdv_tx[i]);
        }
    }
    for (uint32_t i = 0; i < p->nrx; i++) {
        if (p->rdv_rx[i]) {
            if (fail)
                gcoll_vb_complete(p->rdv_rx[i]->req, st);
            gcoll_vb_rdv_free(t, p->rdv_rx, p->rdv_rx[i]);
        }
    }
    free(p->rdv_tx);
    free(p->rdv_rx);
    p->rdv_tx = p->rdv_rx = NULL;
    p->ntx = p->nrx = 0;
    p->wq = p->wq_tail = NULL;
}
