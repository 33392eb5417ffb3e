/* api.c: public entry points of the dense collectives: argument checks, then a queued
 * request whose run function calls the algorithm. */
#include <string.h>

#include "coll.h"
#include "hier.h"
#include "reduce.h"
#include "util.h"

static int dtype_ok(gcoll_dtype_t d) { return d >= GCOLL_FLOAT32 && d <= GCOLL_INT64; }
static int op_ok(gcoll_op_t o) { return o >= GCOLL_SUM && o <= GCOLL_PROD; }

/* Common checks; count elements of dtype must fit in memory. */
static gcoll_status_t check_common(gcoll_comm_t *comm, const char *what, size_t count,
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

static gcoll_status_t run_allreduce(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    size_t bytes = a->count * gcoll_dtype_size(a->dtype);
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, a->count, a->dtype, a->op, 0);
    char why[256];
    why[0] = '\0';
    /* the reason is formatted only when it is logged: a microsecond of a 5 us allreduce;
     * the choice for the last size is kept (the cost model was 5% of an 8-byte
     * allreduce's profile on shared memory) */
    gcoll_algo_t algo;
    if (GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_COLL)) {
        algo = gcoll_algo_select(comm, bytes, why, sizeof(why));
    } else if (comm->algo_memo >= 0 && comm->algo_memo_bytes == bytes) {
        algo = (gcoll_algo_t)comm->algo_memo;
    } else {
        algo = gcoll_algo_select(comm, bytes, NULL, 0);
        comm->algo_memo = (int)algo;
        comm->algo_memo_bytes = bytes;
    }
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "allreduce of %zu bytes (%s %s): %s, because %s", bytes,
               gcoll_dtype_name(a->dtype), gcoll_op_name(a->op), gcoll_algo_names[algo], why);
    /* The ring reads sendbuf itself (its first reduction writes recvbuf); the others work
     * in place, on a copy. */
    if (a->sendbuf != a->recvbuf && bytes && algo != GCOLL_ALGO_RING)
        memcpy(a->recvbuf, a->sendbuf, bytes);
    switch (algo) {
    case GCOLL_ALGO_RHD:
        GCOLL_CHECK(gcoll_rhd_allreduce(comm, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    case GCOLL_ALGO_TREE:
        GCOLL_CHECK(gcoll_tree_allreduce(comm, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    case GCOLL_ALGO_RD:
        GCOLL_CHECK(gcoll_rd_allreduce(comm, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    default:
        GCOLL_CHECK(gcoll_ring_allreduce_oop(comm, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                             a->op, sig));
        break;
    }
    gcoll_reduce_finish(a->recvbuf, a->count, a->dtype, a->op, comm->size);
    comm->chan.counters.bytes_raw += bytes;
    return GCOLL_OK;
}

gcoll_status_t gcoll_iallreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                gcoll_request_t **req_p)
{
    const char *what = "gcoll_allreduce";
    GCOLL_CHECK(check_common(comm, what, count, dtype));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, op_ok(op), "unknown op %d", (int)op));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || (sendbuf && recvbuf),
                                      "NULL buffer with count %zu", count));
    int hier = 0;
    GCOLL_CHECK(gcoll_hier_use(comm, what, count * gcoll_dtype_size(dtype), 1.0, 0.0, 0, &hier));
    if (hier)
        return gcoll_hier_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, req_p);
    gcoll_args_t a = {.sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dtype = dtype,
                      .op = op};
    gcoll_request_t *req = gcoll_request_new(comm, what, run_allreduce, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    return gcoll_comm_submit(comm, req, req_p);
}

gcoll_status_t gcoll_allreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t count, gcoll_dtype_t dtype, gcoll_op_t op)
{
    return gcoll_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

static gcoll_status_t run_broadcast(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    size_t bytes = a->count * gcoll_dtype_size(a->dtype);
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_BROADCAST, a->count, a->dtype, 0, a->root);
    GCOLL_CHECK(gcoll_bcast_run(comm, a->recvbuf, bytes, a->root, sig, 0));
    comm->chan.counters.bytes_raw += bytes;
    return GCOLL_OK;
}

gcoll_status_t gcoll_ibroadcast(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                                int root, gcoll_request_t **req_p)
{
    const char *what = "gcoll_broadcast";
    GCOLL_CHECK(check_common(comm, what, count, dtype));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, root >= 0 && root < comm->size,
                                      "root %d is not a rank of this %d-rank communicator", root,
                                      comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || buf,
                                      "NULL buffer with count %zu", count));
    gcoll_args_t a = {.recvbuf = buf, .count = count, .dtype = dtype, .root = root};
    gcoll_request_t *req = gcoll_request_new(comm, what, run_broadcast, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    return gcoll_comm_submit(comm, req, req_p);
}

gcoll_status_t gcoll_broadcast(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                               int root)
{
    return gcoll_ibroadcast(comm, buf, count, dtype, root, NULL);
}

static gcoll_status_t run_barrier(gcoll_comm_t *comm, gcoll_request_t *req)
{
    (void)req;
    return gcoll_barrier_run(comm, gcoll_call_sig(GCOLL_KIND_BARRIER, 0, 0, 0, 0));
}

gcoll_status_t gcoll_ibarrier(gcoll_comm_t *comm, gcoll_request_t **req_p)
{
    if (!comm) {
        GCOLL_WARN("gcoll_barrier: NULL communicator");
        return GCOLL_ERR_INVALID;
    }
    gcoll_args_t a = {0};
    gcoll_request_t *req = gcoll_request_new(comm, "gcoll_barrier", run_barrier, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    return gcoll_comm_submit(comm, req, req_p);
}

gcoll_status_t gcoll_barrier(gcoll_comm_t *comm) { return gcoll_ibarrier(comm, NULL); }
