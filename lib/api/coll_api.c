/* coll_api.c: public entry points of the dense collectives: argument checks, then a queued
 * request whose run function builds the algorithms' context from the communicator and
 * calls the algorithm. */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "core/ops.h"
#include "api/checks.h"
#include "core/comm.h"
#include "collectives/compressed/compressed.h"
#include "hier/hier.h"
#include "collectives/reduce.h"
#include "base/util.h"

static int dtype_ok(gcoll_dtype_t d)
{
    return d >= GCOLL_FLOAT32 && d <= GCOLL_FLOAT8_E5M2;
}

/* A known op that the kernels can apply to dtype (checked after dtype_ok). */
gcoll_status_t gcoll_api_check_op(gcoll_comm_t *comm, const char *what, gcoll_dtype_t dtype,
                                  gcoll_op_t op)
{
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, op >= GCOLL_SUM && op <= GCOLL_BXOR,
                                      "unknown op %d", (int)op));
    const char *why = gcoll_reduce_check(dtype, op);
    return gcoll_comm_check_args(comm, what, why == NULL, "op %s on dtype %s: %s",
                                 gcoll_op_name(op), gcoll_dtype_name(dtype), why ? why : "");
}

/* Common checks; count elements of dtype must fit in memory. */
gcoll_status_t gcoll_api_check_common(gcoll_comm_t *comm, const char *what, size_t count,
                                      gcoll_dtype_t dtype)
{
    if (!comm) {
        GCOLL_WARN("%s: NULL communicator", what);
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, dtype_ok(dtype), "unknown dtype %d", (int)dtype));
    size_t bytes;
    return gcoll_comm_check_args(comm, what,
                                 gcoll_mul_size(count, gcoll_dtype_size(dtype), &bytes) == 0 &&
                                     bytes < ((size_t)1 << 62),
                                 "count %zu is too large", count);
}

gcoll_status_t gcoll_api_check_rank(gcoll_comm_t *comm, const char *what, const char *role, int r)
{
    return gcoll_comm_check_args(comm, what, r >= 0 && r < comm->size,
                                 "%s %d is not a rank of this %d-rank communicator", role, r,
                                 comm->size);
}

gcoll_status_t gcoll_iallreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                gcoll_request_t **req_p)
{
    const char *what = "gcoll_allreduce";
    GCOLL_CHECK(gcoll_api_check_common(comm, what, count, dtype));
    GCOLL_CHECK(gcoll_api_check_op(comm, what, dtype, op));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || (sendbuf && recvbuf),
                                      "NULL buffer with count %zu", count));
    return gcoll_op_iallreduce(comm, what, sendbuf, recvbuf, count, dtype, op, req_p);
}

gcoll_status_t gcoll_allreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                               gcoll_dtype_t dtype, gcoll_op_t op)
{
    return gcoll_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

static gcoll_status_t run_broadcast(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    size_t bytes = a->count * gcoll_dtype_size(a->dtype);
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_BROADCAST, a->count, a->dtype, 0, a->root);
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    GCOLL_CHECK(gcoll_bcast_run(&ctx, a->recvbuf, bytes, a->root, sig, 0));
    ctx.ch->counters.bytes_raw += bytes;
    return GCOLL_OK;
}

gcoll_status_t gcoll_ibroadcast(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                                int root, gcoll_request_t **req_p)
{
    const char *what = "gcoll_broadcast";
    GCOLL_CHECK(gcoll_api_check_common(comm, what, count, dtype));
    GCOLL_CHECK(gcoll_api_check_rank(comm, what, "root", root));
    GCOLL_CHECK(
        gcoll_comm_check_args(comm, what, count == 0 || buf, "NULL buffer with count %zu", count));
    gcoll_args_t a = {.recvbuf = buf, .count = count, .dtype = dtype, .root = root};
    return gcoll_op_submit(comm, what, run_broadcast, &a, req_p);
}

gcoll_status_t gcoll_broadcast(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                               int root)
{
    return gcoll_ibroadcast(comm, buf, count, dtype, root, NULL);
}

static gcoll_status_t run_barrier(gcoll_comm_t *comm, gcoll_request_t *req)
{
    (void)req;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_barrier_run(&ctx, gcoll_call_sig(GCOLL_KIND_BARRIER, 0, 0, 0, 0));
}

gcoll_status_t gcoll_ibarrier(gcoll_comm_t *comm, gcoll_request_t **req_p)
{
    if (!comm) {
        GCOLL_WARN("gcoll_barrier: NULL communicator");
        return GCOLL_ERR_INVALID;
    }
    gcoll_args_t a = {0};
    return gcoll_op_submit(comm, "gcoll_barrier", run_barrier, &a, req_p);
}

gcoll_status_t gcoll_barrier(gcoll_comm_t *comm)
{
    return gcoll_ibarrier(comm, NULL);
}

/* ---- allgather(v), reduce-scatter, alltoall(v) (their plans: gather.c) ----------- */

/* Arrays of per-rank counts and displacements, copied so nonblocking callers may reuse
 * theirs at once. */
/* Checks shared by every entry point here. */
static gcoll_status_t check_base(gcoll_comm_t *comm, const char *what, gcoll_dtype_t dtype)
{
    if (!comm) {
        GCOLL_WARN("%s: NULL communicator", what);
        return GCOLL_ERR_INVALID;
    }
    return gcoll_comm_check_args(comm, what, dtype_ok(dtype), "unknown dtype %d", (int)dtype);
}

/* Bytes of count elements, or an error if that overflows. */
static gcoll_status_t check_bytes(gcoll_comm_t *comm, const char *what, size_t count, size_t esz,
                                  size_t mult)
{
    size_t b;
    int ok = gcoll_mul_size(count, esz, &b) == 0 && gcoll_mul_size(b, mult, &b) == 0 &&
             b < ((size_t)1 << 62);
    return gcoll_comm_check_args(comm, what, ok, "count %zu is too large", count);
}

/* ---- allgather(v) ---------------------------------------------------------------- */

static gcoll_status_t allgatherv(gcoll_comm_t *comm, const char *what, int kind,
                                 const void *sendbuf, size_t sendcount, void *recvbuf,
                                 const size_t *recvcounts, const size_t *displs,
                                 gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_base(comm, what, dtype));
    const int P = comm->size;
    GCOLL_CHECK(
        gcoll_comm_check_args(comm, what, recvcounts && displs, "NULL recvcounts or displs"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, recvcounts[comm->rank] == sendcount,
                                      "sendcount %zu differs from recvcounts[%d] = %zu", sendcount,
                                      comm->rank, recvcounts[comm->rank]));
    size_t total = 0, esz = gcoll_dtype_size(dtype);
    for (int i = 0; i < P; i++) {
        GCOLL_CHECK(check_bytes(comm, what, recvcounts[i] + displs[i], esz, 1));
        total += recvcounts[i];
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what,
                                      (sendcount == 0 || sendbuf) && (total == 0 || recvbuf),
                                      "NULL buffer with a non-zero count"));
    /* Blocks must not overlap, or the ring would overwrite data it still forwards. */
    for (int i = 0; i < P; i++)
        for (int j = i + 1; j < P; j++)
            GCOLL_CHECK(gcoll_comm_check_args(comm, what,
                                              !recvcounts[i] || !recvcounts[j] ||
                                                  displs[i] + recvcounts[i] <= displs[j] ||
                                                  displs[j] + recvcounts[j] <= displs[i],
                                              "blocks of ranks %d and %d overlap", i, j));
    return gcoll_op_iallgatherv(comm, what, kind, sendbuf, sendcount, recvbuf, recvcounts, displs,
                                dtype, req_p);
}

gcoll_status_t gcoll_iallgatherv(gcoll_comm_t *comm, const void *sendbuf, size_t sendcount,
                                 void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                 gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    return allgatherv(comm, "gcoll_allgatherv", GCOLL_KIND_ALLGATHERV, sendbuf, sendcount, recvbuf,
                      recvcounts, displs, dtype, req_p);
}

gcoll_status_t gcoll_allgatherv(gcoll_comm_t *comm, const void *sendbuf, size_t sendcount,
                                void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                gcoll_dtype_t dtype)
{
    return gcoll_iallgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, NULL);
}

gcoll_status_t gcoll_iallgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t sendcount, gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    const char *what = "gcoll_allgather";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(check_bytes(comm, what, sendcount, gcoll_dtype_size(dtype), (size_t)comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendcount == 0 || (sendbuf && recvbuf),
                                      "NULL buffer with a non-zero count"));
    return gcoll_op_iallgather(comm, what, sendbuf, recvbuf, sendcount, dtype, req_p);
}

gcoll_status_t gcoll_allgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t sendcount, gcoll_dtype_t dtype)
{
    return gcoll_iallgather(comm, sendbuf, recvbuf, sendcount, dtype, NULL);
}

/* ---- reduce-scatter ---------------------------------------------------------------- */

static gcoll_status_t run_reduce_scatter(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_reduce_scatter_run(&ctx, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op);
}

gcoll_status_t gcoll_ireduce_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, gcoll_dtype_t dtype, gcoll_op_t op,
                                     gcoll_request_t **req_p)
{
    const char *what = "gcoll_reduce_scatter";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(gcoll_api_check_op(comm, what, dtype, op));
    GCOLL_CHECK(check_bytes(comm, what, recvcount, gcoll_dtype_size(dtype), (size_t)comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, recvcount == 0 || (sendbuf && recvbuf),
                                      "NULL buffer with count %zu", recvcount));
    gcoll_args_t a = {
        .sendbuf = sendbuf, .recvbuf = recvbuf, .count = recvcount, .dtype = dtype, .op = op};
    return gcoll_op_submit(comm, what, run_reduce_scatter, &a, req_p);
}

gcoll_status_t gcoll_reduce_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, gcoll_dtype_t dtype, gcoll_op_t op)
{
    return gcoll_ireduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op, NULL);
}

/* ---- alltoall(v) ------------------------------------------------------------------- */

static gcoll_status_t run_alltoallv(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const gcoll_vargs_t *v = a->ext;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_alltoallv_run(&ctx, a->sendbuf, v->scounts, v->sdispls, a->recvbuf, v->rcounts,
                               v->rdispls, a->dtype, a->kind);
}

static gcoll_status_t alltoallv(gcoll_comm_t *comm, const char *what, int kind, const void *sendbuf,
                                const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                const size_t *recvcounts, const size_t *rdispls,
                                gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendcounts && sdispls && recvcounts && rdispls,
                                      "NULL count or displacement array"));
    size_t esz = gcoll_dtype_size(dtype), stot = 0, rtot = 0;
    for (int i = 0; i < comm->size; i++) {
        GCOLL_CHECK(check_bytes(comm, what, sendcounts[i] + sdispls[i], esz, 1));
        GCOLL_CHECK(check_bytes(comm, what, recvcounts[i] + rdispls[i], esz, 1));
        stot += sendcounts[i];
        rtot += recvcounts[i];
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, (stot == 0 || sendbuf) && (rtot == 0 || recvbuf),
                                      "NULL buffer with a non-zero count"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendcounts[comm->rank] == recvcounts[comm->rank],
                                      "sendcounts[%d] = %zu but recvcounts[%d] = %zu", comm->rank,
                                      sendcounts[comm->rank], comm->rank, recvcounts[comm->rank]));
    gcoll_vargs_t *v = gcoll_vargs_new(comm->size, recvcounts, rdispls, sendcounts, sdispls);
    if (!v)
        return GCOLL_ERR_NOMEM;
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .dtype = dtype,
                      .kind = kind,
                      .ext = v,
                      .release = free};
    return gcoll_op_submit(comm, what, run_alltoallv, &a, req_p);
}

gcoll_status_t gcoll_ialltoallv(gcoll_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    return alltoallv(comm, "gcoll_alltoallv", GCOLL_KIND_ALLTOALLV, sendbuf, sendcounts, sdispls,
                     recvbuf, recvcounts, rdispls, dtype, req_p);
}

gcoll_status_t gcoll_alltoallv(gcoll_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, gcoll_dtype_t dtype)
{
    return gcoll_ialltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype,
                            NULL);
}

gcoll_status_t gcoll_ialltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t count_per_rank, gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    const char *what = "gcoll_alltoall";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(
        check_bytes(comm, what, count_per_rank, gcoll_dtype_size(dtype), (size_t)comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendbuf != recvbuf || count_per_rank == 0,
                                      "in-place alltoall is not supported"));
    size_t *tab = malloc(2 * (size_t)comm->size * sizeof(size_t));
    if (!tab)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < comm->size; i++) {
        tab[i] = count_per_rank;
        tab[comm->size + i] = (size_t)i * count_per_rank;
    }
    /* a rank passing another count sends messages of another length: a mismatch */
    gcoll_status_t st = alltoallv(comm, what, GCOLL_KIND_ALLTOALL, sendbuf, tab, tab + comm->size,
                                  recvbuf, tab, tab + comm->size, dtype, req_p);
    free(tab);
    return st;
}

gcoll_status_t gcoll_alltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                              size_t count_per_rank, gcoll_dtype_t dtype)
{
    return gcoll_ialltoall(comm, sendbuf, recvbuf, count_per_rank, dtype, NULL);
}
