/* ops.c: the queued operations the entry points (lib/api) and the library's own callers
 * (split, teardown, the bucketer, adaptation) share: a request whose run function builds
 * the algorithms' context from the communicator and calls the algorithm. Callers here check
 * their arguments first; these functions trust them. */
#include "core/ops.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "collectives/coll.h"
#include "collectives/compressed/compressed.h"
#include "collectives/reduce.h"
#include "core/comm.h"
#include "hier/hier.h"

static gcoll_status_t submit(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                             gcoll_args_t *a, int noseq, gcoll_request_t **req_p)
{
    /* blocking: the request lives in this frame until the call returns, unless a group of
     * this thread's takes it (then on the heap from the start, not moved there) */
    if (!req_p && !gcoll_comm_group_mine(comm)) {
        gcoll_request_t req;
        gcoll_request_init(&req, comm, what, run, a);
        req.noseq = noseq;
        return gcoll_comm_submit(comm, &req, NULL);
    }
    gcoll_request_t *req = gcoll_request_new(comm, what, run, a);
    if (!req) {
        if (a->release)
            a->release(a->ext);
        return GCOLL_ERR_NOMEM;
    }
    req->noseq = noseq;
    return gcoll_comm_submit(comm, req, req_p);
}

gcoll_status_t gcoll_op_submit(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                               gcoll_args_t *a, gcoll_request_t **req_p)
{
    return submit(comm, what, run, a, 0, req_p);
}

gcoll_status_t gcoll_op_submit_noseq(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                                     gcoll_args_t *a, gcoll_request_t **req_p)
{
    return submit(comm, what, run, a, 1, req_p);
}

gcoll_vargs_t *gcoll_vargs_new(int P, const size_t *rc, const size_t *rd, const size_t *sc,
                               const size_t *sd)
{
    gcoll_vargs_t *v = calloc(1, sizeof(*v) + 4 * (size_t)P * sizeof(size_t));
    if (!v)
        return NULL;
    const size_t *src[4] = {rc, rd, sc, sd};
    size_t **dst[4] = {&v->rcounts, &v->rdispls, &v->scounts, &v->sdispls};
    for (int k = 0; k < 4; k++) {
        if (!src[k])
            continue;
        *dst[k] = v->storage + (size_t)k * P;
        memcpy(*dst[k], src[k], (size_t)P * sizeof(size_t));
    }
    return v;
}

gcoll_status_t gcoll_op_run_allreduce(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    size_t bytes = a->count * gcoll_dtype_size(a->dtype);
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, a->count, a->dtype, a->op, 0);
    char why[256];
    why[0] = '\0';
    /* the reason is formatted only when it is logged: a microsecond of a 5 us allreduce;
     * the choice for the last size is kept (the cost model was 5% of an 8-byte
     * allreduce's profile on shared memory) */
    gcoll_algo_t algo;
    if (GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_COLL)) {
        algo = gcoll_algo_select(&ctx, bytes, why, sizeof(why));
    } else if (comm->algo_memo >= 0 && comm->algo_memo_bytes == bytes) {
        algo = (gcoll_algo_t)comm->algo_memo;
    } else {
        algo = gcoll_algo_select(&ctx, bytes, NULL, 0);
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
        GCOLL_CHECK(gcoll_rhd_allreduce(&ctx, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    case GCOLL_ALGO_TREE:
        GCOLL_CHECK(gcoll_tree_allreduce(&ctx, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    case GCOLL_ALGO_RD:
        GCOLL_CHECK(gcoll_rd_allreduce(&ctx, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    default:
        GCOLL_CHECK(
            gcoll_ring_allreduce_oop(&ctx, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op, sig));
        break;
    }
    gcoll_reduce_finish(a->recvbuf, a->count, a->dtype, a->op, ctx.size);
    ctx.ch->counters.bytes_raw += bytes;
    return GCOLL_OK;
}

gcoll_status_t gcoll_op_iallreduce(gcoll_comm_t *comm, const char *what, const void *sendbuf,
                                   void *recvbuf, size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                   gcoll_request_t **req_p)
{
    int hier = 0;
    GCOLL_CHECK(gcoll_hier_use(comm, what, count * gcoll_dtype_size(dtype), 1.0, 0.0, 0, &hier));
    if (hier)
        return gcoll_hier_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, req_p);
    gcoll_args_t a = {
        .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op};
    return gcoll_op_submit(comm, what, gcoll_op_run_allreduce, &a, req_p);
}

gcoll_status_t gcoll_op_allreduce(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                                  gcoll_op_t op)
{
    return gcoll_op_iallreduce(comm, "gcoll_allreduce", buf, buf, count, dtype, op, NULL);
}

static gcoll_status_t run_allgatherv(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const gcoll_vargs_t *v = a->ext;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_allgatherv_run(&ctx, a->sendbuf, a->recvbuf, v->rcounts, v->rdispls, a->dtype,
                                a->kind);
}

gcoll_status_t gcoll_op_iallgatherv(gcoll_comm_t *comm, const char *what, int kind,
                                    const void *sendbuf, size_t sendcount, void *recvbuf,
                                    const size_t *recvcounts, const size_t *displs,
                                    gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    gcoll_vargs_t *v = gcoll_vargs_new(comm->size, recvcounts, displs, NULL, NULL);
    if (!v)
        return GCOLL_ERR_NOMEM;
    gcoll_args_t a = {.sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .count = sendcount,
                      .dtype = dtype,
                      .kind = kind,
                      .ext = v,
                      .release = free};
    return gcoll_op_submit(comm, what, run_allgatherv, &a, req_p);
}

gcoll_status_t gcoll_op_iallgather(gcoll_comm_t *comm, const char *what, const void *sendbuf,
                                   void *recvbuf, size_t sendcount, gcoll_dtype_t dtype,
                                   gcoll_request_t **req_p)
{
    size_t *tab = malloc(2 * (size_t)comm->size * sizeof(size_t));
    if (!tab)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < comm->size; i++) {
        tab[i] = sendcount;
        tab[comm->size + i] = (size_t)i * sendcount;
    }
    gcoll_status_t st = gcoll_op_iallgatherv(comm, what, GCOLL_KIND_ALLGATHER, sendbuf, sendcount,
                                             recvbuf, tab, tab + comm->size, dtype, req_p);
    free(tab);
    return st;
}

/* ---- inside a running operation ------------------------------------------------- */

gcoll_status_t gcoll_ring_allreduce(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig)
{
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_coll_ring_allreduce(&ctx, recvbuf, count, dtype, op, sig, 0);
}

gcoll_status_t gcoll_ring_allreduce_at(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                       gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                       uint32_t sub0)
{
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_coll_ring_allreduce(&ctx, recvbuf, count, dtype, op, sig, sub0);
}

gcoll_status_t gcoll_small_allreduce_at(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                        gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                        uint32_t sub0)
{
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_rd_allreduce_at(&ctx, recvbuf, count, dtype, op, sig, sub0);
}

void gcoll_compressed_plan(const gcoll_comm_t *comm, const gcoll_tensor_state_t *s, size_t count,
                           int shard_only, gcoll_step_plan_t *plan)
{
    /* read only: the plan reads the rank, the size and the settings */
    const gcoll_coll_t ctx = gcoll_comm_coll((gcoll_comm_t *)comm);
    gcoll_coll_compressed_plan(&ctx, s->c, s, count, shard_only, plan);
}

/* ---- compressed, inside a running operation and in the codec worker's two stages --- */

gcoll_status_t gcoll_compressed_run(gcoll_comm_t *comm, gcoll_tensor_state_t *s, const float *grad,
                                    float *out, size_t count, gcoll_op_t op, int shard_only,
                                    gcoll_nancheck_t check, const gcoll_step_plan_t *plan)
{
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    gcoll_step_plan_t own;
    if (!plan) {
        gcoll_coll_compressed_plan(&ctx, s->c, s, count, shard_only, &own);
        plan = &own;
    }
    /* folding needs the spare's reservation and the scheme's failure handling: only
     * run_compressed chooses it */
    if (check == GCOLL_NANCHECK_FOLD)
        check = GCOLL_NANCHECK_SCAN;
    return gcoll_coll_compressed_run(&ctx, s, grad, out, count, op, shard_only, check, plan);
}

gcoll_status_t gcoll_compressed_encode_stage(const gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                             const float *grad, size_t count, gcoll_op_t op,
                                             gcoll_nancheck_t check, gcoll_encoded_t *e)
{
    /* read only: the plan and the encode read the rank, the size and the settings */
    const gcoll_coll_t ctx = gcoll_comm_coll((gcoll_comm_t *)comm);
    gcoll_coll_compressed_plan(&ctx, s->c, s, count, 0, &e->plan);
    return gcoll_coll_compressed_encode(&ctx, s, grad, count, op, check, e);
}

gcoll_status_t gcoll_compressed_exchange_stage(gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                               gcoll_encoded_t *e, const float *grad, float *out,
                                               size_t count, gcoll_op_t op, gcoll_nancheck_t check)
{
    if (!e->staged) /* the encode stage planned the call and left the state as it was */
        return gcoll_compressed_run(comm, s, grad, out, count, op, 0, check, &e->plan);
    e->staged = 0; /* consumed, whatever happens */
    comm->chan.counters.ns_compress += e->ns;
    if (e->st != GCOLL_OK) {
        if (e->err[0])
            gcoll_comm_set_error(comm, "%s", e->err);
        return e->st;
    }
    const gcoll_coll_t ctx = gcoll_comm_coll(comm);
    return gcoll_coll_compressed_exchange(&ctx, s, e, out, count, op);
}
