/* fake_verbs.c: an in-memory RDMA device behind gcoll's ibv wrapper, for unit tests of the
 * verbs transport's logic (see fake_verbs.h). Modelled on the checks the verbs spec
 * makes, not on any driver. One global lock: the transports under test may connect from
 * two threads. */
#include "fake_verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

fake_verbs_cfg_t fake_cfg;
fake_stats_t fake_stats;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int seq;

typedef struct fcq {
    struct ibv_cq cq; /* first: the transport sees this */
    struct fcq *next_all;
    struct ibv_wc *wc;
    int head, n, cap;
    int armed;
} fcq_t;

typedef struct fqp {
    struct ibv_qp qp;
    struct fqp *next_all;
    fake_qp_info_t info;
    uint64_t *rq; /* posted receive wr_ids, FIFO */
    int rq_head, rq_n;
    int sq_out; /* send WRs not yet completed */
    uint8_t port;
} fqp_t;

typedef struct fmr {
    struct ibv_mr mr;
    struct fmr *next;
    int access;
} fmr_t;

typedef struct held {
    struct held *next;
    fqp_t *src;
    struct ibv_send_wr wr;
    struct ibv_sge sge;
} held_t;

static struct ibv_device devs[4];
static fcq_t *cqs;
static fqp_t *qps, *qps_tail;
static fmr_t *mrs;
static held_t *held;
static int holding;
static uint32_t next_qpn = 0x100, next_key = 0x1000;
static int fail_n;
static enum ibv_wc_status fail_status;

/* ---------------------------------------------------------------------------------- */

static void cq_push(fcq_t *c, const struct ibv_wc *wc)
{
    if (c->n == c->cap) {
        fake_stats.cq_overflow++;
        return;
    }
    c->wc[(c->head + c->n) % c->cap] = *wc;
    c->n++;
    if (c->armed && c->cq.channel) {
        uint64_t one = 1;
        if (write(c->cq.channel->fd, &one, sizeof(one)) != sizeof(one))
            abort();
        c->armed = 0;
    }
}

static fqp_t *qp_by_num(uint32_t qpn)
{
    for (fqp_t *q = qps; q; q = q->next_all)
        if (q->info.qpn == qpn)
            return q;
    return NULL;
}

static fmr_t *mr_find(uint32_t key, int remote, uint64_t addr, uint64_t len, int access)
{
    for (fmr_t *m = mrs; m; m = m->next) {
        if ((remote ? m->mr.rkey : m->mr.lkey) != key)
            continue;
        uint64_t a = (uintptr_t)m->mr.addr;
        if (addr < a || addr + len > a + m->mr.length || (access && !(m->access & access)))
            return NULL;
        return m;
    }
    return NULL;
}

static void send_done(fqp_t *q, const struct ibv_send_wr *wr, enum ibv_wc_status st)
{
    q->sq_out--;
    if (!(wr->send_flags & IBV_SEND_SIGNALED) && st == IBV_WC_SUCCESS)
        return;
    struct ibv_wc wc = {
        .wr_id = wr->wr_id, .status = st, .opcode = IBV_WC_RDMA_WRITE, .qp_num = q->info.qpn};
    cq_push((fcq_t *)q->qp.send_cq, &wc);
}

static void qp_to_error(fqp_t *q)
{
    q->qp.state = q->info.state = IBV_QPS_ERR;
    while (q->rq_n) { /* posted receives are flushed */
        struct ibv_wc wc = {.wr_id = q->rq[q->rq_head],
                            .status = IBV_WC_WR_FLUSH_ERR,
                            .opcode = IBV_WC_RECV,
                            .qp_num = q->info.qpn};
        q->rq_head = (q->rq_head + 1) % (int)q->info.max_recv_wr;
        q->rq_n--;
        cq_push((fcq_t *)q->qp.recv_cq, &wc);
    }
}

static void deliver(fqp_t *q, const struct ibv_send_wr *wr)
{
    uint64_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    if (q->qp.state == IBV_QPS_ERR) {
        send_done(q, wr, IBV_WC_WR_FLUSH_ERR);
        return;
    }
    if (fail_n > 0) {
        fail_n--;
        send_done(q, wr, fail_status);
        qp_to_error(q);
        return;
    }
    fqp_t *r = qp_by_num(q->info.rtr.dest_qp_num);
    if (!r || (r->qp.state != IBV_QPS_RTR && r->qp.state != IBV_QPS_RTS)) {
        send_done(q, wr, IBV_WC_RETRY_EXC_ERR); /* nobody answers */
        qp_to_error(q);
        return;
    }
    if (len &&
        !mr_find(wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_WRITE)) {
        send_done(q, wr, IBV_WC_REM_ACCESS_ERR);
        qp_to_error(q);
        return;
    }
    int imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (imm && r->rq_n == 0) {
        fake_stats.rnr++;
        send_done(q, wr, IBV_WC_RNR_RETRY_EXC_ERR);
        qp_to_error(q);
        return;
    }
    if (len)
        memcpy((void *)(uintptr_t)wr->wr.rdma.remote_addr, (void *)(uintptr_t)wr->sg_list[0].addr,
               len);
    fake_stats.writes++;
    fake_stats.write_bytes += len;
    if (len > fake_stats.max_write)
        fake_stats.max_write = len;
    if (imm) {
        struct ibv_wc wc = {.wr_id = r->rq[r->rq_head],
                            .status = IBV_WC_SUCCESS,
                            .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                            .wc_flags = IBV_WC_WITH_IMM,
                            .imm_data = wr->imm_data,
                            .byte_len = (uint32_t)len,
                            .qp_num = r->info.qpn,
                            .src_qp = q->info.qpn};
        r->rq_head = (r->rq_head + 1) % (int)r->info.max_recv_wr;
        r->rq_n--;
        cq_push((fcq_t *)r->qp.recv_cq, &wc);
    }
    send_done(q, wr, IBV_WC_SUCCESS);
}

/* ---------------------------------------------------------------------------------- */
/* The verbs                                                                            */

static struct ibv_device **f_get_device_list(int *n)
{
    pthread_mutex_lock(&lock);
    struct ibv_device **list = NULL;
    if (fake_cfg.list_mode == FAKE_LIST_ENOSYS) {
        errno = ENOSYS;
    } else {
        int nd = fake_cfg.list_mode == FAKE_LIST_EMPTY ? 0 : fake_cfg.ndev;
        list = calloc((size_t)nd + 1, sizeof(*list));
        for (int i = 0; i < nd; i++)
            list[i] = &devs[i];
        if (n)
            *n = nd;
    }
    pthread_mutex_unlock(&lock);
    return list;
}

static void f_free_device_list(struct ibv_device **list)
{
    free(list);
}
static const char *f_get_device_name(struct ibv_device *d)
{
    return d->name;
}

static struct ibv_context *f_open_device(struct ibv_device *d)
{
    struct ibv_context *c = calloc(1, sizeof(*c));
    c->device = d;
    pthread_mutex_lock(&lock);
    fake_stats.live_ctx++;
    pthread_mutex_unlock(&lock);
    return c;
}

static int f_close_device(struct ibv_context *c)
{
    pthread_mutex_lock(&lock);
    fake_stats.live_ctx--;
    pthread_mutex_unlock(&lock);
    free(c);
    return 0;
}

static int f_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    (void)c;
    memset(a, 0, sizeof(*a));
    a->phys_port_cnt = (uint8_t)fake_cfg.nports;
    a->max_qp_wr = fake_cfg.max_qp_wr;
    a->max_cqe = fake_cfg.max_cqe;
    return 0;
}

static int f_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    (void)c;
    if (port < 1 || port > fake_cfg.nports) {
        errno = EINVAL;
        return EINVAL;
    }
    memset(a, 0, sizeof(*a));
    a->state = fake_cfg.port_state[port - 1];
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = fake_cfg.active_mtu;
    a->gid_tbl_len = 4;
    a->max_msg_sz = fake_cfg.max_msg_sz;
    a->lid = fake_cfg.link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : (uint16_t)(0x10 + port);
    a->link_layer = fake_cfg.link_layer;
    return 0;
}

static int f_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g)
{
    (void)c;
    if (index < 0 || index >= 4)
        return EINVAL;
    memset(g, 0, sizeof(*g));
    if (fake_cfg.link_layer == IBV_LINK_LAYER_ETHERNET && index == 1) {
        g->raw[10] = g->raw[11] = 0xff; /* ::ffff:10.0.0.<port> */
        g->raw[12] = 10;
        g->raw[15] = port;
    } else if (index == 0) {
        g->raw[0] = 0xfe;
        g->raw[1] = 0x80;
        g->raw[15] = port;
    }
    return 0;
}

static struct ibv_pd *f_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = c;
    return pd;
}

static int f_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    fmr_t *m = calloc(1, sizeof(*m));
    pthread_mutex_lock(&lock);
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = next_key++;
    m->mr.rkey = next_key++;
    m->access = access | IBV_ACCESS_LOCAL_WRITE;
    m->next = mrs;
    mrs = m;
    fake_stats.reg_mr++;
    fake_stats.live_mr++;
    pthread_mutex_unlock(&lock);
    return &m->mr;
}

static int f_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&lock);
    for (fmr_t **pp = &mrs; *pp; pp = &(*pp)->next) {
        if (&(*pp)->mr == mr) {
            fmr_t *m = *pp;
            *pp = m->next;
            free(m);
            fake_stats.dereg_mr++;
            if (fake_stats.live_mr > 0)
                fake_stats.live_mr--;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

static struct ibv_comp_channel *f_create_comp_channel(struct ibv_context *c)
{
    struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
    ch->context = c;
    ch->fd = eventfd(0, EFD_CLOEXEC);
    return ch;
}

static int f_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    close(ch->fd);
    free(ch);
    return 0;
}

static struct ibv_cq *f_create_cq(struct ibv_context *c, int cqe, void *cq_ctx,
                                  struct ibv_comp_channel *ch, int vec)
{
    (void)vec;
    if (cqe < 1 || cqe > fake_cfg.max_cqe) {
        errno = EINVAL;
        return NULL;
    }
    fcq_t *q = calloc(1, sizeof(*q));
    q->cq.context = c;
    q->cq.channel = ch;
    q->cq.cq_context = cq_ctx;
    q->cq.cqe = cqe;
    q->cap = cqe;
    q->wc = calloc((size_t)cqe, sizeof(*q->wc));
    pthread_mutex_lock(&lock);
    q->next_all = cqs;
    cqs = q;
    fake_stats.live_cq++;
    if (!fake_stats.seq_create_cq)
        fake_stats.seq_create_cq = ++seq;
    pthread_mutex_unlock(&lock);
    return &q->cq;
}

static int f_destroy_cq(struct ibv_cq *cq)
{
    fcq_t *q = (fcq_t *)cq;
    pthread_mutex_lock(&lock);
    for (fcq_t **pp = &cqs; *pp; pp = &(*pp)->next_all)
        if (*pp == q) {
            *pp = q->next_all;
            break;
        }
    fake_stats.live_cq--;
    pthread_mutex_unlock(&lock);
    free(q->wc);
    free(q);
    return 0;
}

static int f_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
    uint64_t v;
    /* The transport sets the channel fd non-blocking, as with a real channel. */
    if (read(ch->fd, &v, sizeof(v)) != sizeof(v))
        return -1;
    pthread_mutex_lock(&lock);
    *cq = NULL;
    for (fcq_t *c = cqs; c; c = c->next_all)
        if (c->cq.channel == ch)
            *cq = &c->cq;
    pthread_mutex_unlock(&lock);
    if (!*cq)
        return -1;
    *ctx = (*cq)->cq_context;
    return 0;
}

static void f_ack_cq_events(struct ibv_cq *cq, unsigned n)
{
    (void)cq;
    (void)n;
}

static int f_req_notify_cq(struct ibv_cq *cq, int solicited)
{
    (void)solicited;
    fcq_t *q = (fcq_t *)cq;
    pthread_mutex_lock(&lock);
    q->armed = 1; /* as hardware: only the next completion raises an event, not old ones */
    pthread_mutex_unlock(&lock);
    return 0;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    fcq_t *q = (fcq_t *)cq;
    pthread_mutex_lock(&lock);
    int k = 0;
    while (k < n && q->n > 0) {
        wc[k++] = q->wc[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
    pthread_mutex_unlock(&lock);
    return k;
}

static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (ia->qp_type != IBV_QPT_RC || (int)ia->cap.max_send_wr > fake_cfg.max_qp_wr ||
        (int)ia->cap.max_recv_wr > fake_cfg.max_qp_wr || !ia->send_cq || !ia->recv_cq) {
        errno = EINVAL;
        return NULL;
    }
    fqp_t *q = calloc(1, sizeof(*q));
    pthread_mutex_lock(&lock);
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.qp_num = q->info.qpn = next_qpn++;
    q->qp.state = q->info.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->info.max_send_wr = ia->cap.max_send_wr;
    q->info.max_recv_wr = ia->cap.max_recv_wr;
    q->rq = calloc(ia->cap.max_recv_wr, sizeof(*q->rq));
    if (qps_tail)
        qps_tail->next_all = q;
    else
        qps = q;
    qps_tail = q;
    fake_stats.live_qp++;
    if (!fake_stats.seq_first_qp)
        fake_stats.seq_first_qp = ++seq;
    pthread_mutex_unlock(&lock);
    return &q->qp;
}

enum {
    NEED_INIT = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
    NEED_RTR = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
    NEED_RTS = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
};

static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    fqp_t *q = (fqp_t *)qp;
    int rc = 0;
    pthread_mutex_lock(&lock);
    enum ibv_qp_state cur = q->qp.state, to = a->qp_state;
    if (!(mask & IBV_QP_STATE)) {
        rc = EINVAL;
    } else if (to == IBV_QPS_ERR) {
        qp_to_error(q);
    } else if (cur == IBV_QPS_RESET && to == IBV_QPS_INIT) {
        if ((mask & NEED_INIT) != NEED_INIT || a->port_num < 1 || a->port_num > fake_cfg.nports)
            rc = EINVAL;
        else {
            q->info.init = *a;
            q->info.init_mask = mask;
            q->info.seq_init = ++seq;
            q->port = a->port_num;
        }
    } else if (cur == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        if ((mask & NEED_RTR) != NEED_RTR || a->path_mtu > fake_cfg.active_mtu ||
            a->path_mtu < IBV_MTU_256 || a->ah_attr.port_num != q->port ||
            (fake_cfg.link_layer == IBV_LINK_LAYER_ETHERNET && !a->ah_attr.is_global))
            rc = EINVAL;
        else {
            q->info.rtr = *a;
            q->info.rtr_mask = mask;
            q->info.seq_rtr = ++seq;
        }
    } else if (cur == IBV_QPS_RTR && to == IBV_QPS_RTS) {
        if ((mask & NEED_RTS) != NEED_RTS)
            rc = EINVAL;
        else {
            q->info.rts = *a;
            q->info.rts_mask = mask;
            q->info.seq_rts = ++seq;
        }
    } else {
        rc = EINVAL;
    }
    if (rc == 0)
        q->qp.state = q->info.state = to;
    else
        fake_stats.bad_transitions++;
    pthread_mutex_unlock(&lock);
    errno = rc;
    return rc;
}

static int f_destroy_qp(struct ibv_qp *qp)
{
    fqp_t *q = (fqp_t *)qp;
    pthread_mutex_lock(&lock);
    /* Kept in the list (for inspection) but unreachable by its peers from now on. */
    q->qp.state = IBV_QPS_RESET;
    q->info.state = IBV_QPS_RESET;
    q->info.rtr.dest_qp_num = 0;
    free(q->rq);
    q->rq = NULL;
    q->rq_n = 0;
    for (held_t **hp = &held; *hp;) {
        if ((*hp)->src == q) {
            held_t *h = *hp;
            *hp = h->next;
            free(h);
        } else {
            hp = &(*hp)->next;
        }
    }
    fake_stats.live_qp--;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    fqp_t *q = (fqp_t *)qp;
    int rc = 0;
    pthread_mutex_lock(&lock);
    for (; wr; wr = wr->next) {
        uint64_t len = wr->num_sge ? wr->sg_list[0].length : 0;
        if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR)
            rc = EINVAL;
        else if (q->sq_out >= (int)q->info.max_send_wr)
            rc = ENOMEM;
        else if (wr->num_sge > 1 ||
                 (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM))
            rc = EINVAL;
        if (rc) {
            *bad = wr;
            break;
        }
        if (!q->info.seq_first_send)
            q->info.seq_first_send = ++seq;
        q->sq_out++;
        if (len > fake_cfg.max_msg_sz) {
            send_done(q, wr, IBV_WC_LOC_LEN_ERR);
            qp_to_error(q);
            continue;
        }
        if (len && !mr_find(wr->sg_list[0].lkey, 0, wr->sg_list[0].addr, len, 0)) {
            send_done(q, wr, IBV_WC_LOC_PROT_ERR);
            qp_to_error(q);
            continue;
        }
        if (holding) {
            held_t *h = calloc(1, sizeof(*h));
            h->src = q;
            h->wr = *wr;
            h->wr.next = NULL;
            if (wr->num_sge) {
                h->sge = wr->sg_list[0];
                h->wr.sg_list = &h->sge;
            }
            h->next = held;
            held = h; /* newest first */
        } else {
            deliver(q, wr);
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    fqp_t *q = (fqp_t *)qp;
    int rc = 0;
    pthread_mutex_lock(&lock);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_RESET || !q->rq)
            rc = EINVAL;
        else if (q->rq_n >= (int)q->info.max_recv_wr)
            rc = ENOMEM;
        if (rc) {
            *bad = wr;
            break;
        }
        if (!q->info.seq_first_recv)
            q->info.seq_first_recv = ++seq;
        q->rq[(q->rq_head + q->rq_n) % (int)q->info.max_recv_wr] = wr->wr_id;
        q->rq_n++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static const char *f_wc_status_str(enum ibv_wc_status s)
{
    static char buf[64];
    switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
        return "transport retry counter exceeded";
    case IBV_WC_REM_ACCESS_ERR:
        return "remote access error";
    case IBV_WC_WR_FLUSH_ERR:
        return "Work Request Flushed Error";
    default:
        snprintf(buf, sizeof(buf), "fake status %d", (int)s);
        return buf;
    }
}

static const gcoll_ibv_ops_t fake_ops = {
    .get_device_list = f_get_device_list,
    .free_device_list = f_free_device_list,
    .get_device_name = f_get_device_name,
    .open_device = f_open_device,
    .close_device = f_close_device,
    .query_device = f_query_device,
    .query_port = f_query_port,
    .query_gid = f_query_gid,
    .alloc_pd = f_alloc_pd,
    .dealloc_pd = f_dealloc_pd,
    .reg_mr = f_reg_mr,
    .dereg_mr = f_dereg_mr,
    .create_comp_channel = f_create_comp_channel,
    .destroy_comp_channel = f_destroy_comp_channel,
    .create_cq = f_create_cq,
    .destroy_cq = f_destroy_cq,
    .get_cq_event = f_get_cq_event,
    .ack_cq_events = f_ack_cq_events,
    .req_notify_cq = f_req_notify_cq,
    .poll_cq = f_poll_cq,
    .create_qp = f_create_qp,
    .modify_qp = f_modify_qp,
    .destroy_qp = f_destroy_qp,
    .post_send = f_post_send,
    .post_recv = f_post_recv,
    .wc_status_str = f_wc_status_str,
};

/* ---------------------------------------------------------------------------------- */
/* Test controls                                                                        */

void fake_verbs_install(void)
{
    pthread_mutex_lock(&lock);
    while (qps) {
        fqp_t *q = qps;
        qps = q->next_all;
        free(q->rq);
        free(q);
    }
    qps_tail = NULL;
    while (held) {
        held_t *h = held;
        held = h->next;
        free(h);
    }
    /* MRs a failed test leaked stay in the list (reachable, unreported from here on). */
    holding = 0;
    fail_n = 0;
    seq = 0;
    memset(&fake_stats, 0, sizeof(fake_stats));
    fake_cfg = (fake_verbs_cfg_t){.list_mode = FAKE_LIST_OK,
                                  .ndev = 2,
                                  .nports = 1,
                                  .link_layer = IBV_LINK_LAYER_INFINIBAND,
                                  .max_msg_sz = 1u << 30,
                                  .active_mtu = IBV_MTU_4096,
                                  .max_qp_wr = 16384,
                                  .max_cqe = 1 << 20};
    for (int i = 0; i < 4; i++)
        fake_cfg.port_state[i] = IBV_PORT_ACTIVE;
    for (int i = 0; i < 4; i++)
        snprintf(devs[i].name, sizeof(devs[i].name), "fake_%d", i);
    pthread_mutex_unlock(&lock);
    gcoll_ibv_override(&fake_ops);
}

void fake_verbs_uninstall(void)
{
    gcoll_ibv_override(NULL);
}

void fake_verbs_fail_sends(int n, enum ibv_wc_status status)
{
    pthread_mutex_lock(&lock);
    fail_n = n;
    fail_status = status;
    pthread_mutex_unlock(&lock);
}

void fake_verbs_hold(int on)
{
    pthread_mutex_lock(&lock);
    holding = on;
    pthread_mutex_unlock(&lock);
}

int fake_verbs_release(int reverse, int max)
{
    pthread_mutex_lock(&lock);
    held_t *list = held; /* newest first */
    held = NULL;
    if (!reverse) { /* oldest first */
        held_t *rev = NULL;
        while (list) {
            held_t *h = list;
            list = h->next;
            h->next = rev;
            rev = h;
        }
        list = rev;
    }
    int n = 0;
    while (list && (max < 0 || n < max)) {
        held_t *h = list;
        list = h->next;
        deliver(h->src, &h->wr);
        free(h);
        n++;
    }
    /* Whatever was not released stays held, in its original (newest first) order. */
    if (!reverse) {
        held_t *rev = NULL;
        while (list) {
            held_t *h = list;
            list = h->next;
            h->next = rev;
            rev = h;
        }
        list = rev;
    }
    held_t **tail = &list;
    while (*tail)
        tail = &(*tail)->next;
    *tail = held;
    held = list;
    pthread_mutex_unlock(&lock);
    return n;
}

int fake_verbs_inject_recv(uint32_t qpn, uint32_t imm, uint32_t byte_len)
{
    pthread_mutex_lock(&lock);
    fqp_t *r = qp_by_num(qpn);
    int rc = -1;
    if (r && r->rq_n > 0) {
        struct ibv_wc wc = {.wr_id = r->rq[r->rq_head],
                            .status = IBV_WC_SUCCESS,
                            .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                            .wc_flags = IBV_WC_WITH_IMM,
                            .imm_data = htonl(imm),
                            .byte_len = byte_len,
                            .qp_num = qpn};
        r->rq_head = (r->rq_head + 1) % (int)r->info.max_recv_wr;
        r->rq_n--;
        cq_push((fcq_t *)r->qp.recv_cq, &wc);
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

const fake_qp_info_t *fake_verbs_qp(int i)
{
    fqp_t *q = qps;
    while (q && i-- > 0)
        q = q->next_all;
    return q ? &q->info : NULL;
}

const fake_qp_info_t *fake_verbs_qp_by_num(uint32_t qpn)
{
    for (fqp_t *q = qps; q; q = q->next_all)
        if (q->info.qpn == qpn)
            return &q->info;
    return NULL;
}

int fake_verbs_rkey_live(uint32_t rkey)
{
    pthread_mutex_lock(&lock);
    int live = 0;
    for (fmr_t *m = mrs; m; m = m->next)
        live |= m->mr.rkey == rkey;
    pthread_mutex_unlock(&lock);
    return live;
}
