/* compressed_api.c: entry points of the compressed allreduce and reduce-scatter: argument
 * checks and the hierarchy's decision in the caller's thread, then a queued request whose
 * run function decides the call's NaN/Inf policy, runs the scheme through the collectives'
 * context (collectives/compressed/compressed.c) and feeds an attached adaptation controller; and
 * the communicator's side of the two-stage form the bucketer's codec worker uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"
#include "core/comm.h"
#include "core/ops.h"
#include "compress/compress.h"
#include "compress/kernels.h"
#include "collectives/compressed/compressed.h"
#include "hier/hier.h"
#include "base/util.h"

typedef struct {
    gcoll_tensor_state_t *state;
    int shard_only;   /* reduce-scatter: stop after reducing this rank's chunk */
    int checked;      /* the nonblocking call scanned the gradient for NaN/Inf already */
    uint64_t scan_ns; /* that scan, counted as codec time when the call runs */
} comp_args_t;

/* The scheme of the plan of a call of c (on state s, or NULL: a state past its warm-up). */
static const char *scheme_of(const gcoll_comm_t *comm, const gcoll_compressor_t *c,
                             const gcoll_tensor_state_t *s, size_t count, int shard_only,
                             size_t *segment_p)
{
    /* read only: the scheme depends on the settings, the codec, the size and the step */
    gcoll_coll_t ctx = gcoll_comm_coll((gcoll_comm_t *)comm);
    gcoll_step_plan_t plan;
    gcoll_coll_compressed_plan(&ctx, c, s, count, shard_only, &plan);
    if (segment_p)
        *segment_p = gcoll_coll_compressed_is_ring(plan.scheme)
                         ? gcoll_cring_segment(comm->cfg.coll.ring_chunk, count, comm->size)
                         : 0;
    return gcoll_coll_compressed_name(plan.scheme);
}

const char *gcoll_compressed_scheme(const gcoll_comm_t *comm, const gcoll_compressor_t *c,
                                    size_t count, int shard_only, size_t *segment_p)
{
    if (!comm || !c)
        return NULL;
    return scheme_of(comm, c, NULL, count, shard_only, segment_p);
}

const char *gcoll_compressed_scheme_state(const gcoll_comm_t *comm,
                                          const gcoll_tensor_state_t *state, int shard_only,
                                          size_t *segment_p)
{
    if (!comm || !state)
        return NULL;
    /* the codec the next call encodes with (an attached controller's copy) at its step */
    return scheme_of(comm, state->c, state, state->count, shard_only, segment_p);
}

static gcoll_status_t run_compressed(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const comp_args_t *ca = a->ext;
    gcoll_tensor_state_t *s = ca->state;
    const size_t count = a->count;
    /* NaN/Inf in the gradient (a blocking call; a nonblocking one scanned in the call): one
     * vectorized scan (the codec's kernel) before anything is sent, or none where the
     * codec checks in its feedback pass, also before anything is sent (encode_first);
     * either way the state is untouched and nothing sent (comm->chan.op_local) */
    comm->chan.counters.ns_compress += ca->scan_ns;
    gcoll_coll_t ctx = gcoll_comm_coll(comm);
    /* the call's plan, once: its density, k, bound and scheme, which everything below
     * reads (the scheme's choice, the buffers, the selection) */
    gcoll_step_plan_t plan;
    gcoll_coll_compressed_plan(&ctx, s->c, s, count, ca->shard_only, &plan);
    int fold = !ca->checked && comm->cfg.ef_spare && gcoll_coll_compressed_foldable(plan.scheme) &&
               gcoll_codec_folds_check(s->c, s, count) &&
               gcoll_codec_spare_reserve(s, comm->cfg.ef_spare_max);
    if (!fold && !ca->checked && count) {
        uint64_t t0 = gcoll_time_ns();
        size_t bad = gcoll_kernels()->first_bad(a->sendbuf, count);
        comm->chan.counters.ns_compress += gcoll_time_ns() - t0;
        if (bad < count) {
            comm->chan.op_local = 1;
            gcoll_comm_set_error(comm, "grad[%zu] is NaN or infinite", bad);
            return GCOLL_ERR_INVALID;
        }
    }
    if (s->adapt) /* gcoll_adapt_attach: sample the input before an in-place call */
        gcoll_adapt_before(comm, s, a->sendbuf, count);
    gcoll_status_t st =
        gcoll_coll_compressed_run(&ctx, s, a->sendbuf, a->recvbuf, count, a->op, ca->shard_only,
                                  fold ? GCOLL_NANCHECK_FOLD : GCOLL_NANCHECK_DONE, &plan);
    if (st == GCOLL_OK && s->adapt)
        st = gcoll_adapt_after(comm, s, count);
    return st;
}

static gcoll_status_t submit(gcoll_comm_t *comm, const char *what, gcoll_tensor_state_t *state,
                             const float *grad, float *out, size_t count, gcoll_op_t op,
                             int shard_only, gcoll_request_t **req_p)
{
    if (!comm) {
        GCOLL_WARN("%s: NULL communicator", what);
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, state != NULL, "NULL tensor state"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, state->count == count,
                                      "count %zu differs from the state's %zu", count,
                                      state->count));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, op == GCOLL_SUM || op == GCOLL_AVG,
                                      "op %s: only sum and avg", gcoll_op_name(op)));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, count == 0 || (grad && out),
                                      "NULL buffer with count %zu", count));
    if (!shard_only && count) {
        /* the estimate's wire: the codec's worst-case bytes per dense byte; its time:
         * about a nanosecond per element encoded (gcoll-codec-bench's order for top-k) */
        int hier = 0;
        double ratio = (double)gcoll_compressor_bound(state->c, count) / (4.0 * (double)count);
        double enc = (gcoll_compressor_flags(state->c) & GCOLL_CODEC_LOSSLESS) ? 0 : 0.25e-9;
        /* the result goes back inside the host dense (through the shared memory) */
        GCOLL_CHECK(gcoll_hier_use(comm, what, count * sizeof(float), ratio, enc, 0, &hier));
        if (hier)
            return gcoll_hier_icompressed(comm, state, grad, out, count, op, req_p);
    }
    /* a nonblocking call checks for NaN/Inf now, so that the caller learns of it before it
     * queues another call (which would otherwise take this one's place among the peers'
     * calls); a blocking one checks as it runs (run_compressed) */
    uint64_t scan_ns = 0;
    if (req_p && count) {
        uint64_t t0 = gcoll_time_ns();
        size_t bad = gcoll_kernels()->first_bad(grad, count);
        scan_ns = gcoll_time_ns() - t0;
        GCOLL_CHECK(
            gcoll_comm_check_args(comm, what, bad >= count, "grad[%zu] is NaN or infinite", bad));
    }
    comp_args_t *ca = calloc(1, sizeof(*ca));
    if (!ca)
        return GCOLL_ERR_NOMEM;
    ca->state = state;
    ca->shard_only = shard_only;
    ca->checked = req_p != NULL;
    ca->scan_ns = scan_ns;
    gcoll_args_t a = {.sendbuf = grad,
                      .recvbuf = out,
                      .count = count,
                      .dtype = GCOLL_FLOAT32,
                      .op = op,
                      .ext = ca,
                      .release = free};
    return gcoll_op_submit(comm, what, run_compressed, &a, req_p);
}

gcoll_status_t gcoll_icompressed_allreduce(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                           const float *grad, float *out, size_t count,
                                           gcoll_op_t op, gcoll_request_t **req_p)
{
    return submit(comm, "gcoll_compressed_allreduce", state, grad, out, count, op, 0, req_p);
}

gcoll_status_t gcoll_compressed_allreduce(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                          const float *grad, float *out, size_t count,
                                          gcoll_op_t op)
{
    return submit(comm, "gcoll_compressed_allreduce", state, grad, out, count, op, 0, NULL);
}

gcoll_status_t gcoll_icompressed_reduce_scatter(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                                const float *grad, float *shard, size_t count,
                                                gcoll_op_t op, gcoll_request_t **req_p)
{
    return submit(comm, "gcoll_compressed_reduce_scatter", state, grad, shard, count, op, 1, req_p);
}

gcoll_status_t gcoll_compressed_reduce_scatter(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                               const float *grad, float *shard, size_t count,
                                               gcoll_op_t op)
{
    return submit(comm, "gcoll_compressed_reduce_scatter", state, grad, shard, count, op, 1, NULL);
}

void gcoll_shard_range(const gcoll_comm_t *comm, size_t count, size_t *offset_p, size_t *len_p)
{
    gcoll_span_t ch = gcoll_even_chunk(count, comm ? comm->size : 1, comm ? comm->rank : 0);
    if (offset_p)
        *offset_p = ch.off;
    if (len_p)
        *len_p = ch.len;
}
