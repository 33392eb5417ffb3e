/* verbs.c: the InfiniBand/RoCE verbs transport's ops table, error reporting, completion
 * status mapping and peer failure. Setup is in verbs_setup.c and verbs_connect.c, posting
 * in verbs_p2p.c, completions and progress in verbs_cq.c, the registration cache in
 * verbs_reg.c (docs/verbs.md describes the protocol). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

void gcoll_vb_set_error(gcoll_transport_t *t, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (t->errmsg[0] == '\0')
        snprintf(t->errmsg, sizeof(t->errmsg), "%s", msg);
}

void gcoll_vb_complete(gcoll_treq_t *req, gcoll_status_t st)
{
    if (!req || req->done)
        return;
    req->status = st;
    req->done = 1;
}

void gcoll_vb_match_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st)
{
    (void)ctx;
    gcoll_vb_complete(req, st);
}

/* How each work-completion status reaches the collectives. A peer that stopped answering
 * (retries exhausted) is GCOLL_ERR_PEER; a local protection, length or QP-state error
 * means gcoll posted something wrong (GCOLL_ERR_INTERNAL); the rest are failures of the
 * fabric or the remote side (GCOLL_ERR_TRANSPORT). */
static const struct {
    const char *name;
    gcoll_status_t st;
} wc_table[] = {
    [IBV_WC_SUCCESS] = {"IBV_WC_SUCCESS", GCOLL_OK},
    [IBV_WC_LOC_LEN_ERR] = {"IBV_WC_LOC_LEN_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_LOC_QP_OP_ERR] = {"IBV_WC_LOC_QP_OP_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_LOC_EEC_OP_ERR] = {"IBV_WC_LOC_EEC_OP_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_LOC_PROT_ERR] = {"IBV_WC_LOC_PROT_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_WR_FLUSH_ERR] = {"IBV_WC_WR_FLUSH_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_MW_BIND_ERR] = {"IBV_WC_MW_BIND_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_BAD_RESP_ERR] = {"IBV_WC_BAD_RESP_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_LOC_ACCESS_ERR] = {"IBV_WC_LOC_ACCESS_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_REM_INV_REQ_ERR] = {"IBV_WC_REM_INV_REQ_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_REM_ACCESS_ERR] = {"IBV_WC_REM_ACCESS_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_REM_OP_ERR] = {"IBV_WC_REM_OP_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_RETRY_EXC_ERR] = {"IBV_WC_RETRY_EXC_ERR", GCOLL_ERR_PEER},
    [IBV_WC_RNR_RETRY_EXC_ERR] = {"IBV_WC_RNR_RETRY_EXC_ERR", GCOLL_ERR_PEER},
    [IBV_WC_LOC_RDD_VIOL_ERR] = {"IBV_WC_LOC_RDD_VIOL_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_REM_INV_RD_REQ_ERR] = {"IBV_WC_REM_INV_RD_REQ_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_REM_ABORT_ERR] = {"IBV_WC_REM_ABORT_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_INV_EECN_ERR] = {"IBV_WC_INV_EECN_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_INV_EEC_STATE_ERR] = {"IBV_WC_INV_EEC_STATE_ERR", GCOLL_ERR_INTERNAL},
    [IBV_WC_FATAL_ERR] = {"IBV_WC_FATAL_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_RESP_TIMEOUT_ERR] = {"IBV_WC_RESP_TIMEOUT_ERR", GCOLL_ERR_PEER},
    [IBV_WC_GENERAL_ERR] = {"IBV_WC_GENERAL_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_TM_ERR] = {"IBV_WC_TM_ERR", GCOLL_ERR_TRANSPORT},
    [IBV_WC_TM_RNDV_INCOMPLETE] = {"IBV_WC_TM_RNDV_INCOMPLETE", GCOLL_ERR_TRANSPORT},
};

gcoll_status_t gcoll_vb_wc_status(enum ibv_wc_status s)
{
    if ((size_t)s >= GCOLL_ARRAY_SIZE(wc_table) || !wc_table[s].name)
        return GCOLL_ERR_TRANSPORT; /* a status newer than this build */
    return wc_table[s].st;
}

const char *gcoll_vb_wc_name(enum ibv_wc_status s)
{
    if ((size_t)s >= GCOLL_ARRAY_SIZE(wc_table) || !wc_table[s].name)
        return "IBV_WC_(unknown)";
    return wc_table[s].name;
}

/* Fails everything pending with this peer; later posts to it fail at once. The messages
 * it sent whole (eager) stay for their receives, as on tcp and ucx: the failure is the
 * peer's, not its earlier messages'; rendezvous offers go (their data is on the peer). The QPs go
 * to the error state before any request the adapter may be reading or writing for it completes. */
void gcoll_vb_peer_fail(gcoll_transport_t *t, int peer, gcoll_status_t st)
{
    gcoll_vb_peer_t *p = &t->peers[peer];
    if (p->rx.failed)
        return;
    gcoll_match_fail(&p->rx, st, GCOLL_MATCH_KEEP_WHOLE);
    for (int q = 0; p->qps && q < t->nqp; q++) {
        if (!p->qps[q].qp)
            continue;
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
        if (t->ibv->modify_qp(p->qps[q].qp, &attr, IBV_QP_STATE) != 0)
            GCOLL_DEBUG(GCOLL_SUBSYS_NET, "verbs: qp 0x%x to error state: %s", p->qps[q].qp->qp_num,
                        strerror(errno));
    }
    gcoll_vb_peer_release(t, p, st);
    if (p->fd >= 0) {
        if (t->epfd >= 0)
            epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        close(p->fd);
        p->fd = -1;
    }
}

static const char *verbs_last_error(gcoll_transport_t *t)
{
    return t->errmsg;
}

static gcoll_status_t verbs_mem_reg(gcoll_transport_t *t, void *buf, size_t len, void **handle_p)
{
    gcoll_vb_reg_t *r = NULL;
    char err[256];
    if (len == 0) {
        *handle_p = NULL;
        return GCOLL_OK;
    }
    gcoll_status_t st = gcoll_vb_reg_acquire(&t->reg, buf, len, 1, &r, err, sizeof(err));
    if (st != GCOLL_OK) {
        gcoll_vb_set_error(t, "verbs: %s", err);
        return st;
    }
    *handle_p = r;
    return GCOLL_OK;
}

static void verbs_mem_dereg(gcoll_transport_t *t, void *handle)
{
    gcoll_vb_reg_t *r = handle;
    if (!r)
        return;
    /* Cached registrations of the same pages go too: the caller is about to free them. */
    gcoll_vb_reg_invalidate(&t->reg, (void *)r->start, r->end - r->start);
    gcoll_vb_reg_release(&t->reg, r);
}

const gcoll_transport_ops_t gcoll_verbs_ops = {
    .size = sizeof(gcoll_transport_ops_t),
    .name = "verbs",
    .probe = gcoll_vb_probe,
    .create = gcoll_vb_create,
    .address = gcoll_vb_address,
    .connect = gcoll_vb_connect,
    .isend = gcoll_vb_isend,
    .irecv = gcoll_vb_irecv,
    .progress = gcoll_vb_progress,
    .cancel = gcoll_vb_cancel,
    .abort = gcoll_vb_abort,
    .last_error = verbs_last_error,
    .mem_reg = verbs_mem_reg,
    .mem_dereg = verbs_mem_dereg,
    .destroy = gcoll_vb_destroy,
    .peek = gcoll_vb_peek,
};
