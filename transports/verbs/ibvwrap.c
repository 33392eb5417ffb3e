/* ibvwrap.c: loads libibverbs.so.1 with dlopen so one libgcoll runs where rdma-core is
 * absent, and routes every verb through gcoll_ibv_ops_t (the seam unit tests fake). */
#include "transports/verbs/ibvwrap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static gcoll_ibv_ops_t real_ops;
static char load_error[256];
static int load_ok;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const gcoll_ibv_ops_t *override_ops;

/* The library's compat entry point behind the query_port macro of <infiniband/verbs.h>. */
static int (*compat_query_port)(struct ibv_context *, uint8_t, void *);

/* Data-path verbs are static inlines in the header that dispatch through the provider's
 * ops in the context: no library symbol is involved, so they can be wrapped directly. */
static int real_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    return ibv_poll_cq(cq, n, wc);
}

static int real_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return ibv_req_notify_cq(cq, solicited_only);
}

static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return ibv_post_send(qp, wr, bad);
}

static int real_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return ibv_post_recv(qp, wr, bad);
}

/* As the header's inline: the extended query (which fills every field) when the provider
 * has one, else the compat symbol on a zeroed struct. */
static int real_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx)
        return vctx->query_port(ctx, port, attr, sizeof(*attr));
    memset(attr, 0, sizeof(*attr));
    return compat_query_port(ctx, port, attr);
}

static void load(void)
{
    const char *names[] = {"libibverbs.so.1", "libibverbs.so"};
    void *h = NULL;
    char first[160] = "";
    for (size_t i = 0; i < 2 && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && i == 0)
            snprintf(first, sizeof(first), "%s", dlerror());
    }
    if (!h) {
        snprintf(load_error, sizeof(load_error),
                 "libibverbs.so.1 not found (install rdma-core's libibverbs1): %s", first);
        return;
    }
    /* Required symbols: a missing one means an rdma-core too old or broken to use. */
#define SYM(field, name)                                                                           \
    do {                                                                                           \
        void *p_ = dlsym(h, name);                                                                 \
        if (!p_) {                                                                                 \
            snprintf(load_error, sizeof(load_error), "libibverbs.so.1 lacks %s", name);            \
            dlclose(h);                                                                            \
            return;                                                                                \
        }                                                                                          \
        memcpy(&(field), &p_, sizeof(p_));                                                         \
    } while (0)
    SYM(real_ops.get_device_list, "ibv_get_device_list");
    SYM(real_ops.free_device_list, "ibv_free_device_list");
    SYM(real_ops.get_device_name, "ibv_get_device_name");
    SYM(real_ops.open_device, "ibv_open_device");
    SYM(real_ops.close_device, "ibv_close_device");
    SYM(real_ops.query_device, "ibv_query_device");
    SYM(compat_query_port, "ibv_query_port");
    SYM(real_ops.query_gid, "ibv_query_gid");
    SYM(real_ops.alloc_pd, "ibv_alloc_pd");
    SYM(real_ops.dealloc_pd, "ibv_dealloc_pd");
    SYM(real_ops.reg_mr, "ibv_reg_mr");
    SYM(real_ops.dereg_mr, "ibv_dereg_mr");
    SYM(real_ops.create_comp_channel, "ibv_create_comp_channel");
    SYM(real_ops.destroy_comp_channel, "ibv_destroy_comp_channel");
    SYM(real_ops.create_cq, "ibv_create_cq");
    SYM(real_ops.destroy_cq, "ibv_destroy_cq");
    SYM(real_ops.get_cq_event, "ibv_get_cq_event");
    SYM(real_ops.ack_cq_events, "ibv_ack_cq_events");
    SYM(real_ops.create_qp, "ibv_create_qp");
    SYM(real_ops.modify_qp, "ibv_modify_qp");
    SYM(real_ops.destroy_qp, "ibv_destroy_qp");
    SYM(real_ops.wc_status_str, "ibv_wc_status_str");
#undef SYM
    real_ops.query_port = real_query_port;
    real_ops.poll_cq = real_poll_cq;
    real_ops.req_notify_cq = real_req_notify_cq;
    real_ops.post_send = real_post_send;
    real_ops.post_recv = real_post_recv;
    load_ok = 1; /* the handle stays open for the life of the process */
}

gcoll_status_t gcoll_ibv_get(const gcoll_ibv_ops_t **ops_p, char *why, size_t whylen)
{
    if (override_ops) {
        *ops_p = override_ops;
        return GCOLL_OK;
    }
    pthread_once(&load_once, load);
    if (!load_ok) {
        if (why && whylen)
            snprintf(why, whylen, "%s", load_error);
        return GCOLL_ERR_UNSUPPORTED;
    }
    *ops_p = &real_ops;
    return GCOLL_OK;
}

void gcoll_ibv_override(const gcoll_ibv_ops_t *ops)
{
    override_ops = ops;
}
