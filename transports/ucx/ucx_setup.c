/* ucx_setup.c: the UCX transport's life cycle: probe, one ucp_context + ucp_worker per
 * communicator, the address blob, endpoints with peer-failure handling, a hello round that
 * proves every endpoint works, and a bounded teardown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

#define BLOB_MAGIC 0x41554347u /* "GCUA" */
#define BLOB_HDR_LEN 20        /* magic u32, version u8, pad 3, cookie u64, address length u32 */
#define BLOB_CMA_LEN                                                                               \
    24 /* after the address: pid u32 (0: no single copy), pad u32,                                 \
        * address of the probe word u64, its value u64 */
#define BLOB_TAIL_LEN (BLOB_CMA_LEN + GCOLL_UCX_BLOB_SHM_LEN) /* then the mailbox's */
#define CLOSE_DRAIN_MS 1000

/* ---------------------------------------------------------------------------------- */
/* Context                                                                              */

/* Whether UCX_TLS allows one of names[]: unset, an exclusion list ('^...'), or a list
 * naming one of them. */
static int tls_may_use(const char *tls, const char *const *names, size_t n)
{
    if (!tls || !*tls || tls[0] == '^')
        return 1;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok += strspn(tok, " \\");
        for (size_t i = 0; i < n; i++)
            if (strcmp(tok, names[i]) == 0)
                return 1;
    }
    return 0;
}

/* Whether UCX_TLS lets UCX load its shared-memory (mm) transports; UCX warns about
 * settings of transports it does not load. */
static int tls_may_use_mm(const char *tls)
{
    static const char *const mm[] = {"all", "sm", "shm", "mm", "posix", "sysv"};
    return tls_may_use(tls, mm, GCOLL_ARRAY_SIZE(mm));
}

/* Single copy bypasses UCX's transports between ranks of one host: only where UCX_TLS
 * lets UCX use such transports itself (UCX_TLS=tcp means tcp, also on one host). */
int gcoll_ucx_tls_local(void)
{
    static const char *const local[] = {"all",  "sm",  "shm",  "mm",   "posix",
                                        "sysv", "cma", "knem", "xpmem"};
    static const char *const cma[] = {"cma"};
    const char *tls = getenv("UCX_TLS");
    /* an exclusion list that names cma (UCX_TLS=^cma,...) excludes ours too */
    if (tls && tls[0] == '^')
        return !(tls[1] && tls_may_use(tls + 1, cma, 1));
    return tls_may_use(tls, local, GCOLL_ARRAY_SIZE(local));
}

/* Reads UCX's configuration (UCX_TLS, UCX_NET_DEVICES, ... pass through untouched) and
 * shortens UCX's keepalive so that a dead peer on a shared-memory transport is noticed
 * within the communicator's timeout; the UCX_ variables below set by the user win. */
static ucs_status_t context_init(int64_t timeout_ms, int nranks, ucp_context_h *ctx_p)
{
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK)
        return s;
    if (!getenv("UCX_KEEPALIVE_INTERVAL") && timeout_ms > 0) {
        char v[32];
        snprintf(v, sizeof(v), "%lldms", (long long)GCOLL_MAX(GCOLL_MIN(timeout_ms / 4, 500), 100));
        if (ucp_config_modify(config, "KEEPALIVE_INTERVAL", v) != UCS_OK)
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: cannot set KEEPALIVE_INTERVAL=%s", v);
    }
    /* UCX 1.13 does not offer peer-failure handling on its shared-memory transports unless
     * asked (MM_ERROR_HANDLING, inherited by POSIX_ and SYSV_), and without it no shared-
     * memory lane qualifies for our error-handling endpoints: UCX_TLS=posix,... would find
     * no transport at all. Ask, unless the user chose. */
    if (!getenv("UCX_MM_ERROR_HANDLING") && !getenv("UCX_POSIX_ERROR_HANDLING") &&
        !getenv("UCX_SYSV_ERROR_HANDLING") && tls_may_use_mm(getenv("UCX_TLS")) &&
        ucp_config_modify(config, "MM_ERROR_HANDLING", "y") != UCS_OK)
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: cannot set MM_ERROR_HANDLING=y");
    /* UCX 1.13 learns a peer's endpoint id lazily, at the first rendezvous: the peer's
     * reply can then sit in a full shared-memory FIFO, and if the peer dies meanwhile,
     * purging it fails an assertion in ucp_request_send_state_ff() and aborts the process
     * (UCX PR 8175 removed the assertion). Learn the ids while connecting instead, where
     * the hello and ready rounds see every reply delivered. */
    if (!getenv("UCX_RESOLVE_REMOTE_EP_ID") &&
        ucp_config_modify(config, "RESOLVE_REMOTE_EP_ID", "y") != UCS_OK)
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: cannot set RESOLVE_REMOTE_EP_ID=y");
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME |
                                      UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                                      UCP_PARAM_FIELD_ESTIMATED_NUM_EPS,
                        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                        .mt_workers_shared = 0,
                        .estimated_num_eps = (size_t)GCOLL_MAX(nranks, 1),
                        .name = "gcoll"};
    s = ucp_init(&prm, config, ctx_p);
    ucp_config_release(config);
    return s;
}

/* "tl/dev tl/dev ..." of the resources the context will use. */
static void context_resources(ucp_context_h ctx, char *out, size_t outlen, int *rdma_p)
{
    char *text = NULL;
    size_t textlen = 0;
    size_t o = 0;
    out[0] = '\0';
    *rdma_p = 0;
    FILE *f = open_memstream(&text, &textlen);
    if (!f)
        return;
    ucp_context_print_info(ctx, f);
    fclose(f);
    /* Lines read "#      resource 1  :  md 1  dev 1  flags -- tcp/lo". */
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "resource") || !strstr(line, "flags"))
            continue;
        char *tl = strrchr(line, ' ');
        if (!tl || !strchr(tl, '/'))
            continue;
        tl++;
        /* RDMA: UCX's rc, dc and ud transports (rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ...) */
        if (!strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2))
            *rdma_p = 1;
        if (o < outlen)
            o += (size_t)snprintf(out + o, outlen - o, "%s%s", o ? " " : "", tl);
    }
    free(text);
}

int gcoll_ucx_rdma_capable(char *desc, size_t desclen)
{
    ucp_context_h ctx;
    char res[512];
    int rdma = 0;
    if (context_init(0, 1, &ctx) != UCS_OK) {
        if (desc && desclen)
            snprintf(desc, desclen, "UCX does not initialize");
        return 0;
    }
    context_resources(ctx, res, sizeof(res), &rdma);
    if (desc && desclen)
        snprintf(desc, desclen, "%s", res);
    ucp_cleanup(ctx);
    return rdma;
}

int gcoll_ucx_local_capable(char *desc, size_t desclen)
{
    ucp_context_h ctx;
    char res[512], *save = NULL;
    int rdma, shm = 0;
    if (!gcoll_ucx_tls_local() || context_init(0, 1, &ctx) != UCS_OK)
        return 0;
    context_resources(ctx, res, sizeof(res), &rdma);
    ucp_cleanup(ctx);
    if (desc && desclen)
        snprintf(desc, desclen, "%s", res);
    /* UCX's shared-memory fifos (small messages) and gcoll's single copy (large ones) */
    for (char *tl = strtok_r(res, " ", &save); tl; tl = strtok_r(NULL, " ", &save))
        if (!strncmp(tl, "posix/", 6) || !strncmp(tl, "sysv/", 5))
            shm = 1;
    return shm;
}

gcoll_status_t gcoll_ucx_probe(char *why, size_t whylen)
{
    gcoll_log_init(); /* probe can be the first call (gcoll-info -t) */
    ucp_context_h ctx;
    ucs_status_t s = context_init(0, 1, &ctx);
    if (s != UCS_OK) {
        snprintf(why, whylen,
                 "ucp_init failed: %s (check UCX_TLS / UCX_NET_DEVICES; "
                 "ucx_info -d lists the devices)",
                 ucs_status_string(s));
        return GCOLL_ERR_UNSUPPORTED;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    ucp_worker_h w;
    s = ucp_worker_create(ctx, &wp, &w);
    if (s != UCS_OK) {
        snprintf(why, whylen, "ucp_worker_create failed: %s", ucs_status_string(s));
        ucp_cleanup(ctx);
        return GCOLL_ERR_UNSUPPORTED;
    }
    char res[512];
    int rdma;
    context_resources(ctx, res, sizeof(res), &rdma);
    GCOLL_INFO(GCOLL_SUBSYS_NET, "ucx: UCX %s usable; transports/devices: %s%s",
               ucp_get_version_string(), res, rdma ? " (RDMA)" : "");
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Instance                                                                             */

void gcoll_ucx_destroy(gcoll_transport_t *t)
{
    if (!t)
        return;
    t->closing = 1;
    GCOLL_DEBUG(GCOLL_SUBSYS_NET,
                "ucx: progress: sleeps=%lu sleep_timeouts=%lu held_polls=%lu held_naps=%lu "
                "cma_sends=%lu cma_recvs=%lu cma_puts=%lu shm_sends=%lu shm_recvs=%lu "
                "shm_bells=%lu shm_full=%lu shm_waits=%lu flush_polls=%lu",
                t->st_sleeps, t->st_sleep_timeouts, t->st_held_polls, t->st_held_naps,
                t->st_cma_sends, t->st_cma_recvs, t->st_cma_puts, t->st_shm_sends, t->st_shm_recvs,
                t->st_shm_bells, t->st_shm_full, t->st_shm_waits, t->st_flush_polls);
    /* Operations still in flight belong to requests the caller has given up on: whatever
     * completes them from here on (UCX purging them, a single-copy answer, a peer failing
     * during the drain) must find nobody to tell. */
    for (ucx_op_t *op = t->ops; op; op = op->next)
        op->req = NULL;
    if (t->peers) {
        for (int i = 0; i < t->size; i++) {
            ucx_peer_t *p = &t->peers[i];
            p->failing = p->failing_tail = NULL; /* the caller's requests: not ours to touch */
            gcoll_ucx_shm_end_waits(t, p, GCOLL_OK);
            for (gcoll_unexp_t *u = p->rx.unexp; u; u = u->next)
                if (u->kind == UCX_UNEXP_CMA) /* its sender waits for an answer: none will come */
                    gcoll_ucx_send_ctl(t, i, UCX_MSG_FIN, GCOLL_ERR_ABORTED, u->data + 24, 8);
            gcoll_match_peer_fini(&p->rx);
        }
        gcoll_ucx_fin_flush(t); /* single-copy answers still queued: their senders wait */
        /* Close every endpoint, flushing what is still on its way unless the peer failed,
         * and wait a bounded time for the closes. */
        void **reqs = calloc((size_t)t->size, sizeof(*reqs));
        for (int i = 0; i < t->size; i++) {
            ucx_peer_t *p = &t->peers[i];
            if (!p->ep)
                continue;
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                       .flags = p->rx.failed ? UCP_EP_CLOSE_FLAG_FORCE : 0};
            ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &prm);
            p->ep = NULL;
            if (UCS_PTR_IS_PTR(sp)) {
                if (reqs)
                    reqs[i] = sp;
                else
                    ucp_request_free(sp);
            }
        }
        uint64_t end = gcoll_time_ms() + CLOSE_DRAIN_MS;
        for (;;) {
            int pending = 0;
            for (int i = 0; reqs && i < t->size; i++) {
                if (reqs[i] && ucp_request_check_status(reqs[i]) != UCS_INPROGRESS) {
                    ucp_request_free(reqs[i]);
                    reqs[i] = NULL;
                }
                pending += reqs && reqs[i] != NULL;
            }
            if (!pending)
                break;
            if (gcoll_time_ms() >= end) {
                GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: %d endpoint(s) did not close in %d ms", pending,
                            CLOSE_DRAIN_MS);
                for (int i = 0; i < t->size; i++)
                    if (reqs[i])
                        ucp_request_free(reqs[i]);
                break;
            }
            /* Sleeps when idle: a peer that is not progressing (asleep, stopped) would
             * otherwise cost a core for the whole drain. */
            gcoll_ucx_ops.progress(t, gcoll_ms_left(end, 10));
        }
        free(reqs);
    }
    if (t->worker) /* purges what is still in flight (their requests are NULL) */
        ucp_worker_destroy(t->worker);
    gcoll_ucx_reg_fini(t); /* after the worker: purged operations may have used them */
    while (t->ops) {       /* not purged by UCX: only our bookkeeping is left */
        ucx_op_t *op = t->ops;
        t->ops = op->next;
        op->cma_token = 0; /* a single-copy send: a peer's read now fails */
        free(op->owned);
        free(op);
    }
    while (t->op_cache) {
        ucx_op_t *op = t->op_cache;
        t->op_cache = op->next;
        free(op);
    }
    gcoll_ucx_shm_destroy(t);
    free(t->shm_senders);
    if (t->ctx)
        ucp_cleanup(t->ctx);
    if (t->epfd >= 0)
        close(t->epfd);
    free(t->addr);
    free(t->fin);
    free(t->peers);
    free(t);
}

/* The single-copy and shared-memory mailbox settings, off when UCX_TLS leaves UCX no local
 * transport to carry them. */
static void ucx_local_settings(gcoll_transport_t *t, const gcoll_transport_params_t *params)
{
    t->cma_min = params->cfg ? params->cfg->ucx_cma_min : 0;
    if (t->cma_min && !gcoll_ucx_tls_local()) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: single copy off: UCX_TLS=%s has no local transport",
                    getenv("UCX_TLS"));
        t->cma_min = 0;
    }
    if (t->cma_min) {
        /* Yama (ptrace_scope 1) lets only ancestors read a process; the ranks are siblings */
        if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: prctl(PR_SET_PTRACER): %s", strerror(errno));
        while (t->cma_probe == 0)
            if (getrandom(&t->cma_probe, sizeof(t->cma_probe), 0) != sizeof(t->cma_probe))
                t->cma_probe = t->cookie * 0x9e3779b97f4a7c15ull;
        t->cma_next = (t->cma_probe >> 16) | 1;
    }

    t->shm_max = params->cfg ? params->cfg->ucx_shm_max : 0;
    if (t->shm_max > GCOLL_UCX_SHM_MAX_LIMIT) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: GCOLL_UCX_SHM_MAX=%zu capped at %u", t->shm_max,
                    GCOLL_UCX_SHM_MAX_LIMIT);
        t->shm_max = GCOLL_UCX_SHM_MAX_LIMIT;
    }
    if (t->shm_max && !tls_may_use_mm(getenv("UCX_TLS"))) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET,
                    "ucx: shared-memory mailbox off: UCX_TLS=%s has no "
                    "shared-memory transport",
                    getenv("UCX_TLS"));
        t->shm_max = 0;
    }
}

/* The UCP context and worker, with gcoll's active-message handler, and the worker's event
 * fd (and the wake fd) in the epoll set. */
static gcoll_status_t ucx_worker(gcoll_transport_t *t, const gcoll_transport_params_t *params)
{
    ucs_status_t s = context_init(params->cfg ? params->cfg->timeout_ms : 0, t->size, &t->ctx);
    if (s != UCS_OK) {
        t->ctx = NULL;
        GCOLL_WARN("ucx: ucp_init failed: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE |
                                            UCP_WORKER_PARAM_FIELD_EVENTS,
                              /* one thread at a time: the communicator's owner */
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED,
                              .events = UCP_WAKEUP_RX | UCP_WAKEUP_TX};
    if ((s = ucp_worker_create(t->ctx, &wp, &t->worker)) != UCS_OK) {
        t->worker = NULL;
        GCOLL_WARN("ucx: ucp_worker_create failed: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if (ucp_worker_query(t->worker, &wa) != UCS_OK || wa.max_am_header < GCOLL_UCX_HDR_LEN) {
        GCOLL_WARN("ucx: active-message headers of %d bytes are not supported", GCOLL_UCX_HDR_LEN);
        return GCOLL_ERR_TRANSPORT;
    }
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = GCOLL_UCX_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA,
        .cb = gcoll_ucx_am_cb,
        .arg = t};
    if ((s = ucp_worker_set_am_recv_handler(t->worker, &ap)) != UCS_OK) {
        GCOLL_WARN("ucx: cannot set the active-message handler: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    if ((s = ucp_worker_get_efd(t->worker, &t->efd)) != UCS_OK) {
        GCOLL_WARN("ucx: ucp_worker_get_efd failed: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = t->efd};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->efd, &ev) != 0)
        return GCOLL_ERR_TRANSPORT;
    if (t->wake_fd >= 0) {
        ev.data.fd = t->wake_fd;
        if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev) != 0)
            return GCOLL_ERR_TRANSPORT;
    }
    return GCOLL_OK;
}

/* A copy of the worker's address, the blob the peers connect to. */
static gcoll_status_t ucx_own_address(gcoll_transport_t *t)
{
    ucp_address_t *addr;
    ucs_status_t s;
    if ((s = ucp_worker_get_address(t->worker, &addr, &t->addr_len)) != UCS_OK) {
        GCOLL_WARN("ucx: ucp_worker_get_address failed: %s", ucs_status_string(s));
        return GCOLL_ERR_TRANSPORT;
    }
    t->addr = malloc(t->addr_len);
    if (t->addr)
        memcpy(t->addr, addr, t->addr_len);
    ucp_worker_release_address(t->worker, addr);
    return t->addr ? GCOLL_OK : GCOLL_ERR_NOMEM;
}

gcoll_status_t gcoll_ucx_create(const gcoll_transport_params_t *params, gcoll_transport_t **t_p)
{
    gcoll_transport_t *t = calloc(1, sizeof(*t));
    if (!t)
        return GCOLL_ERR_NOMEM;
    t->rank = params->rank;
    t->size = params->size;
    t->wake_fd = params->wake_fd;
    t->efd = -1;
    t->shm_fd = -1;
    t->shm_stall_limit_ns = GCOLL_UCX_SHM_STALL_NS;
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->peers = calloc((size_t)t->size, sizeof(*t->peers));
    t->shm_senders = calloc((size_t)t->size, sizeof(*t->shm_senders));
    t->match = (gcoll_match_t){.errmsg = t->errmsg,
                               .errlen = sizeof(t->errmsg),
                               .unexp_max = params->cfg ? params->cfg->unexpected_bytes : 0,
                               .prefix = "",
                               .complete = gcoll_ucx_match_complete,
                               .release = gcoll_ucx_match_release,
                               .ctx = t};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (t->epfd < 0 || !t->peers || !t->shm_senders || gcoll_ucx_reg_init(t) != GCOLL_OK)
        goto err_destroy;
    for (int i = 0; i < t->size; i++) {
        t->peers[i].t = t;
        t->peers[i].rank = i;
        gcoll_match_peer_init(&t->peers[i].rx, &t->match, i);
    }
    while (t->cookie == 0)
        if (getrandom(&t->cookie, sizeof(t->cookie), 0) != sizeof(t->cookie))
            t->cookie = gcoll_time_ns() ^ ((uint64_t)getpid() << 32);

    ucx_local_settings(t, params);
    GCOLL_CHECK_GOTO(gcoll_ucx_shm_create(t), st, err_destroy);
    GCOLL_CHECK_GOTO(ucx_worker(t, params), st, err_destroy);
    GCOLL_CHECK_GOTO(ucx_own_address(t), st, err_destroy);
    char res[512];
    int rdma;
    context_resources(t->ctx, res, sizeof(res), &rdma);
    GCOLL_INFO(GCOLL_SUBSYS_NET, "ucx: UCX %s, worker address %zu bytes; transports/devices: %s",
               ucp_get_version_string(), t->addr_len, res);
    *t_p = t;
    return GCOLL_OK;
err_destroy:
    gcoll_ucx_destroy(t);
    return st;
}

gcoll_status_t gcoll_ucx_address(gcoll_transport_t *t, void *buf, size_t *len_p)
{
    size_t n = BLOB_HDR_LEN + t->addr_len + BLOB_TAIL_LEN;
    if (*len_p < n) {
        gcoll_ucx_set_error(t, "UCX worker address of %zu bytes does not fit in %zu", t->addr_len,
                            *len_p);
        return GCOLL_ERR_INVALID;
    }
    uint8_t *p = buf;
    memset(p, 0, BLOB_HDR_LEN);
    gcoll_put_u32(p, BLOB_MAGIC);
    p[4] = GCOLL_UCX_VERSION;
    gcoll_put_u64(p + 8, t->cookie);
    gcoll_put_u32(p + 16, (uint32_t)t->addr_len);
    memcpy(p + BLOB_HDR_LEN, t->addr, t->addr_len);
    uint8_t *c = p + BLOB_HDR_LEN + t->addr_len;
    memset(c, 0, BLOB_CMA_LEN);
    if (t->cma_min) {
        gcoll_put_u32(c, (uint32_t)getpid());
        gcoll_put_u64(c + 8, (uint64_t)(uintptr_t)&t->cma_probe);
        gcoll_put_u64(c + 16, t->cma_probe);
    }
    gcoll_ucx_shm_blob(t, c + BLOB_CMA_LEN);
    *len_p = n;
    return GCOLL_OK;
}

/* Logs the lanes UCX chose for one endpoint (transport and device per lane). */
static void log_lanes(ucp_ep_h ep, int peer)
{
    if (!GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_NET))
        return;
    char *text = NULL;
    size_t textlen = 0;
    FILE *f = open_memstream(&text, &textlen);
    if (!f)
        return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "lane["))
            GCOLL_INFO(GCOLL_SUBSYS_NET, "ucx: to rank %d: %s", peer, line + strspn(line, "# "));
    free(text);
}

/* Single copy to and from peer: can we read its memory? It published a random word and
 * where it lives; reading it back proves the pid is that rank's, on this host, and that
 * the kernel lets us (same user, Yama, no seccomp filter in the way). */
static void cma_probe(gcoll_transport_t *t, int peer, const uint8_t *c)
{
    uint32_t pid = gcoll_get_u32(c);
    uint64_t want = gcoll_get_u64(c + 16), got = 0;
    if (!t->cma_min || pid == 0)
        return;
    struct iovec l = {.iov_base = &got, .iov_len = sizeof(got)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)gcoll_get_u64(c + 8), .iov_len = sizeof(got)};
    ssize_t n = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)sizeof(got) && got == want) {
        t->peers[peer].cma_pid = (int)pid;
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: rank %d (pid %u): single copy from it", peer, pid);
    } else {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: rank %d (pid %u): no single copy from it (%s)", peer,
                    pid, n < 0 ? strerror(errno) : "another process or host");
    }
}

/* Sends every peer the connect round's hello and waits for theirs (and for ours to
 * leave). An abort arriving meanwhile ends the wait: connecting worked (a faster rank
 * already failed its first collective), and our first collective reports the abort. */
static gcoll_status_t connect_round(gcoll_transport_t *t, int round, uint64_t deadline_ms)
{
    for (int peer = 0; peer < t->size; peer++)
        if (peer != t->rank) {
            /* the flag byte: we can read its memory, so it may send us single-copy; we
             * write small messages into its mailbox, so it must poll our ring */
            uint8_t msg[5] = {(t->peers[peer].cma_pid ? GCOLL_UCX_HELLO_CMA : 0) |
                              (t->peers[peer].shm_ring ? GCOLL_UCX_HELLO_SHM : 0)};
            /* the ready round also carries our mailbox size when every pair of us has
             * mailboxes both ways (every round-1 hello has come), so that all ranks agree
             * on the least (mesh_max) */
            gcoll_put_u32(msg + 1, round == 2 ? gcoll_ucx_shm_mesh_own(t) : 0);
            GCOLL_CHECK(gcoll_ucx_send_ctl(t, peer, UCX_MSG_HELLO, -round, msg, sizeof(msg)));
        }
    t->peers[t->rank].hello = round;
    for (;;) {
        int missing = -1, nmissing = 0;
        if (t->aborted) {
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: an abort arrived while connecting");
            return GCOLL_OK;
        }
        for (int peer = 0; peer < t->size; peer++) {
            if (t->peers[peer].rx.failed) {
                gcoll_ucx_set_error(t, "ucx: rank %d failed while connecting", peer);
                return GCOLL_ERR_PEER;
            }
            if (t->peers[peer].hello < round) {
                nmissing++;
                if (missing < 0)
                    missing = peer;
            }
        }
        if (nmissing == 0 && !t->ops)
            return GCOLL_OK;
        if (gcoll_time_ms() >= deadline_ms) {
            if (nmissing)
                gcoll_ucx_set_error(t,
                                    "ucx: no %s from %d rank(s) (first: rank %d) before "
                                    "the deadline",
                                    round == 1 ? "hello" : "ready", nmissing, missing);
            else
                gcoll_ucx_set_error(t, "ucx: connect messages not delivered before the "
                                       "deadline");
            return GCOLL_ERR_TIMEOUT;
        }
        GCOLL_CHECK(gcoll_ucx_ops.progress(t, gcoll_ms_left(deadline_ms, 100)));
    }
}

static gcoll_status_t flush_ep(gcoll_transport_t *t, int peer, uint64_t deadline_ms)
{
    if (peer == t->rank || !t->peers[peer].ep)
        return GCOLL_OK;
    ucp_request_param_t prm = {.op_attr_mask = 0};
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(t->peers[peer].ep, &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        gcoll_ucx_set_error(t, "ucx: flushing the endpoint to rank %d: %s", peer,
                            ucs_status_string(UCS_PTR_STATUS(sp)));
        return GCOLL_ERR_PEER;
    }
    if (!sp)
        return GCOLL_OK;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS && gcoll_time_ms() < deadline_ms &&
           !t->aborted && !t->peers[peer].rx.failed)
        gcoll_ucx_ops.progress(t, gcoll_ms_left(deadline_ms, 100));
    ucs_status_t s = ucp_request_check_status(sp);
    ucp_request_free(sp);
    if (s == UCS_INPROGRESS && !t->aborted && !t->peers[peer].rx.failed) {
        gcoll_ucx_set_error(t, "ucx: endpoint to rank %d not flushed before the deadline", peer);
        return GCOLL_ERR_TIMEOUT;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_ucx_connect(gcoll_transport_t *t, const void *const *blobs, const size_t *lens,
                                 uint64_t deadline_ms)
{
    for (int peer = 0; peer < t->size; peer++) {
        if (peer == t->rank)
            continue;
        const uint8_t *b = blobs[peer];
        if (lens[peer] < BLOB_HDR_LEN || gcoll_get_u32(b) != BLOB_MAGIC ||
            b[4] != GCOLL_UCX_VERSION || lens[peer] < BLOB_HDR_LEN + BLOB_TAIL_LEN ||
            gcoll_get_u32(b + 16) != lens[peer] - BLOB_HDR_LEN - BLOB_TAIL_LEN) {
            gcoll_ucx_set_error(t,
                                "rank %d published a malformed ucx address (another "
                                "gcoll version or transport?)",
                                peer);
            return GCOLL_ERR_INVALID;
        }
        ucx_peer_t *p = &t->peers[peer];
        p->cookie = gcoll_get_u64(b + 8);
        cma_probe(t, peer, b + lens[peer] - BLOB_TAIL_LEN);
        gcoll_ucx_shm_attach(t, peer, b + lens[peer] - GCOLL_UCX_BLOB_SHM_LEN);
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLER,
                              .address = (const ucp_address_t *)(b + BLOB_HDR_LEN),
                              /* a dead peer fails its operations instead of hanging them */
                              .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                              .err_handler = {.cb = gcoll_ucx_ep_err_cb, .arg = p}};
        ucs_status_t s = ucp_ep_create(t->worker, &ep, &p->ep);
        if (s != UCS_OK) {
            p->ep = NULL;
            gcoll_ucx_set_error(t,
                                "ucx: cannot create an endpoint to rank %d: %s (no common "
                                "transport with error handling? check UCX_TLS)",
                                peer, ucs_status_string(s));
            return GCOLL_ERR_TRANSPORT;
        }
    }
    /* Round 1, hello: every endpoint carries a message both ways, so wire-up failures
     * surface here, within the deadline, with a clear message. Then every endpoint is
     * flushed so UCX's wire-up handshakes are finished too (a send on a half wired-up
     * endpoint may wait for the peer to progress, and an abort must not). Round 2, ready:
     * nobody leaves while a peer's flush may still need it to progress. */
    GCOLL_CHECK(connect_round(t, 1, deadline_ms));
    gcoll_ucx_shm_connected(t); /* every peer's hello came: those that map it have */
    for (int peer = 0; peer < t->size && !t->aborted; peer++)
        GCOLL_CHECK(flush_ep(t, peer, deadline_ms));
    if (!t->aborted) {
        GCOLL_CHECK(connect_round(t, 2, deadline_ms));
        t->shm_mesh = gcoll_ucx_shm_mesh_own(t);
        for (int peer = 0; peer < t->size; peer++)
            if (peer != t->rank)
                t->shm_mesh = GCOLL_MIN(t->shm_mesh, (size_t)t->peers[peer].shm_mesh);
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: mailbox mesh: %zu bytes", t->shm_mesh);
    }
    for (int peer = 0; peer < t->size; peer++)
        if (peer != t->rank)
            log_lanes(t->peers[peer].ep, peer);
    GCOLL_INFO(GCOLL_SUBSYS_NET, "ucx: connected to %d peer(s)", t->size - 1);
    return GCOLL_OK;
}
