/* sparse_api.c: entry points of the sparse allreduce: argument checks in the caller's
 * thread, then a queued request that sorts, encodes and runs the sparse engine. */
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/ops.h"
#include "compress/kernels.h"
#include "hier/hier.h"
#include "collectives/sparse.h"
#include "base/util.h"
#include "api/sparse_api.h"

typedef struct {
    uint32_t *idx;
    float *val;
    size_t nnz;
    unsigned flags;
} sparse_args_t;

static void sparse_args_free(void *p)
{
    sparse_args_t *a = p;
    if (a) {
        free(a->idx);
        free(a->val);
        free(a);
    }
}

static gcoll_status_t run_sparse(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const sparse_args_t *sa = a->ext;
    gcoll_pairs_t pairs;
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK(gcoll_sparse_prepare(sa->idx, sa->val, sa->nnz, &pairs));
    /* the wire count is wrong only in tests of a misbehaving peer */
    size_t wire_count = (sa->flags & GCOLL_SPARSE_BADCOUNT) ? a->count + 1000 : a->count;
    size_t cap = gcoll_codec_pairs_bound(NULL, pairs.n, wire_count), len = 0;
    uint8_t *msg = malloc(cap + 1);
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (msg)
        st = gcoll_codec_encode_pairs(NULL, pairs.idx, pairs.val, pairs.n, wire_count, msg, cap,
                                      &len);
    comm->chan.counters.ns_compress += gcoll_time_ns() - t0;
    if (st == GCOLL_OK) {
        gcoll_sparse_call_t call = {.pairs = &pairs,
                                    .msg = msg,
                                    .msglen = len,
                                    .count = a->count,
                                    .out = a->recvbuf,
                                    .op = a->op,
                                    .kind = GCOLL_KIND_SPARSE};
        gcoll_coll_t ctx = gcoll_comm_coll(comm);
        st = gcoll_sparse_run(&ctx, &call, NULL);
        comm->chan.counters.bytes_raw += a->count * sizeof(float);
    }
    free(msg);
    gcoll_pairs_free(&pairs);
    return st;
}

gcoll_status_t gcoll_sparse_submit(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                   size_t nnz, size_t dense_count, float *out, gcoll_op_t op,
                                   unsigned flags, gcoll_request_t **req_p)
{
    const char *what = "gcoll_sparse_allreduce";
    if (!comm) {
        GCOLL_WARN("%s: NULL communicator", what);
        return GCOLL_ERR_INVALID;
    }
    if (!(flags & GCOLL_SPARSE_NOCHECK)) {
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, op == GCOLL_SUM || op == GCOLL_AVG,
                                          "op %s: only sum and avg are defined for sparse data",
                                          gcoll_op_name(op)));
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, nnz == 0 || (idx && val),
                                          "NULL idx or val with nnz %zu", nnz));
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, dense_count == 0 || out,
                                          "NULL out with dense_count %zu", dense_count));
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, dense_count <= (size_t)UINT32_MAX + 1,
                                          "dense_count %zu does not fit 32-bit indices",
                                          dense_count));
        /* plain loops; the error path names the first offender */
        size_t i = 0;
        while (i < nnz && idx[i] < dense_count)
            i++;
        GCOLL_CHECK(gcoll_comm_check_args(comm, what, i == nnz,
                                          "idx[%zu] = %u is not below dense_count %zu", i,
                                          i < nnz ? idx[i] : 0, dense_count));
        size_t bad = nnz ? gcoll_kernels()->first_bad(val, nnz) : 0;
        GCOLL_CHECK(
            gcoll_comm_check_args(comm, what, bad >= nnz, "val[%zu] is NaN or infinite", bad));
    }
    if (!(flags & GCOLL_SPARSE_NOCHECK)) {
        int hier = 0; /* the wire carries about the pairs (8 bytes each) of every rank */
        double ratio = dense_count ? 2.0 * (double)nnz / (double)dense_count : 0;
        GCOLL_CHECK(gcoll_hier_use(comm, what, dense_count * sizeof(float), ratio, 0, 1, &hier));
        if (hier)
            return gcoll_hier_isparse(comm, idx, val, nnz, dense_count, out, op, req_p);
    }
    /* inputs are copied: a nonblocking caller may reuse them at once */
    sparse_args_t *sa = calloc(1, sizeof(*sa));
    if (!sa)
        return GCOLL_ERR_NOMEM;
    sa->idx = malloc((nnz + 1) * sizeof(uint32_t));
    sa->val = malloc((nnz + 1) * sizeof(float));
    sa->nnz = nnz;
    sa->flags = flags;
    if (!sa->idx || !sa->val) {
        sparse_args_free(sa);
        return GCOLL_ERR_NOMEM;
    }
    if (nnz) {
        memcpy(sa->idx, idx, nnz * sizeof(uint32_t));
        memcpy(sa->val, val, nnz * sizeof(float));
    }
    gcoll_args_t a = {.recvbuf = out,
                      .count = dense_count,
                      .dtype = GCOLL_FLOAT32,
                      .op = op,
                      .ext = sa,
                      .release = sparse_args_free};
    return gcoll_op_submit(comm, what, run_sparse, &a, req_p);
}

gcoll_status_t gcoll_isparse_allreduce(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                       size_t nnz, size_t dense_count, float *out, gcoll_op_t op,
                                       gcoll_request_t **req_p)
{
    return gcoll_sparse_submit(comm, idx, val, nnz, dense_count, out, op, 0, req_p);
}

gcoll_status_t gcoll_sparse_allreduce(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                      size_t nnz, size_t dense_count, float *out, gcoll_op_t op)
{
    return gcoll_sparse_submit(comm, idx, val, nnz, dense_count, out, op, 0, NULL);
}
