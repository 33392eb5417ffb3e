/* hier.c: which host each rank is on (gethostname or GCOLL_HOSTNAME, exchanged once), the
 * GCOLL_HIER decision and its cost estimate, the child communicators of the hierarchical
 * allreduce (one per host, and one across hosts per local rank), and its requests (the
 * run itself: hier_run.c). */
#include "hier/hier.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/ops.h"
#include "compress/kernels.h"
#include "base/log.h"
#include "base/util.h"

void gcoll_hier_free(gcoll_hier_t *h)
{
    if (!h)
        return;
    free(h->host_of);
    free(h);
}

gcoll_status_t gcoll_hier_layout_from(gcoll_hier_t *h, const char *const *names, int size, int rank)
{
    memset(h, 0, sizeof(*h));
    int *first = calloc((size_t)size, sizeof(int)); /* first rank of each host */
    int *count = calloc((size_t)size, sizeof(int));
    h->host_of = malloc((size_t)size * sizeof(int));
    if (!first || !count || !h->host_of) {
        free(first);
        free(count);
        free(h->host_of);
        h->host_of = NULL;
        return GCOLL_ERR_NOMEM;
    }
    /* O(P * hosts) comparisons: 4096 ranks on 512 hosts is 2M short strcmp, once */
    for (int r = 0; r < size; r++) {
        int k = 0;
        while (k < h->nhosts && strcmp(names[first[k]], names[r]) != 0)
            k++;
        if (k == h->nhosts)
            first[h->nhosts++] = r;
        if (r == rank) {
            h->local_rank = count[k];
            h->host = k;
        }
        count[k]++;
        h->host_of[r] = k;
    }
    h->local_size = count[h->host];
    h->uniform = 1;
    int *cross = calloc((size_t)h->nhosts, sizeof(int));
    for (int k = 0; k < h->nhosts; k++) {
        if (count[k] > h->max_local)
            h->max_local = count[k];
        if (count[k] != count[0])
            h->uniform = 0;
    }
    if (cross) {
        for (int r = 0; r < size && size > 1; r++)
            if (h->host_of[r] != h->host_of[(r + 1) % size])
                cross[h->host_of[r]]++;
        for (int k = 0; k < h->nhosts; k++)
            if (cross[k] > h->ring_cross)
                h->ring_cross = cross[k];
    } else {
        h->ring_cross = 1;
    }
    snprintf(h->name, sizeof(h->name), "%s", names[rank]);
    free(cross);
    free(first);
    free(count);
    return GCOLL_OK;
}

gcoll_status_t gcoll_hier_layout(gcoll_comm_t *comm, gcoll_hier_t **h_p)
{
    if (comm->hier) {
        *h_p = comm->hier;
        return GCOLL_OK;
    }
    const int P = comm->size;
    char mine[GCOLL_HIER_HOSTLEN] = "";
    if (comm->cfg.coll.hostname && *comm->cfg.coll.hostname)
        snprintf(mine, sizeof(mine), "%s", comm->cfg.coll.hostname);
    else if (gethostname(mine, sizeof(mine) - 1) != 0)
        snprintf(mine, sizeof(mine), "localhost");
    mine[sizeof(mine) - 1] = '\0';
    char *all = calloc((size_t)P, GCOLL_HIER_HOSTLEN);
    const char **names = calloc((size_t)P, sizeof(*names));
    gcoll_hier_t *h = calloc(1, sizeof(*h));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!all || !names || !h)
        goto out;
    if (P > 1) {
        st = gcoll_allgather(comm, mine, all, GCOLL_HIER_HOSTLEN / 4, GCOLL_INT32);
        if (st != GCOLL_OK)
            goto out;
    } else {
        memcpy(all, mine, sizeof(mine));
    }
    for (int r = 0; r < P; r++) {
        names[r] = all + (size_t)r * GCOLL_HIER_HOSTLEN;
        all[(size_t)r * GCOLL_HIER_HOSTLEN + GCOLL_HIER_HOSTLEN - 1] = '\0';
    }
    if ((st = gcoll_hier_layout_from(h, names, P, comm->rank)) != GCOLL_OK)
        goto out;
    GCOLL_INFO(GCOLL_SUBSYS_INIT,
               "hosts: %d (this rank is local rank %d of %d on '%s'; %s, at most %d per "
               "host)",
               h->nhosts, h->local_rank, h->local_size, h->name,
               h->uniform ? "the same number on every host" : "uneven", h->max_local);
    comm->hier = h;
    *h_p = h;
    h = NULL;
out:
    gcoll_hier_free(h);
    free(names);
    free(all);
    return st;
}

/* ---------------------------------------------------------------------------------- */
/* The decision                                                                         */

void gcoll_hier_model_defaults(gcoll_hier_model_t *m, double probe_bw)
{
    memset(m, 0, sizeof(*m));
    m->bw_inter = probe_bw > 0 ? probe_bw : 1.25e9;
    m->bw_intra = 5e9;
    m->alpha_inter = 25e-6;
    m->alpha_intra = 5e-6;
    m->alpha_op = 30e-6;
    m->wire_ratio = 1.0;
}

/* Alpha-beta estimates (Thakur, Rabenseifner & Gropp 2005). Flat: the better of a ring,
 * whose busiest host link carries ring_cross of the ring's edges, each 2(P-1)/P of the
 * bytes, and a latency-bound tree (2 log2 P whole-vector steps). Hierarchical, uniform
 * hosts (Horovod's and NCCL's two-level scheme): reduce-scatter and allgather inside the
 * host, (L-1)/L of the bytes each rank each (a sparsifier's result as pairs), and L rings across
 * hosts on 1/L of the bytes, which share the host link: 2(H-1)/H of the bytes on it; uneven hosts:
 * allreduce and broadcast inside the host, one ring among the leaders. Codec time scales with the
 * elements each rank encodes (all of them flat, 1/L of them hierarchical). */
void gcoll_hier_estimate(const gcoll_hier_model_t *m, size_t bytes, double *flat_s, double *hier_s)
{
    const double P = m->size, H = m->nhosts, L = m->max_local > 0 ? m->max_local : 1;
    const double n = (double)bytes, wire = n * m->wire_ratio;
    double ring = 2 * (P - 1) * m->alpha_inter +
                  2 * (P - 1) / P * wire * (m->ring_cross > 0 ? m->ring_cross : 1) / m->bw_inter;
    double lg = P > 1 ? ceil(log2(P)) : 0;
    double tree = 2 * lg * (m->alpha_inter + wire / m->bw_inter);
    *flat_s = (ring < tree ? ring : tree) + n * m->encode_s_per_byte;
    double inter = 2 * (H - 1) * m->alpha_inter + 2 * (H - 1) / H * wire / m->bw_inter;
    double intra;
    if (m->uniform)
        intra = 4 * (L - 1) * m->alpha_intra +
                (L - 1) / L * n * (1 + (m->sparse_result ? m->wire_ratio : 1)) / m->bw_intra;
    else
        intra = 4 * (L - 1) * m->alpha_intra + 3 * n / m->bw_intra;
    double enc = (m->uniform ? n / L : n) * m->encode_s_per_byte;
    *hier_s = intra + inter + enc + 3 * m->alpha_op;
}

int gcoll_hier_decide(int mode, const gcoll_hier_model_t *m, size_t bytes, char *why, size_t len)
{
    char dummy[1];
    if (!why) {
        why = dummy;
        len = sizeof(dummy);
    }
    if (mode == 1) {
        snprintf(why, len, "GCOLL_HIER=0");
        return 0;
    }
    if (m->nhosts < 2) {
        snprintf(why, len, "all %d ranks are on one host", m->size);
        return 0;
    }
    if (m->nhosts == m->size) {
        snprintf(why, len, "every one of the %d hosts has one rank", m->nhosts);
        return 0;
    }
    if (mode == 2) {
        snprintf(why, len, "GCOLL_HIER=1 (%d hosts, at most %d ranks per host)", m->nhosts,
                 m->max_local);
        return 1;
    }
    double f, h;
    gcoll_hier_estimate(m, bytes, &f, &h);
    snprintf(why, len,
             "GCOLL_HIER=auto: %d hosts, at most %d ranks per host, estimate %.3g s "
             "hierarchical against %.3g s flat (host link %.3g Gbit/s)",
             m->nhosts, m->max_local, h, f, m->bw_inter * 8e-9);
    return h < f;
}

/* ---------------------------------------------------------------------------------- */
/* Children                                                                             */

/* The child communicators: every rank of comm takes part in both splits. */
static gcoll_status_t make_children(gcoll_comm_t *comm, gcoll_hier_t *h)
{
    gcoll_status_t st = gcoll_comm_split(comm, h->host, comm->rank, &h->local);
    if (st != GCOLL_OK)
        return st;
    int color = h->uniform ? h->local_rank : (h->local_rank == 0 ? 0 : GCOLL_SPLIT_NOCOLOR);
    st = gcoll_comm_split(comm, color, h->host, &h->rail);
    if (st != GCOLL_OK) { /* the next call starts again from nothing */
        gcoll_comm_abort(h->local);
        gcoll_comm_destroy(h->local);
        h->local = NULL;
        return st;
    }
    /* the children run their collectives flat (index 1 of "auto|0|1") */
    h->local->cfg.coll.hier = 1;
    if (h->rail)
        h->rail->cfg.coll.hier = 1;
    h->split = 1;
    GCOLL_INFO(GCOLL_SUBSYS_INIT,
               "hierarchy: a %d-rank communicator on this host and a %d-rank one across "
               "hosts (%s)",
               gcoll_comm_size(h->local), h->rail ? gcoll_comm_size(h->rail) : 0,
               h->uniform ? "one per local rank" : "the leaders");
    return GCOLL_OK;
}

gcoll_status_t gcoll_hier_use(gcoll_comm_t *comm, const char *what, size_t bytes, double wire_ratio,
                              double encode_s_per_byte, int sparse_result, int *use_p)
{
    *use_p = 0;
    /* GCOLL_HIER=0 costs nothing: no exchange, no children; nor does auto below
     * GCOLL_HIER_AUTO_MIN, where three child collectives cost more than a flat tree */
    /* a group's calls run flat: the hierarchy's own calls on the children cannot wait for
     * the group to end */
    if (comm->size < 3 || comm->cfg.coll.hier == 1 || comm->broken != GCOLL_OK ||
        gcoll_comm_in_group(comm) || (comm->cfg.coll.hier == 0 && bytes < GCOLL_HIER_AUTO_MIN))
        return GCOLL_OK;
    gcoll_hier_t *h;
    GCOLL_CHECK(gcoll_hier_layout(comm, &h));
    gcoll_hier_model_t m;
    gcoll_hier_model_defaults(&m, comm->probe_bw);
    m.size = comm->size;
    m.nhosts = h->nhosts;
    m.max_local = h->max_local;
    m.uniform = h->uniform;
    m.ring_cross = h->ring_cross;
    m.wire_ratio = wire_ratio;
    m.encode_s_per_byte = encode_s_per_byte;
    m.sparse_result = sparse_result;
    char why[256];
    int use = gcoll_hier_decide(comm->cfg.coll.hier, &m, bytes, why, sizeof(why));
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "%s of %zu bytes: %s, because %s", what, bytes,
               use ? "hierarchical" : "flat", why);
    if (use && !h->split) {
        gcoll_status_t st = make_children(comm, h);
        if (st != GCOLL_OK) {
            gcoll_comm_set_error(comm, "%s: cannot make the hierarchy's communicators: %s", what,
                                 gcoll_status_string(st));
            return st;
        }
    }
    *use_p = use;
    return GCOLL_OK;
}

void gcoll_hier_abort(gcoll_comm_t *comm)
{
    gcoll_hier_t *h = comm ? comm->hier : NULL;
    if (!h)
        return;
    if (h->local)
        gcoll_comm_abort(h->local);
    if (h->rail)
        gcoll_comm_abort(h->rail);
}

void gcoll_hier_release(gcoll_comm_t *comm)
{
    gcoll_hier_t *h = comm->hier;
    if (!h)
        return;
    /* a broken parent: its peers may never destroy their children */
    if (comm->broken != GCOLL_OK || comm->abort_requested)
        gcoll_hier_abort(comm);
    if (h->local)
        gcoll_comm_destroy(h->local);
    if (h->rail)
        gcoll_comm_destroy(h->rail);
    comm->hier = NULL;
    gcoll_hier_shm_free(h);
    gcoll_hier_free(h);
}

/* ---------------------------------------------------------------------------------- */
/* Requests                                                                             */

static void call_free(void *p)
{
    gcoll_hier_call_t *call = p;
    if (!call)
        return;
    free(call->idx);
    free(call->val);
    free(call);
}

static gcoll_status_t run_hier(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_hier_run(&ctx, req->a.ext);
}

/* Queues call (kind and pairs set; the arguments are copied in here). */
static gcoll_status_t submit(gcoll_comm_t *comm, const char *what, gcoll_hier_call_t *call,
                             const void *sendbuf, void *recvbuf, size_t count, gcoll_dtype_t dtype,
                             gcoll_op_t op, gcoll_request_t **req_p)
{
    call->sendbuf = sendbuf;
    call->recvbuf = recvbuf;
    call->count = count;
    call->dtype = dtype;
    call->op = op;
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .op = op,
                      .ext = call,
                      .release = call_free};
    return gcoll_op_submit(comm, what, run_hier, &a, req_p);
}

gcoll_status_t gcoll_hier_iallreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                     gcoll_request_t **req_p)
{
    gcoll_hier_call_t *call = calloc(1, sizeof(*call));
    if (!call)
        return GCOLL_ERR_NOMEM;
    call->kind = GCOLL_HIER_DENSE;
    return submit(comm, "gcoll_allreduce (hierarchical)", call, sendbuf, recvbuf, count, dtype, op,
                  req_p);
}

gcoll_status_t gcoll_hier_isparse(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                  size_t nnz, size_t dense_count, float *out, gcoll_op_t op,
                                  gcoll_request_t **req_p)
{
    gcoll_hier_call_t *call = calloc(1, sizeof(*call));
    if (!call)
        return GCOLL_ERR_NOMEM;
    call->kind = GCOLL_HIER_SPARSE;
    call->nnz = nnz;
    call->idx = malloc((nnz + 1) * sizeof(*call->idx));
    call->val = malloc((nnz + 1) * sizeof(*call->val));
    if (!call->idx || !call->val) {
        call_free(call);
        return GCOLL_ERR_NOMEM;
    }
    if (nnz) { /* a nonblocking caller may reuse its arrays at once */
        memcpy(call->idx, idx, nnz * sizeof(*idx));
        memcpy(call->val, val, nnz * sizeof(*val));
    }
    return submit(comm, "gcoll_sparse_allreduce (hierarchical)", call, NULL, out, dense_count,
                  GCOLL_FLOAT32, op, req_p);
}

gcoll_status_t gcoll_hier_icompressed(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                      const float *grad, float *out, size_t count, gcoll_op_t op,
                                      gcoll_request_t **req_p)
{
    /* NaN/Inf is this caller's error before anything is queued (the flat form's rule for
     * a nonblocking call, here for both) */
    size_t bad = count ? gcoll_kernels()->first_bad(grad, count) : 0;
    GCOLL_CHECK(gcoll_comm_check_args(comm, "gcoll_compressed_allreduce", bad >= count,
                                      "grad[%zu] is NaN or infinite", bad));
    gcoll_hier_call_t *call = calloc(1, sizeof(*call));
    if (!call)
        return GCOLL_ERR_NOMEM;
    call->kind = GCOLL_HIER_COMPRESSED;
    call->state = state;
    return submit(comm, "gcoll_compressed_allreduce (hierarchical)", call, grad, out, count,
                  GCOLL_FLOAT32, op, req_p);
}

/* ---------------------------------------------------------------------------------- */
/* Public queries                                                                       */

gcoll_status_t gcoll_comm_host_info(gcoll_comm_t *comm, gcoll_host_info_t *info_p)
{
    if (!comm || !info_p)
        return GCOLL_ERR_INVALID;
    gcoll_hier_t *h;
    GCOLL_CHECK(gcoll_hier_layout(comm, &h));
    info_p->host_count = h->nhosts;
    info_p->host_index = h->host;
    info_p->local_rank = h->local_rank;
    info_p->local_size = h->local_size;
    return GCOLL_OK;
}

int gcoll_comm_local_rank(gcoll_comm_t *comm)
{
    gcoll_host_info_t i;
    return gcoll_comm_host_info(comm, &i) == GCOLL_OK ? i.local_rank : -1;
}

int gcoll_comm_local_size(gcoll_comm_t *comm)
{
    gcoll_host_info_t i;
    return gcoll_comm_host_info(comm, &i) == GCOLL_OK ? i.local_size : -1;
}

int gcoll_comm_host_count(gcoll_comm_t *comm)
{
    gcoll_host_info_t i;
    return gcoll_comm_host_info(comm, &i) == GCOLL_OK ? i.host_count : -1;
}
