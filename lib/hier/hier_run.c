/* hier_run.c: the hierarchical allreduce, run as one operation of the parent communicator
 * whose steps are collectives of its children (hier.c). Uniform hosts (L ranks each) take
 * the two-level scheme of Horovod and NCCL: a reduce-scatter inside the host leaves each
 * local rank one L-th, the ranks of one local rank allreduce their part across hosts, an
 * allgather inside the host completes it; dense data is pipelined by chunks, so that one
 * chunk crosses the host link while the next is reduced inside the host. Uneven hosts: an
 * allreduce inside the host, one among the leaders, and a broadcast from the leader.
 * Compressed: only the step across hosts compresses (with a state for this rank's part,
 * which keeps the error feedback); the steps inside the host are exact. */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "compress/compress.h"
#include "hier/hier.h"
#include "base/log.h"
#include "collectives/reduce.h"
#include "base/util.h"

#define HIER_CHUNK_BYTES ((size_t)8 << 20) /* pipelining unit of the dense form */

/* The children's traffic counts as the parent's. */
static void counters_add(gcoll_counters_t *to, const gcoll_comm_t *c, const gcoll_counters_t *was)
{
    gcoll_counters_t now;
    if (!c || gcoll_comm_counters(c, &now) != GCOLL_OK)
        return;
    to->bytes_sent += now.bytes_sent - was->bytes_sent;
    to->bytes_received += now.bytes_received - was->bytes_received;
    to->ns_compress += now.ns_compress - was->ns_compress;
    to->ns_wire += now.ns_wire - was->ns_wire;
}

/* Before waiting for what is still in flight after a failure: the peers' steps fail. */
static void abort_children(gcoll_hier_t *h)
{
    if (h->local)
        gcoll_comm_abort(h->local);
    if (h->rail)
        gcoll_comm_abort(h->rail);
}

/* On a failure, both children are aborted, so that the peers blocked in a step that will
 * not come fail at once instead of at their timeout. */
static gcoll_status_t fail(const gcoll_coll_t *ctx, gcoll_status_t st, const char *step)
{
    gcoll_hier_t *h = ctx->hier;
    const char *detail = "";
    if (h->local && *gcoll_comm_last_error(h->local))
        detail = gcoll_comm_last_error(h->local);
    else if (h->rail && *gcoll_comm_last_error(h->rail))
        detail = gcoll_comm_last_error(h->rail);
    gcoll_channel_set_error(ctx->ch, "hierarchical allreduce: %s failed: %s%s%s", step,
                            gcoll_status_string(st), *detail ? ": " : "", detail);
    abort_children(h);
    return st;
}

/* Waits for *r (if any) and clears it; keeps the first error in *st. */
static void wait_one(gcoll_request_t **r, gcoll_status_t *st)
{
    if (!*r)
        return;
    gcoll_status_t s = gcoll_wait(*r);
    *r = NULL;
    if (*st == GCOLL_OK)
        *st = s;
}

/* ---------------------------------------------------------------------------------- */
/* Dense                                                                                */

typedef struct {
    gcoll_hier_t *h;
    uint8_t *buf;
    const uint8_t *src; /* the input (== buf in place): the first step reads it there */
    size_t esz, chunk;  /* elements per chunk (a multiple of L) */
    size_t body;        /* elements the chunks cover; the tail goes through the leaders */
    gcoll_dtype_t dtype;
    gcoll_op_t op;
} dense_t;

/* Stage s (0 inside, 1 across, 2 inside) of chunk c. */
static gcoll_status_t dense_stage(const dense_t *d, int s, size_t c, gcoll_request_t **r)
{
    const gcoll_hier_t *h = d->h;
    size_t off = c * d->chunk;
    size_t n = d->body - off < d->chunk ? d->body - off : d->chunk;
    uint8_t *p = d->buf + off * d->esz;
    const uint8_t *in = d->src + off * d->esz;
    *r = NULL;
    if (h->uniform) {
        size_t part = n / (size_t)h->local_size;
        uint8_t *mine = p + (size_t)h->local_rank * part * d->esz;
        if (s == 0)
            return gcoll_ireduce_scatter(h->local, in, mine, part, d->dtype, d->op, r);
        if (s == 1)
            return gcoll_iallreduce(h->rail, mine, mine, part, d->dtype, d->op, r);
        return gcoll_iallgather(h->local, mine, p, part, d->dtype, r);
    }
    if (s == 0)
        return gcoll_iallreduce(h->local, in, p, n, d->dtype, d->op, r);
    if (s == 1)
        return h->rail ? gcoll_iallreduce(h->rail, p, p, n, d->dtype, d->op, r) : GCOLL_OK;
    return gcoll_ibroadcast(h->local, p, n, d->dtype, 0, r);
}

/* Chunk c's inside reduction runs while chunk c-1 crosses the hosts; the order of the
 * calls on each child is the same on every rank (a function of the chunk count only). */
static gcoll_status_t dense_pipeline(const dense_t *d, size_t nc)
{
    gcoll_request_t **r = calloc(3 * nc + 1, sizeof(*r));
    if (!r)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = dense_stage(d, 0, 0, &r[0]);
    for (size_t c = 0; c < nc && st == GCOLL_OK; c++) {
        wait_one(&r[3 * c], &st);
        if (st == GCOLL_OK && c + 1 < nc)
            st = dense_stage(d, 0, c + 1, &r[3 * (c + 1)]);
        if (st == GCOLL_OK)
            st = dense_stage(d, 1, c, &r[3 * c + 1]);
        if (st == GCOLL_OK && c > 0) {
            wait_one(&r[3 * (c - 1) + 1], &st);
            if (st == GCOLL_OK)
                st = dense_stage(d, 2, c - 1, &r[3 * (c - 1) + 2]);
        }
    }
    if (st == GCOLL_OK && nc > 0) {
        wait_one(&r[3 * (nc - 1) + 1], &st);
        if (st == GCOLL_OK)
            st = dense_stage(d, 2, nc - 1, &r[3 * (nc - 1) + 2]);
    }
    if (st != GCOLL_OK)
        abort_children(d->h);
    for (size_t i = 0; i < 3 * nc; i++)
        wait_one(&r[i], &st);
    free(r);
    return st;
}

/* The same pipeline with the steps inside the host in shared memory: every input is
 * copied into its slot once; then, chunk by chunk, each rank reduces its part from every
 * slot and starts that part across hosts while it reduces the next; each result is
 * published in slot 0 (whose part lr only rank lr reads) and copied out at the end. */
static gcoll_status_t dense_shm(const dense_t *d, size_t nc)
{
    gcoll_hier_t *h = d->h;
    const size_t L = (size_t)h->local_size, lr = (size_t)h->local_rank, esz = d->esz;
    gcoll_request_t **r = calloc(nc + 1, sizeof(*r));
    if (!r)
        return GCOLL_ERR_NOMEM;
    memcpy(h->shm + lr * h->shm_slot, d->src, d->body * esz);
    gcoll_status_t st = gcoll_barrier(h->local);
    for (size_t c = 0; c <= nc && st == GCOLL_OK; c++) {
        if (c < nc) {
            size_t off = c * d->chunk, n = d->body - off < d->chunk ? d->body - off : d->chunk;
            size_t part = n / L, at = (off + lr * part) * esz;
            memcpy(d->buf + at, h->shm + at, part * esz);
            for (size_t j = 1; j < L; j++)
                gcoll_reduce_local(d->buf + at, h->shm + j * h->shm_slot + at, part, d->dtype,
                                   d->op);
            st = gcoll_iallreduce(h->rail, d->buf + at, d->buf + at, part, d->dtype, d->op, &r[c]);
        }
        if (st == GCOLL_OK && c > 0) {
            size_t off = (c - 1) * d->chunk;
            size_t n = d->body - off < d->chunk ? d->body - off : d->chunk;
            size_t part = n / L, at = (off + lr * part) * esz;
            wait_one(&r[c - 1], &st);
            if (st == GCOLL_OK)
                memcpy(h->shm + at, d->buf + at, part * esz);
        }
    }
    if (st == GCOLL_OK)
        st = gcoll_barrier(h->local); /* every part is published */
    for (size_t c = 0; c < nc && st == GCOLL_OK; c++) {
        size_t off = c * d->chunk, n = d->body - off < d->chunk ? d->body - off : d->chunk;
        size_t part = n / L;
        for (size_t j = 0; j < L; j++)
            if (j != lr)
                memcpy(d->buf + (off + j * part) * esz, h->shm + (off + j * part) * esz,
                       part * esz);
    }
    if (st == GCOLL_OK)
        st = gcoll_barrier(h->local); /* read by all before anyone's next input */
    if (st != GCOLL_OK)
        abort_children(h);
    for (size_t c = 0; c < nc; c++)
        wait_one(&r[c], &st);
    free(r);
    return st;
}

/* The elements no part covers (fewer than L): allreduce inside, among the leaders,
 * broadcast from the leader. Run on n + 1 elements even when n is 0, so that ranks whose
 * counts differ only here fail with GCOLL_ERR_MISMATCH (the count is in every message's
 * signature) instead of waiting for a step the others do not take. */
static gcoll_status_t tail_allreduce(gcoll_hier_t *h, const void *in, void *p, size_t n,
                                     gcoll_dtype_t dtype, gcoll_op_t op)
{
    size_t esz = gcoll_dtype_size(dtype);
    uint8_t *t = calloc(n + 1, esz);
    if (!t)
        return GCOLL_ERR_NOMEM;
    if (n)
        memcpy(t, in, n * esz);
    gcoll_status_t st = gcoll_allreduce(h->local, t, t, n + 1, dtype, op);
    if (st == GCOLL_OK && h->local_rank == 0)
        st = gcoll_allreduce(h->rail, t, t, n + 1, dtype, op);
    if (st == GCOLL_OK)
        st = gcoll_broadcast(h->local, t, n + 1, dtype, 0);
    if (st == GCOLL_OK && n)
        memcpy(p, t, n * esz);
    free(t);
    return st;
}

static gcoll_status_t run_dense(const gcoll_coll_t *ctx, const gcoll_hier_call_t *a)
{
    gcoll_hier_t *h = ctx->hier;
    dense_t d = {.h = h,
                 .buf = a->recvbuf,
                 .esz = gcoll_dtype_size(a->dtype),
                 .dtype = a->dtype,
                 .op = a->op == GCOLL_AVG ? GCOLL_SUM : a->op};
    d.src = a->sendbuf;
    const size_t L = h->uniform ? (size_t)h->local_size : 1;
    d.chunk = HIER_CHUNK_BYTES / d.esz / L * L;
    if (d.chunk < L)
        d.chunk = L;
    d.body = a->count / L * L;
    size_t nc = (d.body + d.chunk - 1) / d.chunk;
    int shm = 0;
    gcoll_status_t st = GCOLL_OK;
    if (h->uniform && d.body)
        st = gcoll_hier_shm_ensure(h, d.body * d.esz, &shm);
    if (st == GCOLL_OK)
        st = shm ? dense_shm(&d, nc) : dense_pipeline(&d, nc);
    if (st != GCOLL_OK)
        return fail(ctx, st, "a step of the dense pipeline");
    st = tail_allreduce(h, d.src + d.body * d.esz, d.buf + d.body * d.esz, a->count - d.body,
                        a->dtype, d.op);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the tail");
    gcoll_reduce_finish(a->recvbuf, a->count, a->dtype, a->op, ctx->size);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Sparse                                                                               */

/* The nonzeros of x[0..n) as (index, value) pairs; *n_p receives their number. */
static gcoll_status_t nonzeros(const float *x, size_t n, uint32_t **idx_p, float **val_p,
                               size_t *n_p)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += x[i] != 0.0f;
    uint32_t *idx = malloc((k + 1) * sizeof(*idx));
    float *val = malloc((k + 1) * sizeof(*val));
    if (!idx || !val) {
        free(idx);
        free(val);
        return GCOLL_ERR_NOMEM;
    }
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) {
            idx[k] = (uint32_t)i;
            val[k++] = x[i];
        }
    *idx_p = idx;
    *val_p = val;
    *n_p = k;
    return GCOLL_OK;
}

/* The allgather inside the host of parts that are mostly zeros: every local rank's part
 * (out[lr * part, (lr + 1) * part), complete on its owner) travels as (index, value)
 * pairs, an allgather of the counts and one of the pairs, and every rank writes them into
 * its zeroed out[0, L * part): the same values on every rank as a dense allgather (a
 * -0.0 becomes +0.0). */
static gcoll_status_t allgather_sparse_parts(gcoll_hier_t *h, float *out, size_t part)
{
    const int L = h->local_size;
    const float *mine = out + (size_t)h->local_rank * part;
    int64_t k = 0, *ks = calloc((size_t)L, sizeof(*ks));
    size_t *counts = calloc((size_t)L, sizeof(*counts)),
           *displs = calloc((size_t)L, sizeof(*displs));
    uint32_t *pk = NULL, *all = NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!ks || !counts || !displs)
        goto out;
    for (size_t i = 0; i < part; i++)
        k += mine[i] != 0.0f;
    if (!(pk = malloc(((size_t)k + 1) * 2 * sizeof(*pk))))
        goto out;
    size_t j = 0, base = (size_t)h->local_rank * part;
    for (size_t i = 0; i < part; i++)
        if (mine[i] != 0.0f) {
            pk[2 * j] = (uint32_t)(base + i);
            memcpy(&pk[2 * j + 1], &mine[i], sizeof(float));
            j++;
        }
    if ((st = gcoll_allgather(h->local, &k, ks, 1, GCOLL_INT64)) != GCOLL_OK)
        goto out;
    size_t total = 0;
    for (int r = 0; r < L; r++) {
        if (ks[r] < 0 || (size_t)ks[r] > part) { /* a peer's count off the wire */
            st = GCOLL_ERR_INTERNAL;
            goto out;
        }
        counts[r] = 2 * (size_t)ks[r];
        displs[r] = total;
        total += counts[r];
    }
    st = GCOLL_ERR_NOMEM;
    if (!(all = malloc((total + 2) * sizeof(*all))))
        goto out;
    st = gcoll_allgatherv(h->local, pk, 2 * (size_t)k, all, counts, displs, GCOLL_INT32);
    if (st != GCOLL_OK)
        goto out;
    memset(out, 0, (size_t)L * part * sizeof(float));
    for (int r = 0; r < L; r++)
        for (size_t i = displs[r]; i < displs[r] + counts[r]; i += 2) {
            uint32_t idx = all[i];
            size_t lo = (size_t)r * part; /* a pair outside its owner's part is not written */
            if (idx >= lo && idx < lo + part)
                memcpy(&out[idx], &all[i + 1], sizeof(float));
        }
out:
    free(ks);
    free(counts);
    free(displs);
    free(pk);
    free(all);
    return st;
}

/* Exact sparse sum inside the host (dense result on every local rank), then this rank's
 * part's nonzeros across hosts, an allgather inside. */
static gcoll_status_t run_sparse(const gcoll_coll_t *ctx, const gcoll_hier_call_t *a)
{
    gcoll_hier_t *h = ctx->hier;
    float *out = a->recvbuf;
    gcoll_status_t st =
        gcoll_sparse_allreduce(h->local, a->idx, a->val, a->nnz, a->count, out, GCOLL_SUM);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the sparse allreduce inside the host");
    const size_t L = h->uniform ? (size_t)h->local_size : 1;
    const size_t part = a->count / L, body = part * L;
    float *mine = out + (size_t)(h->uniform ? h->local_rank : 0) * part;
    uint32_t *pi = NULL;
    float *pv = NULL;
    size_t pn = 0;
    if (h->rail) {
        if ((st = nonzeros(mine, part, &pi, &pv, &pn)) != GCOLL_OK)
            return fail(ctx, st, "the pairs across hosts");
        st = gcoll_sparse_allreduce(h->rail, pi, pv, pn, part, mine, GCOLL_SUM);
        free(pi);
        free(pv);
        if (st != GCOLL_OK)
            return fail(ctx, st, "the sparse allreduce across hosts");
    }
    if (h->uniform)
        st = allgather_sparse_parts(h, out, part);
    else
        st = gcoll_broadcast(h->local, out, a->count, GCOLL_FLOAT32, 0);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the allgather inside the host");
    /* the tail (< L elements) already holds the host's sum on every local rank */
    if (a->count > body) {
        float *t = out + body;
        size_t n = a->count - body;
        if (h->local_rank == 0)
            st = gcoll_allreduce(h->rail, t, t, n, GCOLL_FLOAT32, GCOLL_SUM);
        if (st == GCOLL_OK)
            st = gcoll_broadcast(h->local, t, n, GCOLL_FLOAT32, 0);
        if (st != GCOLL_OK)
            return fail(ctx, st, "the tail");
    }
    gcoll_reduce_finish(out, a->count, GCOLL_FLOAT32, a->op, ctx->size);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Compressed                                                                           */

/* The state of this rank's part: created at the first call (at the user state's step),
 * replaced if the part's size changes. Its residual is the error feedback of the step
 * across hosts; the user state's own residual stays unused. */
static gcoll_status_t part_state(gcoll_tensor_state_t *s, size_t n, gcoll_tensor_state_t **p_p)
{
    if (s->hier_part && s->hier_part->count != n) {
        gcoll_state_destroy(s->hier_part);
        s->hier_part = NULL;
    }
    if (!s->hier_part) {
        GCOLL_CHECK(gcoll_state_create_mode(s->c, n, s->mode, &s->hier_part));
        s->hier_part->step = s->step;
    }
    *p_p = s->hier_part;
    return GCOLL_OK;
}

static gcoll_status_t run_compressed(const gcoll_coll_t *ctx, const gcoll_hier_call_t *a)
{
    gcoll_hier_t *h = ctx->hier;
    const float *grad = a->sendbuf;
    float *out = a->recvbuf;
    const size_t L = h->uniform ? (size_t)h->local_size : 1;
    const size_t part = a->count / L, body = part * L;
    float *mine = out + (size_t)(h->uniform ? h->local_rank : 0) * part;
    gcoll_status_t st;
    uint64_t t0 = gcoll_time_ns(), t1 = t0, t2 = t0;
    int shm = 0;
    if (h->uniform && (st = gcoll_hier_shm_ensure(h, part * L * sizeof(float), &shm)) != GCOLL_OK)
        return fail(ctx, st, "the shared memory inside the host");
    if (shm)
        st = gcoll_hier_shm_reduce_scatter(h, grad, out, part, GCOLL_FLOAT32, GCOLL_SUM);
    else if (h->uniform)
        st = gcoll_reduce_scatter(h->local, grad, mine, part, GCOLL_FLOAT32, GCOLL_SUM);
    else
        st = gcoll_allreduce(h->local, grad, out, a->count, GCOLL_FLOAT32, GCOLL_SUM);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the sum inside the host");
    t1 = gcoll_time_ns();
    if (h->rail) {
        gcoll_tensor_state_t *ps;
        if ((st = part_state(a->state, part, &ps)) != GCOLL_OK)
            return fail(ctx, st, "the state of this rank's part");
        st = gcoll_compressed_allreduce(h->rail, ps, mine, mine, part, GCOLL_SUM);
        if (st != GCOLL_OK)
            return fail(ctx, st, "the compressed allreduce across hosts");
    }
    t2 = gcoll_time_ns();
    /* a sparsifier's sum across hosts has at most k nonzeros per host: pairs, not parts */
    int sparse = (gcoll_compressor_flags(a->state->c) & GCOLL_CODEC_SPARSE) != 0;
    if (shm)
        st = gcoll_hier_shm_allgather(h, out, part, GCOLL_FLOAT32);
    else if (h->uniform && sparse)
        st = allgather_sparse_parts(h, out, part);
    else if (h->uniform)
        st = gcoll_allgather(h->local, mine, out, part, GCOLL_FLOAT32);
    else
        st = gcoll_broadcast(h->local, out, a->count, GCOLL_FLOAT32, 0);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the allgather inside the host");
    st = tail_allreduce(h, grad + body, out + body, a->count - body, GCOLL_FLOAT32, GCOLL_SUM);
    if (st != GCOLL_OK)
        return fail(ctx, st, "the tail");
    a->state->step++;
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL,
                "hierarchical compressed allreduce of %zu floats: %.3f s inside, %.3f s "
                "across hosts, %.3f s back inside",
                a->count, (t1 - t0) * 1e-9, (t2 - t1) * 1e-9, (gcoll_time_ns() - t2) * 1e-9);
    gcoll_reduce_finish(out, a->count, GCOLL_FLOAT32, a->op, ctx->size);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* The operation                                                                        */

gcoll_status_t gcoll_hier_run(const gcoll_coll_t *ctx, const gcoll_hier_call_t *a)
{
    gcoll_hier_t *h = ctx->hier;
    gcoll_counters_t lc = {0}, rc = {0};
    gcoll_comm_counters(h->local, &lc);
    if (h->rail)
        gcoll_comm_counters(h->rail, &rc);
    gcoll_status_t st;
    if (a->kind == GCOLL_HIER_DENSE)
        st = run_dense(ctx, a);
    else if (a->kind == GCOLL_HIER_SPARSE)
        st = run_sparse(ctx, a);
    else
        st = run_compressed(ctx, a);
    counters_add(&ctx->ch->counters, h->local, &lc);
    counters_add(&ctx->ch->counters, h->rail, &rc);
    if (st == GCOLL_OK)
        ctx->ch->counters.bytes_raw += a->count * gcoll_dtype_size(a->dtype);
    return st;
}
