/* verbs_setup.c: the verbs transport's setup: probing, device and port choice
 * (GCOLL_IB_HCA), GID choice, queue pairs created and taken to INIT, the eager rings, and
 * teardown. Connecting them (RTR, RTS) is in verbs_connect.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

#define RQ_EXTRA 64
#define SQ_EXTRA 32

/* ---------------------------------------------------------------------------------- */
/* Device and port choice                                                               */

int gcoll_vb_hca_match(const char *spec, const char *dev, int port)
{
    if (!spec || !*spec)
        return 1;
    int exclude = 0, exact = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    while (*spec) {
        const char *end = strchr(spec, ',');
        size_t len = end ? (size_t)(end - spec) : strlen(spec);
        char item[128];
        snprintf(item, sizeof(item), "%.*s", (int)GCOLL_MIN(len, sizeof(item) - 1), spec);
        int want_port = -1;
        char *colon = strchr(item, ':');
        if (colon) {
            *colon = '\0';
            want_port = atoi(colon + 1);
        }
        /* As NCCL: a name selects every device it is a prefix of, unless '=' asks for
         * exact names. */
        int name_ok = exact ? strcmp(dev, item) == 0 : strncmp(dev, item, strlen(item)) == 0;
        if (*item && name_ok && (want_port < 0 || want_port == port))
            return !exclude;
        spec += len;
        if (*spec == ',')
            spec++;
    }
    return exclude;
}

static const char *port_state_name(enum ibv_port_state s)
{
    switch (s) {
    case IBV_PORT_DOWN:
        return "down";
    case IBV_PORT_INIT:
        return "init";
    case IBV_PORT_ARMED:
        return "armed";
    case IBV_PORT_ACTIVE:
        return "active";
    case IBV_PORT_ACTIVE_DEFER:
        return "active-defer";
    default:
        return "unknown state";
    }
}

/* The device list, or NULL with the reason: ENOSYS (no RDMA in this kernel) and an empty
 * list are both common and both explained. */
static struct ibv_device **device_list(const gcoll_ibv_ops_t *ibv, int *n_p, char *why,
                                       size_t whylen)
{
    int n = 0;
    errno = 0;
    struct ibv_device **list = ibv->get_device_list(&n);
    if (!list) {
        int e = errno;
        if (e == ENOSYS)
            snprintf(why, whylen,
                     "ibv_get_device_list failed with ENOSYS: this kernel has no "
                     "RDMA (uverbs) support or no RDMA device (soft-RoCE: rdma link add rxe0 "
                     "type rxe netdev eth0)");
        else
            snprintf(why, whylen, "ibv_get_device_list failed: %s",
                     e ? strerror(e) : "no reason given");
        return NULL;
    }
    if (n <= 0) {
        ibv->free_device_list(list);
        snprintf(why, whylen,
                 "no RDMA devices: ibv_get_device_list returned an empty list "
                 "(load an HCA driver, or add soft-RoCE: rdma link add rxe0 type rxe netdev eth0)");
        return NULL;
    }
    *n_p = n;
    return list;
}

/* Opens the first active port GCOLL_IB_HCA selects. On failure why lists what was seen. */
static gcoll_status_t open_port(const gcoll_ibv_ops_t *ibv, const char *hca,
                                struct ibv_context **ctx_p, uint8_t *port_p,
                                struct ibv_port_attr *pa_p, char *name, size_t namelen, char *why,
                                size_t whylen)
{
    int n = 0;
    struct ibv_device **list = device_list(ibv, &n, why, whylen);
    if (!list)
        return GCOLL_ERR_UNSUPPORTED;
    char seen[256] = "";
    size_t o = 0;
    gcoll_status_t st = GCOLL_ERR_UNSUPPORTED;
    for (int d = 0; d < n && st != GCOLL_OK; d++) {
        const char *dev = ibv->get_device_name(list[d]);
        if (!dev)
            continue;
        struct ibv_context *ctx = ibv->open_device(list[d]);
        if (!ctx) {
            o +=
                (size_t)snprintf(seen + o, o < sizeof(seen) ? sizeof(seen) - o : 0,
                                 "%s%s cannot be opened (%s)", o ? ", " : "", dev, strerror(errno));
            continue;
        }
        struct ibv_device_attr da;
        if (ibv->query_device(ctx, &da) != 0) {
            ibv->close_device(ctx);
            continue;
        }
        for (int port = 1; port <= da.phys_port_cnt; port++) {
            if (!gcoll_vb_hca_match(hca, dev, port))
                continue;
            struct ibv_port_attr pa;
            if (ibv->query_port(ctx, (uint8_t)port, &pa) != 0)
                continue;
            if (pa.state == IBV_PORT_ACTIVE && (pa.link_layer == IBV_LINK_LAYER_INFINIBAND ||
                                                pa.link_layer == IBV_LINK_LAYER_ETHERNET ||
                                                pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED)) {
                *ctx_p = ctx;
                *port_p = (uint8_t)port;
                *pa_p = pa;
                snprintf(name, namelen, "%s", dev);
                st = GCOLL_OK;
                break;
            }
            o += (size_t)snprintf(seen + o, o < sizeof(seen) ? sizeof(seen) - o : 0, "%s%s:%d %s",
                                  o ? ", " : "", dev, port, port_state_name(pa.state));
        }
        if (st != GCOLL_OK)
            ibv->close_device(ctx);
    }
    ibv->free_device_list(list);
    if (st != GCOLL_OK)
        snprintf(why, whylen, "no active port%s%s%s (%s)",
                 hca && *hca ? " matching GCOLL_IB_HCA='" : "", hca && *hca ? hca : "",
                 hca && *hca ? "'" : "", *seen ? seen : "no ports selected");
    return st;
}

gcoll_status_t gcoll_vb_probe(char *why, size_t whylen)
{
    const gcoll_ibv_ops_t *ibv;
    char tmp[256] = "";
    if (gcoll_ibv_get(&ibv, tmp, sizeof(tmp)) != GCOLL_OK) {
        snprintf(why, whylen, "%s", tmp);
        return GCOLL_ERR_UNSUPPORTED;
    }
    struct ibv_context *ctx = NULL;
    uint8_t port;
    struct ibv_port_attr pa;
    char name[64];
    if (open_port(ibv, getenv("GCOLL_IB_HCA"), &ctx, &port, &pa, name, sizeof(name), tmp,
                  sizeof(tmp)) != GCOLL_OK) {
        snprintf(why, whylen, "%s", tmp);
        return GCOLL_ERR_UNSUPPORTED;
    }
    ibv->close_device(ctx);
    return GCOLL_OK;
}

/* Whether the kernel reports GID index i as RoCE v2 (sysfs; absent for IB and in tests). */
static int gid_is_roce_v2(const char *dev, int port, int i)
{
    char path[256], type[32] = "";
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             i);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int ok = fgets(type, sizeof(type), f) != NULL && strstr(type, "v2") != NULL;
    fclose(f);
    return ok;
}

/* RoCE needs a GID; without GCOLL_IB_GID_INDEX take an IPv4-mapped one (routable across
 * subnets), RoCE v2 first when the kernel says which entries are v2 (as NCCL does), else
 * index 0. */
static gcoll_status_t choose_gid(gcoll_transport_t *t, long cfg_index)
{
    if (cfg_index >= 0) {
        t->gid_index = (int)cfg_index;
        if (t->ibv->query_gid(t->ctx, t->port, t->gid_index, &t->gid) != 0) {
            gcoll_vb_set_error(t, "verbs: %s port %d has no GID at GCOLL_IB_GID_INDEX=%d",
                               t->dev_name, t->port, t->gid_index);
            return GCOLL_ERR_INVALID;
        }
        return GCOLL_OK;
    }
    t->gid_index = 0;
    int n = GCOLL_MIN(t->port_attr.gid_tbl_len, 32), first_v4 = -1;
    for (int i = 0; t->roce && i < n; i++) {
        union ibv_gid g;
        if (t->ibv->query_gid(t->ctx, t->port, i, &g) != 0)
            continue;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(g.raw, v4, 12) != 0)
            continue;
        if (first_v4 < 0)
            first_v4 = i;
        if (gid_is_roce_v2(t->dev_name, t->port, i)) {
            first_v4 = i;
            break;
        }
    }
    if (first_v4 >= 0)
        t->gid_index = first_v4;
    if (t->ibv->query_gid(t->ctx, t->port, t->gid_index, &t->gid) != 0)
        memset(&t->gid, 0, sizeof(t->gid));
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Queue pairs                                                                          */

static gcoll_status_t qp_create(gcoll_transport_t *t, int peer, int qidx, gcoll_vb_qp_t *q)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = t->cq,
        .recv_cq = t->cq,
        .cap = {.max_send_wr = (uint32_t)t->sq_depth,
                .max_recv_wr = (uint32_t)t->rq_depth,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    q->qp = t->ibv->create_qp(t->pd, &ia);
    if (!q->qp) {
        gcoll_vb_set_error(t, "verbs: ibv_create_qp on %s: %s", t->dev_name, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    uint32_t r = 0;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
        r = (uint32_t)gcoll_time_ns();
    q->psn = r & 0xffffff;
    q->sq_free = t->sq_depth;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = 0,
                            .port_num = t->port,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
    if (t->ibv->modify_qp(
            q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        gcoll_vb_set_error(t, "verbs: qp 0x%x to INIT: %s", q->qp->qp_num, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    /* Receives carry no buffer: every message is an RDMA write with immediate. */
    for (int i = 0; i < t->rq_depth; i++) {
        struct ibv_recv_wr wr = {.wr_id = gcoll_vb_wrid(GCOLL_VB_WR_RECV, peer, (uint32_t)qidx)};
        struct ibv_recv_wr *bad;
        if (t->ibv->post_recv(q->qp, &wr, &bad) != 0) {
            gcoll_vb_set_error(t, "verbs: ibv_post_recv: %s", strerror(errno));
            return GCOLL_ERR_TRANSPORT;
        }
    }
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Create / destroy                                                                     */

void gcoll_vb_destroy(gcoll_transport_t *t)
{
    if (!t)
        return;
    const gcoll_ibv_ops_t *ibv = t->ibv;
    for (int i = 0; t->peers && i < t->size; i++) {
        gcoll_vb_peer_t *p = &t->peers[i];
        if (p->fd >= 0)
            close(p->fd);
        /* QPs first: the adapter must be done with buffers before they are released. */
        for (int q = 0; p->qps && q < t->nqp; q++)
            if (p->qps[q].qp)
                ibv->destroy_qp(p->qps[q].qp);
        gcoll_vb_peer_release(t, p, GCOLL_OK);
        gcoll_match_peer_fini(&p->rx);
        free(p->qps);
        free(p->stage);
        free(p->rx_done);
    }
    free(t->peers);
    if (ibv) {
        if (t->rx_mr)
            ibv->dereg_mr(t->rx_mr);
        if (t->tx_mr)
            ibv->dereg_mr(t->tx_mr);
        gcoll_vb_reg_destroy(&t->reg);
        if (t->cq)
            ibv->destroy_cq(t->cq);
        if (t->chan)
            ibv->destroy_comp_channel(t->chan);
        if (t->pd)
            ibv->dealloc_pd(t->pd);
        if (t->ctx)
            ibv->close_device(t->ctx);
    }
    free(t->rx_mem);
    free(t->tx_mem);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->epfd >= 0)
        close(t->epfd);
    free(t);
}

static gcoll_status_t listen_on(gcoll_transport_t *t, const char *ip)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(ip, "0", &hints, &res) != 0 || !res) {
        gcoll_vb_set_error(t, "verbs: cannot use local address '%s'", ip);
        return GCOLL_ERR_TRANSPORT;
    }
    t->listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = t->listen_fd >= 0 && bind(t->listen_fd, res->ai_addr, res->ai_addrlen) == 0 &&
             listen(t->listen_fd, 256) == 0;
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (!ok || getsockname(t->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
        gcoll_vb_set_error(t, "verbs: cannot listen on %s: %s", ip, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    t->lport = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                       : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    snprintf(t->ip, sizeof(t->ip), "%s", ip);
    return GCOLL_OK;
}

/* The transport's settings from the configuration, bounded by the device's limits (da);
 * returns the completion queue's size. */
static long vb_settings(gcoll_transport_t *t, const gcoll_config_t *cfg,
                        const struct ibv_device_attr *da)
{
    /* Slots hold at least a header and 64 payload bytes. */
    t->nqp = (int)GCOLL_MAX(cfg->ib_qps_per_peer, 1L);
    t->nslots = (uint32_t)GCOLL_MAX(cfg->ib_eager_slots, 2L);
    /* No single write may exceed the port's max_msg_sz: not a slot, not a chunk. */
    size_t mmsz = t->port_attr.max_msg_sz ? t->port_attr.max_msg_sz : ((size_t)1 << 30);
    t->slot_size = GCOLL_MIN(GCOLL_MAX(cfg->ib_eager_size, (size_t)GCOLL_VB_HDR_LEN + 64),
                             GCOLL_MIN(mmsz, (size_t)1 << 24));
    t->eager_max = t->slot_size - GCOLL_VB_HDR_LEN;
    t->chunk_max = GCOLL_MIN(mmsz, (size_t)1 << 30);
    if (cfg->ib_chunk)
        t->chunk_max = GCOLL_MIN(t->chunk_max, cfg->ib_chunk);
    t->mtu_cfg = cfg->ib_mtu;
    t->timeout = (int)cfg->ib_timeout;
    t->retry_cnt = (int)cfg->ib_retry_cnt;
    t->sq_depth = (int)GCOLL_MIN((long)t->nslots + SQ_EXTRA, (long)da->max_qp_wr);
    t->rq_depth = (int)GCOLL_MIN(2L * t->nslots + RQ_EXTRA, (long)da->max_qp_wr);
    long cqe = (long)(t->size > 1 ? t->size - 1 : 1) * t->nqp * (t->sq_depth + t->rq_depth);
    if (cqe > da->max_cqe) {
        GCOLL_WARN("verbs: %s allows %d completion queue entries, %ld would be safe; large "
                   "jobs may overrun it (lower GCOLL_IB_EAGER_SLOTS)",
                   t->dev_name, da->max_cqe, cqe);
        cqe = da->max_cqe;
    }
    return cqe;
}

/* Protection domain, completion channel (non-blocking) and the one completion queue. */
static gcoll_status_t vb_cq(gcoll_transport_t *t, long cqe)
{
    const gcoll_ibv_ops_t *ibv = t->ibv;
    if (!(t->pd = ibv->alloc_pd(t->ctx)) || !(t->chan = ibv->create_comp_channel(t->ctx))) {
        gcoll_vb_set_error(t,
                           "verbs: cannot allocate a protection domain or completion "
                           "channel on %s: %s",
                           t->dev_name, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    fcntl(t->chan->fd, F_SETFL, fcntl(t->chan->fd, F_GETFL) | O_NONBLOCK);
    if (!(t->cq = ibv->create_cq(t->ctx, (int)cqe, NULL, t->chan, 0))) {
        gcoll_vb_set_error(t, "verbs: ibv_create_cq(%ld) on %s: %s", cqe, t->dev_name,
                           strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    return GCOLL_OK;
}

/* Eager rings: receive slots the peers write into, staging slots we send from; and the
 * registration cache of user buffers. */
static gcoll_status_t vb_rings(gcoll_transport_t *t, const gcoll_config_t *cfg)
{
    const gcoll_ibv_ops_t *ibv = t->ibv;
    size_t ring = (size_t)t->size * t->nslots * t->slot_size;
    if (posix_memalign((void **)&t->rx_mem, 4096, ring) != 0 ||
        posix_memalign((void **)&t->tx_mem, 4096, ring) != 0)
        return GCOLL_ERR_NOMEM;
    memset(t->rx_mem, 0, ring);
    memset(t->tx_mem, 0, ring);
    t->rx_mr =
        ibv->reg_mr(t->pd, t->rx_mem, ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    t->tx_mr = t->rx_mr ? ibv->reg_mr(t->pd, t->tx_mem, ring, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!t->tx_mr) {
        gcoll_vb_set_error(t, "verbs: cannot register %zu bytes of eager slots: %s%s", 2 * ring,
                           strerror(errno), errno == ENOMEM ? " (check ulimit -l)" : "");
        return GCOLL_ERR_TRANSPORT;
    }
    gcoll_vb_reg_init(&t->reg, ibv, t->pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                      cfg->ib_reg_cache);
    return GCOLL_OK;
}

/* Every peer's matching state, and the queue pairs, staging and receive flags of each
 * other rank. */
static gcoll_status_t vb_peers(gcoll_transport_t *t)
{
    if (!(t->peers = calloc((size_t)t->size, sizeof(*t->peers))))
        return GCOLL_ERR_NOMEM;
    t->match = (gcoll_match_t){.errmsg = t->errmsg,
                               .errlen = sizeof(t->errmsg),
                               .prefix = "verbs: ",
                               .complete = gcoll_vb_match_complete,
                               .ctx = t};
    for (int i = 0; i < t->size; i++) {
        t->peers[i].fd = -1;
        gcoll_match_peer_init(&t->peers[i].rx, &t->match, i);
    }
    for (int i = 0; i < t->size; i++) {
        if (i == t->rank)
            continue;
        gcoll_vb_peer_t *p = &t->peers[i];
        p->qps = calloc((size_t)t->nqp, sizeof(*p->qps));
        p->stage = calloc(t->nslots, sizeof(*p->stage));
        p->rx_done = calloc(t->nslots, 1);
        if (!p->qps || !p->stage || !p->rx_done)
            return GCOLL_ERR_NOMEM;
        for (int q = 0; q < t->nqp; q++)
            GCOLL_CHECK(qp_create(t, i, q, &p->qps[q]));
    }
    return GCOLL_OK;
}

/* Arms the completion channel and the epoll set the progress loop waits on (the channel,
 * and the wake fd if any). */
static gcoll_status_t vb_events(gcoll_transport_t *t)
{
    if (t->ibv->req_notify_cq(t->cq, 0) != 0) {
        gcoll_vb_set_error(t, "verbs: ibv_req_notify_cq: %s", strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0)
        return GCOLL_ERR_TRANSPORT;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->chan->fd, &ev);
    if (t->wake_fd >= 0) {
        ev.data.u64 = 1;
        epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev);
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_vb_create(const gcoll_transport_params_t *params, gcoll_transport_t **t_p)
{
    const gcoll_config_t *cfg = params->cfg;
    char why[256] = "";
    gcoll_transport_t *t = calloc(1, sizeof(*t));
    if (!t)
        return GCOLL_ERR_NOMEM;
    t->rank = params->rank;
    t->size = params->size;
    t->key = params->key;
    t->wake_fd = params->wake_fd;
    t->listen_fd = t->epfd = -1;
    gcoll_status_t st = gcoll_ibv_get(&t->ibv, why, sizeof(why));
    if (st != GCOLL_OK) {
        GCOLL_WARN("verbs: %s", why);
        goto err_free;
    }
    const gcoll_ibv_ops_t *ibv = t->ibv;
    st = open_port(ibv, cfg->ib_hca, &t->ctx, &t->port, &t->port_attr, t->dev_name,
                   sizeof(t->dev_name), why, sizeof(why));
    if (st != GCOLL_OK) {
        gcoll_vb_set_error(t, "verbs: %s", why);
        GCOLL_WARN("verbs: %s", why);
        goto err_free;
    }
    t->roce = t->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    GCOLL_CHECK_GOTO(choose_gid(t, cfg->ib_gid_index), st, err_free);
    struct ibv_device_attr da;
    st = GCOLL_ERR_TRANSPORT;
    if (ibv->query_device(t->ctx, &da) != 0) {
        gcoll_vb_set_error(t, "verbs: ibv_query_device(%s): %s", t->dev_name, strerror(errno));
        goto err_free;
    }
    long cqe = vb_settings(t, cfg, &da);
    GCOLL_CHECK_GOTO(vb_cq(t, cqe), st, err_free);
    GCOLL_CHECK_GOTO(vb_rings(t, cfg), st, err_free);
    GCOLL_CHECK_GOTO(vb_peers(t), st, err_free);
    t->match.unexp_max = cfg->unexpected_bytes;
    GCOLL_CHECK_GOTO(vb_events(t), st, err_free);
    if (t->size > 1)
        GCOLL_CHECK_GOTO(listen_on(t, params->local_ip), st, err_free);
    char gid[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, t->gid.raw, gid, sizeof(gid));
    GCOLL_INFO(GCOLL_SUBSYS_NET,
               "verbs: %s port %d (%s, lid 0x%x, gid[%d] %s, mtu %d), "
               "%d qp(s) per peer, %u slots of %zu bytes, chunks of %zu bytes",
               t->dev_name, t->port, t->roce ? "RoCE" : "InfiniBand", t->port_attr.lid,
               t->gid_index, gid, 128 << t->port_attr.active_mtu, t->nqp, t->nslots, t->slot_size,
               t->chunk_max);
    *t_p = t;
    return GCOLL_OK;
err_free:
    if (t->errmsg[0])
        GCOLL_WARN("%s", t->errmsg);
    gcoll_vb_destroy(t);
    return st;
}
