/* rooted_api.c: public entry points of the rooted collectives (reduce, gather, scatter):
 * argument checks, then a queued request whose run function builds the algorithms'
 * context and calls collectives/rooted.c. */
#include <stdio.h>

#include "api/checks.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "core/comm.h"
#include "core/ops.h"
#include "base/log.h"
#include "base/util.h"

/* The algorithm for this call, logged with its reason at GCOLL_DEBUG=info. */
static gcoll_rooted_algo_t choose(const gcoll_coll_t *ctx, const char *what, int kind, size_t bytes)
{
    if (!GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_COLL))
        return gcoll_rooted_select(ctx, kind, bytes, NULL, 0);
    char why[192];
    gcoll_rooted_algo_t a = gcoll_rooted_select(ctx, kind, bytes, why, sizeof(why));
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "%s of %zu bytes per rank: %s, because %s", what + 6, bytes,
               gcoll_rooted_algo_names[a], why);
    return a;
}

static gcoll_status_t run_reduce(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    gcoll_rooted_algo_t algo =
        choose(&ctx, req->name, GCOLL_KIND_REDUCE, a->count * gcoll_dtype_size(a->dtype));
    return gcoll_reduce_run(&ctx, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op, a->root, algo);
}

static gcoll_status_t run_gather(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    gcoll_rooted_algo_t algo =
        choose(&ctx, req->name, a->kind, a->count * gcoll_dtype_size(a->dtype));
    if (a->kind == GCOLL_KIND_GATHER)
        return gcoll_gather_run(&ctx, a->sendbuf, a->recvbuf, a->count, a->dtype, a->root, algo);
    return gcoll_scatter_run(&ctx, a->sendbuf, a->recvbuf, a->count, a->dtype, a->root, algo);
}

/* Checks every rooted call shares: the communicator, dtype, root, and that size * count
 * elements fit in memory (gather's and scatter's root buffers hold that many). */
static gcoll_status_t check_rooted(gcoll_comm_t *comm, const char *what, size_t count,
                                   gcoll_dtype_t dtype, int root)
{
    GCOLL_CHECK(gcoll_api_check_common(comm, what, count, dtype));
    GCOLL_CHECK(gcoll_api_check_rank(comm, what, "root", root));
    size_t b;
    int ok = gcoll_mul_size(count * gcoll_dtype_size(dtype), (size_t)comm->size, &b) == 0 &&
             b < ((size_t)1 << 62);
    return gcoll_comm_check_args(comm, what, ok, "count %zu is too large", count);
}

gcoll_status_t gcoll_ireduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, gcoll_op_t op, int root, gcoll_request_t **req_p)
{
    const char *what = "gcoll_reduce";
    GCOLL_CHECK(check_rooted(comm, what, count, dtype, root));
    GCOLL_CHECK(gcoll_api_check_op(comm, what, dtype, op));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || sendbuf,
                                      "NULL sendbuf with count %zu", count));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || recvbuf || comm->rank != root,
                                      "NULL recvbuf at the root with count %zu", count));
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .op = op,
                      .root = root,
                      .kind = GCOLL_KIND_REDUCE};
    return gcoll_op_submit(comm, what, run_reduce, &a, req_p);
}

gcoll_status_t gcoll_reduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            gcoll_dtype_t dtype, gcoll_op_t op, int root)
{
    return gcoll_ireduce(comm, sendbuf, recvbuf, count, dtype, op, root, NULL);
}

gcoll_status_t gcoll_igather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, int root, gcoll_request_t **req_p)
{
    const char *what = "gcoll_gather";
    GCOLL_CHECK(check_rooted(comm, what, count, dtype, root));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || sendbuf,
                                      "NULL sendbuf with count %zu", count));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || recvbuf || comm->rank != root,
                                      "NULL recvbuf at the root with count %zu", count));
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = root,
                      .kind = GCOLL_KIND_GATHER};
    return gcoll_op_submit(comm, what, run_gather, &a, req_p);
}

gcoll_status_t gcoll_gather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            gcoll_dtype_t dtype, int root)
{
    return gcoll_igather(comm, sendbuf, recvbuf, count, dtype, root, NULL);
}

gcoll_status_t gcoll_iscatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              gcoll_dtype_t dtype, int root, gcoll_request_t **req_p)
{
    const char *what = "gcoll_scatter";
    GCOLL_CHECK(check_rooted(comm, what, count, dtype, root));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || sendbuf || comm->rank != root,
                                      "NULL sendbuf at the root with count %zu", count));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || recvbuf,
                                      "NULL recvbuf with count %zu", count));
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = root,
                      .kind = GCOLL_KIND_SCATTER};
    return gcoll_op_submit(comm, what, run_gather, &a, req_p);
}

gcoll_status_t gcoll_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, int root)
{
    return gcoll_iscatter(comm, sendbuf, recvbuf, count, dtype, root, NULL);
}
