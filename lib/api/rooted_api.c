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

/* Checks every rooted call shares, then the queued request: the communicator, dtype, root,
 * that size * count elements fit in memory (gather's and scatter's root buffers hold that
 * many), and the buffers: the root's own buffer (reduce's and gather's recvbuf, scatter's
 * sendbuf) may be NULL elsewhere, the other one is needed on every rank. */
static gcoll_status_t submit(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                             gcoll_args_t *a, gcoll_request_t **req_p)
{
    GCOLL_CHECK(gcoll_api_check_common(comm, what, a->count, a->dtype));
    if (a->kind == GCOLL_KIND_REDUCE)
        GCOLL_CHECK(gcoll_api_check_op(comm, what, a->dtype, a->op));
    GCOLL_CHECK(gcoll_api_check_rank(comm, what, "root", a->root));
    size_t b;
    int ok = gcoll_mul_size(a->count * gcoll_dtype_size(a->dtype), (size_t)comm->size, &b) == 0 &&
             b < ((size_t)1 << 62);
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, ok, "count %zu is too large", a->count));
    const int scatter = a->kind == GCOLL_KIND_SCATTER, root = comm->rank == a->root;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, a->count == 0 || a->sendbuf || (scatter && !root),
                                      "NULL sendbuf%s with count %zu",
                                      scatter ? " at the root" : "", a->count));
    GCOLL_CHECK(gcoll_comm_check_args(
        comm, what, a->count == 0 || a->recvbuf || (!scatter && !root),
        "NULL recvbuf%s with count %zu", scatter ? "" : " at the root", a->count));
    return gcoll_op_submit(comm, what, run, a, req_p);
}

gcoll_status_t gcoll_ireduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, gcoll_op_t op, int root, gcoll_request_t **req_p)
{
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .op = op,
                      .root = root,
                      .kind = GCOLL_KIND_REDUCE};
    return submit(comm, "gcoll_reduce", run_reduce, &a, req_p);
}

gcoll_status_t gcoll_reduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            gcoll_dtype_t dtype, gcoll_op_t op, int root)
{
    return gcoll_ireduce(comm, sendbuf, recvbuf, count, dtype, op, root, NULL);
}

gcoll_status_t gcoll_igather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, int root, gcoll_request_t **req_p)
{
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = root,
                      .kind = GCOLL_KIND_GATHER};
    return submit(comm, "gcoll_gather", run_gather, &a, req_p);
}

gcoll_status_t gcoll_gather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            gcoll_dtype_t dtype, int root)
{
    return gcoll_igather(comm, sendbuf, recvbuf, count, dtype, root, NULL);
}

gcoll_status_t gcoll_iscatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              gcoll_dtype_t dtype, int root, gcoll_request_t **req_p)
{
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = count,
                      .dtype = dtype,
                      .root = root,
                      .kind = GCOLL_KIND_SCATTER};
    return submit(comm, "gcoll_scatter", run_gather, &a, req_p);
}

gcoll_status_t gcoll_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             gcoll_dtype_t dtype, int root)
{
    return gcoll_iscatter(comm, sendbuf, recvbuf, count, dtype, root, NULL);
}
