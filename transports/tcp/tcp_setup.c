/* tcp_setup.c: the TCP transport's life cycle: create, address, connect (dial/accept),
 * adopt, destroy, and its ops table. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/tcp/tcp_int.h"
#include "base/topo.h"

static const char *tcp_last_error(gcoll_transport_t *t)
{
    return t->errmsg;
}

static gcoll_status_t tcp_mem_reg(gcoll_transport_t *t, void *buf, size_t len, void **handle_p)
{
    (void)t;
    (void)buf;
    (void)len;
    *handle_p = NULL;
    return GCOLL_OK;
}

static void tcp_mem_dereg(gcoll_transport_t *t, void *handle)
{
    (void)t;
    (void)handle;
}

/* ---------------------------------------------------------------------------------- */
/* Setup                                                                                */

/* GCOLL_TCP_IFNAME, else the interface the kernel routes the root's address through. */
static int tcp_nic(const gcoll_config_t *cfg, const char *root, char *ifname, size_t len)
{
    if (cfg->tcp_ifname && *cfg->tcp_ifname) {
        snprintf(ifname, len, "%s", cfg->tcp_ifname);
        return 0;
    }
    return root && *root ? gcoll_topo_route_ifname(root, ifname, len) : -1;
}

static gcoll_status_t tcp_probe(char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    return GCOLL_OK;
}

static int resolve(const char *host, const char *port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* Closing a socket with received bytes still unread makes the kernel reset the
 * connection, and a reset discards what the peer has not read yet: the abort notice this
 * rank sent just before (a mismatch it saw) would be lost, and the peer would report a
 * failed peer instead of the mismatch (seen with 400 KB alltoalls on 4 ranks). So every
 * socket is shut for writing (what was sent still arrives, then EOF) and drained until the
 * peer closes its side too, for at most LINGER_MS in all. */
#define LINGER_MS 200
static void linger_close(gcoll_transport_t *t)
{
    int n = 0;
    for (int i = 0; i < t->size; i++)
        for (int k = 0; t->peers[i].socks && k < t->nsocks; k++)
            n += t->peers[i].socks[k].fd >= 0;
    struct pollfd *pf = calloc((size_t)n + 1, sizeof(*pf));
    if (!pf)
        return;
    n = 0;
    for (int i = 0; i < t->size; i++)
        for (int k = 0; t->peers[i].socks && k < t->nsocks; k++) {
            int fd = t->peers[i].socks[k].fd;
            if (fd >= 0 && shutdown(fd, SHUT_WR) == 0)
                pf[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
        }
    uint64_t end = gcoll_time_ms() + LINGER_MS;
    char buf[65536];
    for (int open = n; open > 0;) {
        int left = gcoll_ms_left(end, LINGER_MS);
        if (left <= 0 || poll(pf, (nfds_t)n, left) <= 0)
            break;
        for (int j = 0; j < n; j++) {
            if (pf[j].fd < 0 || !pf[j].revents)
                continue;
            ssize_t r = recv(pf[j].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                pf[j].fd = -1; /* the peer closed (or the connection is gone): poll skips it */
                open--;
            }
        }
    }
    free(pf);
}

static void tcp_destroy(gcoll_transport_t *t)
{
    if (!t)
        return;
    if (t->peers)
        linger_close(t);
    if (t->peers) {
        for (int i = 0; i < t->size; i++) {
            tcp_peer_t *p = &t->peers[i];
            if (p->socks)
                for (int k = 0; k < t->nsocks; k++)
                    sock_close(t, &p->socks[k]);
            gcoll_tcp_rx_free(t, p);
            free(p->socks);
        }
        free(t->peers);
    }
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->epfd >= 0)
        close(t->epfd);
    free(t);
}

static gcoll_status_t tcp_create(const gcoll_transport_params_t *params, gcoll_transport_t **t_p)
{
    gcoll_transport_t *t = calloc(1, sizeof(*t));
    if (!t)
        return GCOLL_ERR_NOMEM;
    t->rank = params->rank;
    t->size = params->size;
    t->nsocks = (int)params->cfg->tcp_nsocks;
    t->stripe_min = GCOLL_MAX(params->cfg->tcp_stripe_min, (size_t)1);
    t->key = params->key;
    t->wake_fd = params->wake_fd;
    t->listen_fd = -1;
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->peers = calloc((size_t)t->size, sizeof(*t->peers));
    t->match = (gcoll_match_t){.errmsg = t->errmsg,
                               .errlen = sizeof(t->errmsg),
                               .unexp_max = params->cfg->unexpected_bytes,
                               .prefix = "",
                               .complete = gcoll_tcp_complete,
                               .ctx = t};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (t->epfd < 0 || !t->peers)
        goto err_free;
    for (int i = 0; i < t->size; i++) {
        gcoll_match_peer_init(&t->peers[i].rx, &t->match, i);
        t->peers[i].socks = calloc((size_t)t->nsocks, sizeof(tcp_sock_t));
        if (!t->peers[i].socks)
            goto err_free;
        for (int k = 0; k < t->nsocks; k++) {
            t->peers[i].socks[k].fd = -1;
            t->peers[i].socks[k].peer = i;
        }
    }
    if (t->wake_fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev);
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    st = GCOLL_ERR_TRANSPORT;
    if (resolve(params->local_ip, "0", &ss, &sl) != 0) {
        GCOLL_WARN("tcp: cannot use local address '%s'", params->local_ip);
        goto err_free;
    }
    t->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->listen_fd < 0 || bind(t->listen_fd, (struct sockaddr *)&ss, sl) != 0 ||
        listen(t->listen_fd, 256) != 0) {
        GCOLL_WARN("tcp: cannot listen on %s: %s", params->local_ip, strerror(errno));
        goto err_free;
    }
    sl = sizeof(ss);
    getsockname(t->listen_fd, (struct sockaddr *)&ss, &sl);
    char ip[INET6_ADDRSTRLEN];
    int port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                       : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    inet_ntop(ss.ss_family,
              ss.ss_family == AF_INET ? (void *)&((struct sockaddr_in *)&ss)->sin_addr
                                      : (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr,
              ip, sizeof(ip));
    snprintf(t->addr, sizeof(t->addr), "%s %d", ip, port);
    GCOLL_INFO(GCOLL_SUBSYS_NET, "tcp: listening on %s port %d, %d socket(s) per peer", ip, port,
               t->nsocks);
    *t_p = t;
    return GCOLL_OK;
err_free:
    tcp_destroy(t);
    return st;
}

static gcoll_status_t tcp_address(gcoll_transport_t *t, void *buf, size_t *len_p)
{
    size_t n = strlen(t->addr) + 1;
    if (*len_p < n)
        return GCOLL_ERR_INVALID;
    memcpy(buf, t->addr, n);
    *len_p = n;
    return GCOLL_OK;
}

/* A peer host that vanishes without closing (power loss, a cut link) leaves idle
 * connections silent, and only the slow-peer bound (GCOLL_TIMEOUT_MS, 30 minutes) would
 * end the wait: keepalive probes find it out in about 20 s (10 s idle, then 5 probes 2 s
 * apart; Linux's defaults take over two hours). A live peer's kernel answers them however
 * long its process computes, so a slow peer is never taken for a dead one. */
#define KEEPALIVE_IDLE_S 10
#define KEEPALIVE_INTVL_S 2
#define KEEPALIVE_CNT 5

static void sock_setup(int fd)
{
    int one = 1, idle = KEEPALIVE_IDLE_S, intvl = KEEPALIVE_INTVL_S, cnt = KEEPALIVE_CNT;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Connects (retrying while the peer's listener is not up yet) and authenticates. */
static gcoll_status_t dial(gcoll_transport_t *t, int peer, int idx, const char *blob, size_t len,
                           uint64_t deadline_ms, int *fd_p)
{
    char host[INET6_ADDRSTRLEN + 1], port[16];
    if (len == 0 || blob[len - 1] != '\0' || sscanf(blob, "%46s %15s", host, port) != 2) {
        set_error(t, "rank %d published a malformed tcp address", peer);
        return GCOLL_ERR_INVALID;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl) != 0) {
        set_error(t, "rank %d published an unusable tcp address '%s'", peer, blob);
        return GCOLL_ERR_INVALID;
    }
    for (;;) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return GCOLL_ERR_TRANSPORT;
        /* bounded by the deadline: not the kernel's two minutes of SYN retries */
        if (gcoll_sock_connect(fd, (struct sockaddr *)&ss, sl, deadline_ms) == GCOLL_OK) {
            uint8_t id[12];
            gcoll_put_u32(id, (uint32_t)t->rank);
            gcoll_put_u32(id + 4, (uint32_t)idx);
            gcoll_put_u32(id + 8, (uint32_t)t->size);
            char err[256];
            gcoll_status_t st =
                gcoll_auth_client(fd, &t->key, id, sizeof(id), deadline_ms, err, sizeof(err));
            if (st != GCOLL_OK) {
                close(fd);
                set_error(t, "connecting to rank %d at %s port %s: %s", peer, host, port, err);
                return st;
            }
            *fd_p = fd;
            return GCOLL_OK;
        }
        int e = errno;
        close(fd);
        if (gcoll_time_ms() >= deadline_ms) {
            set_error(t, "cannot connect to rank %d at %s port %s: %s", peer, host, port,
                      strerror(e));
            return GCOLL_ERR_TIMEOUT;
        }
        usleep(20000);
    }
}

static int on_accept(void *arg, int fd, const void *payload, size_t plen, const char *from)
{
    gcoll_transport_t *t = arg;
    if (plen != 12)
        return -1;
    int peer = (int)gcoll_get_u32(payload);
    int idx = (int)gcoll_get_u32((const uint8_t *)payload + 4);
    int size = (int)gcoll_get_u32((const uint8_t *)payload + 8);
    if (peer <= t->rank || peer >= t->size || idx < 0 || idx >= t->nsocks || size != t->size ||
        t->peers[peer].socks[idx].fd >= 0)
        return -1;
    GCOLL_DEBUG(GCOLL_SUBSYS_NET, "tcp: rank %d socket %d connected from %s", peer, idx, from);
    t->peers[peer].socks[idx].fd = fd;
    return 0;
}

/* Whether a connected socket's two ends have the same address: the peer is on this host
 * (loopback, or this host's own interface address). */
static int same_address(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 ||
        getpeername(fd, (struct sockaddr *)&b, &lb) != 0 || a.ss_family != b.ss_family)
        return 0;
    if (a.ss_family == AF_INET)
        return ((struct sockaddr_in *)&a)->sin_addr.s_addr ==
               ((struct sockaddr_in *)&b)->sin_addr.s_addr;
    if (a.ss_family == AF_INET6)
        return memcmp(&((struct sockaddr_in6 *)&a)->sin6_addr,
                      &((struct sockaddr_in6 *)&b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return 0;
}

/* All of a peer's sockets are open: whether it is on this host, where messages go whole
 * and through a bounded send buffer, which keeps what is in flight in cache (tcp_int.h). */
static void peer_connected(gcoll_transport_t *t, int peer)
{
    tcp_peer_t *p = &t->peers[peer];
    p->local = same_address(p->socks[0].fd);
    if (!p->local)
        return;
    for (int k = 0; k < t->nsocks; k++)
        gcoll_tcp_set_sndbuf(&p->socks[k], GCOLL_TCP_LOCAL_ONEWAY);
    if (t->nsocks > 1)
        GCOLL_INFO(GCOLL_SUBSYS_NET, "tcp: rank %d is on this host: messages go unstriped", peer);
}

static gcoll_status_t tcp_connect(gcoll_transport_t *t, const void *const *blobs,
                                  const size_t *lens, uint64_t deadline_ms)
{
    /* Lower ranks listen, higher ranks dial: no cycle, so no deadlock. */
    for (int peer = 0; peer < t->rank; peer++)
        for (int k = 0; k < t->nsocks; k++)
            GCOLL_CHECK(dial(t, peer, k, blobs[peer], lens[peer], deadline_ms,
                             &t->peers[peer].socks[k].fd));
    int want = (t->size - 1 - t->rank) * t->nsocks;
    if (want > 0) {
        char err[256];
        gcoll_status_t st = gcoll_auth_accept(t->listen_fd, &t->key, want, on_accept, t,
                                              deadline_ms, err, sizeof(err));
        if (st != GCOLL_OK) {
            set_error(t, "tcp: accepting peer connections: %s", err);
            return st;
        }
    }
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank)
            continue;
        for (int k = 0; k < t->nsocks; k++) {
            tcp_sock_t *s = &t->peers[peer].socks[k];
            sock_setup(s->fd);
            s->open = 1;
            struct epoll_event ev = {.events = GCOLL_TCP_EV_IN, .data.ptr = s};
            if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0)
                return GCOLL_ERR_TRANSPORT;
        }
        t->peers[peer].nopen = t->nsocks;
        peer_connected(t, peer);
    }
    close(t->listen_fd);
    t->listen_fd = -1;
    GCOLL_INFO(GCOLL_SUBSYS_NET, "tcp: connected to %d peer(s)", t->size - 1);
    return GCOLL_OK;
}

/* For tests: adopt an already connected socket as the connection to a peer. */
gcoll_status_t gcoll_tcp_adopt(gcoll_transport_t *t, int peer, int idx, int fd)
{
    if (peer < 0 || peer >= t->size || peer == t->rank || idx < 0 || idx >= t->nsocks)
        return GCOLL_ERR_INVALID;
    tcp_sock_t *s = &t->peers[peer].socks[idx];
    s->fd = fd;
    sock_setup(fd);
    s->open = 1;
    if (++t->peers[peer].nopen == t->nsocks)
        peer_connected(t, peer);
    struct epoll_event ev = {.events = GCOLL_TCP_EV_IN, .data.ptr = s};
    return epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) == 0 ? GCOLL_OK : GCOLL_ERR_TRANSPORT;
}

const gcoll_transport_ops_t gcoll_tcp_ops = {
    .size = sizeof(gcoll_transport_ops_t),
    .name = "tcp",
    .probe = tcp_probe,
    .create = tcp_create,
    .address = tcp_address,
    .connect = tcp_connect,
    .isend = gcoll_tcp_isend,
    .irecv = gcoll_tcp_irecv,
    .progress = gcoll_tcp_progress,
    .cancel = gcoll_tcp_cancel,
    .abort = gcoll_tcp_abort,
    .last_error = tcp_last_error,
    .mem_reg = tcp_mem_reg,
    .mem_dereg = tcp_mem_dereg,
    .destroy = tcp_destroy,
    .nic = tcp_nic,
    .peek = gcoll_tcp_peek,
};
