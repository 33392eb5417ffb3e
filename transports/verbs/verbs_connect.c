/* verbs_connect.c: connecting the verbs transport: the address blob (LID, GID, MTU, side
 * channel), one authenticated TCP side channel per peer carrying QP numbers, PSNs and the
 * eager rings (rc_pingpong's out-of-band model), and each QP's INIT -> RTR -> RTS. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

#define BLOB_MAGIC "GVB1"
#define REC_MAGIC 0x52425647u /* "GVBR" */
#define REC_FIXED 40

/* What a rank tells one peer at connect. */
typedef struct {
    uint32_t rank, nqp, nslots, slot_size;
    uint64_t ring_addr;
    uint32_t ring_rkey;
    uint32_t qpn[16], psn[16];
} conn_rec_t;

/* What every rank publishes in its address blob. */
typedef struct {
    int roce;
    int mtu;
    uint16_t lid;
    union ibv_gid gid;
    char host[INET6_ADDRSTRLEN + 1];
    char port[8];
} blob_t;

static gcoll_status_t qp_connect(gcoll_transport_t *t, gcoll_vb_qp_t *q, const blob_t *rb,
                                 uint32_t rqpn, uint32_t rpsn)
{
    int mtu = GCOLL_MIN((int)t->port_attr.active_mtu, rb->mtu);
    if (t->mtu_cfg > 0)
        mtu = GCOLL_MIN(mtu, t->mtu_cfg);
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)mtu,
        .dest_qp_num = rqpn,
        .rq_psn = rpsn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = rb->lid, .sl = 0, .src_path_bits = 0, .port_num = t->port},
    };
    /* RoCE always routes by GID; IB only across subnets (different GID prefixes). */
    if (t->roce || rb->gid.global.subnet_prefix != t->gid.global.subnet_prefix) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = rb->gid;
        a.ah_attr.grh.sgid_index = (uint8_t)t->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    if (t->ibv->modify_qp(q->qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) !=
        0) {
        gcoll_vb_set_error(t, "verbs: qp 0x%x to RTR (remote qp 0x%x): %s", q->qp->qp_num, rqpn,
                           strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    struct ibv_qp_attr b = {
        .qp_state = IBV_QPS_RTS,
        .timeout = (uint8_t)t->timeout,
        .retry_cnt = (uint8_t)t->retry_cnt,
        .rnr_retry = 7, /* receives are re-posted at once; never give up on RNR */
        .sq_psn = q->psn,
        .max_rd_atomic = 1,
    };
    if (t->ibv->modify_qp(q->qp, &b,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        gcoll_vb_set_error(t, "verbs: qp 0x%x to RTS: %s", q->qp->qp_num, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Address and connect                                                                  */

gcoll_status_t gcoll_vb_address(gcoll_transport_t *t, void *buf, size_t *len_p)
{
    size_t iplen = strlen(t->ip);
    size_t n = 4 + 2 + 2 + 16 + 2 + 1 + iplen;
    if (*len_p < n || iplen > 64)
        return GCOLL_ERR_INVALID;
    uint8_t *p = buf;
    memcpy(p, BLOB_MAGIC, 4);
    p[4] = (uint8_t)t->roce;
    p[5] = (uint8_t)t->port_attr.active_mtu;
    gcoll_put_u16(p + 6, t->port_attr.lid);
    memcpy(p + 8, t->gid.raw, 16);
    gcoll_put_u16(p + 24, (uint16_t)t->lport);
    p[26] = (uint8_t)iplen;
    memcpy(p + 27, t->ip, iplen);
    *len_p = n;
    return GCOLL_OK;
}

static int blob_parse(const void *buf, size_t len, blob_t *b)
{
    const uint8_t *p = buf;
    if (len < 27 || memcmp(p, BLOB_MAGIC, 4) != 0 || p[26] > INET6_ADDRSTRLEN ||
        len != 27u + p[26] || p[5] < IBV_MTU_256 || p[5] > IBV_MTU_4096)
        return -1;
    b->roce = p[4];
    b->mtu = p[5];
    b->lid = gcoll_get_u16(p + 6);
    memcpy(b->gid.raw, p + 8, 16);
    snprintf(b->port, sizeof(b->port), "%u", gcoll_get_u16(p + 24));
    memcpy(b->host, p + 27, p[26]);
    b->host[p[26]] = '\0';
    return 0;
}

static size_t rec_encode(gcoll_transport_t *t, int peer, uint8_t *buf)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    gcoll_put_u32(buf, REC_MAGIC);
    gcoll_put_u32(buf + 4, (uint32_t)t->rank);
    gcoll_put_u32(buf + 8, (uint32_t)t->nqp);
    gcoll_put_u32(buf + 12, t->nslots);
    gcoll_put_u32(buf + 16, (uint32_t)t->slot_size);
    const uint8_t *ring = t->rx_mem + (size_t)peer * t->nslots * t->slot_size;
    gcoll_put_u64(buf + 20, (uint64_t)(uintptr_t)ring);
    gcoll_put_u32(buf + 28, t->rx_mr->rkey);
    gcoll_put_u32(buf + 32, (uint32_t)t->size);
    gcoll_put_u32(buf + 36, 0);
    for (int q = 0; q < t->nqp; q++) {
        gcoll_put_u32(buf + REC_FIXED + 8 * q, p->qps[q].qp->qp_num);
        gcoll_put_u32(buf + REC_FIXED + 8 * q + 4, p->qps[q].psn);
    }
    return REC_FIXED + 8 * (size_t)t->nqp;
}

/* Reads and checks a peer's record: geometry must equal ours (the must-match settings). */
static gcoll_status_t rec_read(gcoll_transport_t *t, int peer, uint64_t deadline_ms, conn_rec_t *r)
{
    uint8_t buf[REC_FIXED + 8 * 16];
    size_t n = REC_FIXED + 8 * (size_t)t->nqp;
    gcoll_status_t st = gcoll_sock_read_all(t->peers[peer].fd, buf, n, deadline_ms);
    if (st != GCOLL_OK) {
        gcoll_vb_set_error(t, "verbs: no connection record from rank %d (%s)", peer,
                           st == GCOLL_ERR_TIMEOUT ? "timed out" : "connection closed");
        return st;
    }
    r->rank = gcoll_get_u32(buf + 4);
    r->nqp = gcoll_get_u32(buf + 8);
    r->nslots = gcoll_get_u32(buf + 12);
    r->slot_size = gcoll_get_u32(buf + 16);
    r->ring_addr = gcoll_get_u64(buf + 20);
    r->ring_rkey = gcoll_get_u32(buf + 28);
    if (gcoll_get_u32(buf) != REC_MAGIC || r->rank != (uint32_t)peer ||
        gcoll_get_u32(buf + 32) != (uint32_t)t->size) {
        gcoll_vb_set_error(t, "verbs: malformed connection record from rank %d", peer);
        return GCOLL_ERR_TRANSPORT;
    }
    if (r->nqp != (uint32_t)t->nqp || r->nslots != t->nslots ||
        r->slot_size != (uint32_t)t->slot_size) {
        gcoll_vb_set_error(t,
                           "verbs: rank %d uses %u qp(s), %u slots of %u bytes; this rank "
                           "%d, %u of %zu (GCOLL_IB_QPS_PER_PEER, GCOLL_IB_EAGER_SLOTS and "
                           "GCOLL_IB_EAGER_SIZE must match)",
                           peer, r->nqp, r->nslots, r->slot_size, t->nqp, t->nslots, t->slot_size);
        return GCOLL_ERR_MISMATCH;
    }
    for (int q = 0; q < t->nqp; q++) {
        r->qpn[q] = gcoll_get_u32(buf + REC_FIXED + 8 * q);
        r->psn[q] = gcoll_get_u32(buf + REC_FIXED + 8 * q + 4) & 0xffffff;
    }
    return GCOLL_OK;
}

static gcoll_status_t dial(gcoll_transport_t *t, int peer, const blob_t *b, uint64_t deadline_ms)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(b->host, b->port, &hints, &res) != 0 || !res) {
        gcoll_vb_set_error(t, "verbs: rank %d published an unusable address %s", peer, b->host);
        return GCOLL_ERR_INVALID;
    }
    gcoll_status_t st = GCOLL_ERR_TIMEOUT;
    for (;;) {
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            st = GCOLL_ERR_TRANSPORT;
            break;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            uint8_t id[8];
            gcoll_put_u32(id, (uint32_t)t->rank);
            gcoll_put_u32(id + 4, (uint32_t)t->size);
            char err[256];
            st = gcoll_auth_client(fd, &t->key, id, sizeof(id), deadline_ms, err, sizeof(err));
            if (st != GCOLL_OK) {
                close(fd);
                gcoll_vb_set_error(t, "verbs: connecting to rank %d: %s", peer, err);
            } else {
                t->peers[peer].fd = fd;
            }
            break;
        }
        int e = errno;
        close(fd);
        if (gcoll_time_ms() >= deadline_ms) {
            gcoll_vb_set_error(t, "verbs: cannot reach rank %d at %s port %s: %s", peer, b->host,
                               b->port, strerror(e));
            break;
        }
        usleep(20000);
    }
    freeaddrinfo(res);
    return st;
}

static int on_accept(void *arg, int fd, const void *payload, size_t plen, const char *from)
{
    gcoll_transport_t *t = arg;
    if (plen != 8)
        return -1;
    int peer = (int)gcoll_get_u32(payload);
    int size = (int)gcoll_get_u32((const uint8_t *)payload + 4);
    if (peer <= t->rank || peer >= t->size || size != t->size || t->peers[peer].fd >= 0)
        return -1;
    GCOLL_DEBUG(GCOLL_SUBSYS_NET, "verbs: side channel from rank %d (%s)", peer, from);
    t->peers[peer].fd = fd;
    return 0;
}

gcoll_status_t gcoll_vb_connect(gcoll_transport_t *t, const void *const *blobs, const size_t *lens,
                                uint64_t deadline_ms)
{
    if (t->size == 1)
        return GCOLL_OK;
    blob_t *rb = calloc((size_t)t->size, sizeof(*rb));
    conn_rec_t rec = {0};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!rb)
        return st;
    for (int peer = 0; peer < t->size; peer++) {
        st = GCOLL_ERR_INVALID;
        if (blob_parse(blobs[peer], lens[peer], &rb[peer]) != 0) {
            gcoll_vb_set_error(t, "verbs: rank %d published a malformed verbs address", peer);
            goto out;
        }
        if (rb[peer].roce != t->roce) {
            gcoll_vb_set_error(t,
                               "verbs: rank %d is on %s, this rank on %s: they cannot "
                               "connect",
                               peer, rb[peer].roce ? "RoCE" : "InfiniBand",
                               t->roce ? "RoCE" : "InfiniBand");
            goto out;
        }
    }
    /* Side channels: lower ranks accept, higher ranks dial (no cycle, no deadlock). */
    for (int peer = 0; peer < t->rank; peer++)
        GCOLL_CHECK_GOTO(dial(t, peer, &rb[peer], deadline_ms), st, out);
    int want = t->size - 1 - t->rank;
    if (want > 0) {
        char err[256];
        st = gcoll_auth_accept(t->listen_fd, &t->key, want, on_accept, t, deadline_ms, err,
                               sizeof(err));
        if (st != GCOLL_OK) {
            gcoll_vb_set_error(t, "verbs: accepting side channels: %s", err);
            goto out;
        }
    }
    /* Exchange QP numbers, PSNs and rings: all writes first (small, they fit the socket
     * buffers), then all reads. */
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank)
            continue;
        int one = 1;
        setsockopt(t->peers[peer].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fcntl(t->peers[peer].fd, F_SETFL, fcntl(t->peers[peer].fd, F_GETFL) | O_NONBLOCK);
        uint8_t buf[REC_FIXED + 8 * 16];
        size_t n = rec_encode(t, peer, buf);
        GCOLL_CHECK_GOTO(gcoll_sock_write_all(t->peers[peer].fd, buf, n, deadline_ms), st, out);
    }
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank)
            continue;
        gcoll_vb_peer_t *p = &t->peers[peer];
        GCOLL_CHECK_GOTO(rec_read(t, peer, deadline_ms, &rec), st, out);
        p->ring_raddr = rec.ring_addr;
        p->ring_rkey = rec.ring_rkey;
        for (int q = 0; q < t->nqp; q++) {
            GCOLL_CHECK_GOTO(qp_connect(t, &p->qps[q], &rb[peer], rec.qpn[q], rec.psn[q]), st, out);
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "verbs: qp 0x%x -> rank %d qp 0x%x ready",
                        p->qps[q].qp->qp_num, peer, rec.qpn[q]);
        }
    }
    /* Nobody sends before every peer's QPs accept: a ready byte each way. */
    for (int peer = 0; peer < t->size; peer++)
        if (peer != t->rank)
            GCOLL_CHECK_GOTO(gcoll_sock_write_all(t->peers[peer].fd, "R", 1, deadline_ms), st, out);
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank)
            continue;
        char c = 0;
        st = gcoll_sock_read_all(t->peers[peer].fd, &c, 1, deadline_ms);
        if (st != GCOLL_OK || c != 'R') {
            gcoll_vb_set_error(t, "verbs: rank %d did not finish connecting", peer);
            st = st != GCOLL_OK ? st : GCOLL_ERR_TRANSPORT;
            goto out;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 2 + (uint64_t)peer};
        epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->peers[peer].fd, &ev);
    }
    close(t->listen_fd);
    t->listen_fd = -1;
    GCOLL_INFO(GCOLL_SUBSYS_NET, "verbs: connected to %d peer(s) over %s:%d", t->size - 1,
               t->dev_name, t->port);
    st = GCOLL_OK;
out:
    free(rb);
    return st;
}
