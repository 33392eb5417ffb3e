/* gather.c: allgather(v), reduce-scatter and alltoall(v) as plans on the ring engine
 * (allgather, reduce-scatter) or pairwise exchange (alltoall); their entry points are in
 * lib/api/coll_api.c. */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "base/util.h"

/* Signature over the call kind, dtype and a per-rank count table every rank shares. */
static uint32_t table_sig(int kind, const size_t *counts, int P, gcoll_dtype_t dtype)
{
    uint64_t h = counts ? gcoll_hash64(counts, (size_t)P * sizeof(size_t), 0) : 0;
    return gcoll_call_sig(kind, (size_t)h, dtype, 0, 0);
}

/* ---- allgather(v) ---------------------------------------------------------------- */

gcoll_status_t gcoll_allgatherv_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                    const size_t *rcounts, const size_t *rdispls,
                                    gcoll_dtype_t dtype, int kind)
{
    const int P = ctx->size, r = ctx->rank;
    const size_t esz = gcoll_dtype_size(dtype);
    uint8_t *recv = recvbuf;
    if (sendbuf != recv + rdispls[r] * esz && rcounts[r])
        memmove(recv + rdispls[r] * esz, sendbuf, rcounts[r] * esz);
    gcoll_span_t *seg = calloc((size_t)P, sizeof(*seg));
    if (!seg)
        return GCOLL_ERR_NOMEM;
    size_t total = 0;
    for (int i = 0; i < P; i++) {
        seg[i] = (gcoll_span_t){rdispls[i] * esz, rcounts[i] * esz};
        total += seg[i].len;
    }
    gcoll_ring_plan_t plan = {.buf = recv,
                              .seg = seg,
                              .esz = esz,
                              .dtype = dtype,
                              .ag_steps = (size_t)P - 1,
                              .ag_shift = 0,
                              .sig = table_sig(kind, rcounts, P, dtype)};
    gcoll_status_t st = gcoll_ring_run(ctx, &plan);
    free(seg);
    ctx->ch->counters.bytes_raw += total;
    return st;
}

/* ---- reduce-scatter ---------------------------------------------------------------- */

/* Staged in slices of GCOLL_RING_SLICE: block i's slice is segment i of a work buffer,
 * the ring leaves segment r fully reduced here (rs_shift = -1), and it is copied out. */
gcoll_status_t gcoll_reduce_scatter_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    const size_t P = (size_t)ctx->size, r = (size_t)ctx->rank;
    const size_t esz = gcoll_dtype_size(dtype);
    const uint8_t *send = sendbuf;
    uint8_t *recv = recvbuf;
    if (n == 0)
        return GCOLL_OK;
    if (P == 1) {
        if (send != recv)
            memmove(recv, send, n * esz);
        return GCOLL_OK;
    }
    size_t sl = GCOLL_MIN(n, GCOLL_MAX(ctx->cfg->ring_slice / esz / P, (size_t)1));
    uint8_t *work = malloc(2 * P * sl * esz), *tmp = work ? work + P * sl * esz : NULL;
    gcoll_span_t *seg = calloc(P, sizeof(*seg));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!work || !seg)
        goto out;
    gcoll_ring_plan_t plan = {.buf = work,
                              .tmp = tmp,
                              .seg = seg,
                              .esz = esz,
                              .dtype = dtype,
                              .op = op,
                              .rs_steps = P - 1,
                              .rs_shift = -1,
                              .sig = gcoll_call_sig(GCOLL_KIND_REDUCE_SCATTER, n, dtype, op, 0)};
    for (size_t off = 0; off < n; off += sl) {
        size_t len = GCOLL_MIN(sl, n - off);
        for (size_t i = 0; i < P; i++) {
            seg[i] = (gcoll_span_t){i * len * esz, len * esz};
            memcpy(work + seg[i].off, send + (i * n + off) * esz, len * esz);
        }
        GCOLL_CHECK_GOTO(gcoll_ring_run(ctx, &plan), st, out);
        memcpy(recv + off * esz, work + seg[r].off, len * esz);
        plan.sub0 +=
            (uint32_t)((P - 1) * GCOLL_MAX(GCOLL_DIV_UP(len, GCOLL_MAX(ctx->cfg->ring_chunk / esz,
                                                                       (size_t)1)),
                                           (size_t)1));
    }
    gcoll_reduce_finish(recv, n, dtype, op, ctx->size);
    ctx->ch->counters.bytes_raw += P * n * esz;
    st = GCOLL_OK;
out:
    free(seg);
    free(work);
    return st;
}

/* ---- alltoall(v) ------------------------------------------------------------------- */

gcoll_status_t gcoll_alltoall_run(const gcoll_coll_t *ctx, const uint8_t *sendbuf,
                                  const gcoll_span_t *sspan, uint8_t *recvbuf,
                                  const gcoll_span_t *rspan, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    gcoll_treq_t *req = calloc(2 * (size_t)P, sizeof(*req));
    if (!req)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    /* Staggered partners so that every link is busy, not every rank hitting rank 0. */
    for (int k = 1; k < P; k++) {
        int from = (r - k + P) % P;
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], from, 0, sig,
                                             recvbuf + rspan[from].off, rspan[from].len, 0),
                         st, out);
    }
    for (int k = 1; k < P; k++) {
        int to = (r + k) % P;
        GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], to, 0, sig,
                                             sendbuf + sspan[to].off, sspan[to].len),
                         st, out);
    }
    if (rspan[r].len != sspan[r].len) {
        gcoll_channel_set_error(ctx->ch, "rank %d sends itself %zu bytes but expects %zu", r,
                                sspan[r].len, rspan[r].len);
        st = GCOLL_ERR_INVALID;
        goto out;
    }
    memmove(recvbuf + rspan[r].off, sendbuf + sspan[r].off, sspan[r].len);
    st = gcoll_channel_waitall(ctx->ch, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    free(req);
    return st;
}

gcoll_status_t gcoll_alltoallv_run(const gcoll_coll_t *ctx, const void *sendbuf,
                                   const size_t *scounts, const size_t *sdispls, void *recvbuf,
                                   const size_t *rcounts, const size_t *rdispls,
                                   gcoll_dtype_t dtype, int kind)
{
    const int P = ctx->size;
    const size_t esz = gcoll_dtype_size(dtype);
    gcoll_span_t *sp = calloc(2 * (size_t)P, sizeof(*sp)), *rp = sp + P;
    if (!sp)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < P; i++) {
        sp[i] = (gcoll_span_t){sdispls[i] * esz, scounts[i] * esz};
        rp[i] = (gcoll_span_t){rdispls[i] * esz, rcounts[i] * esz};
        ctx->ch->counters.bytes_raw += sp[i].len;
    }
    gcoll_status_t st =
        gcoll_alltoall_run(ctx, sendbuf, sp, recvbuf, rp, gcoll_call_sig(kind, 0, dtype, 0, 0));
    free(sp);
    return st;
}

/* Every rank sends sbuf[j] (slen[j] bytes) to rank j and receives at most rcap[j] bytes
 * from it into rbuf[j]; rlen[j] receives the length. Used where lengths are not known in
 * advance; the receive side checks them against the cap. */
gcoll_status_t gcoll_exchange_anylen(const gcoll_coll_t *ctx, uint32_t sub, uint32_t sig,
                                     uint8_t *const *sbuf, const size_t *slen, uint8_t *const *rbuf,
                                     const size_t *rcap, size_t *rlen)
{
    const int P = ctx->size, r = ctx->rank;
    gcoll_treq_t *req = calloc(2 * (size_t)P, sizeof(*req));
    if (!req)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    for (int k = 1; k < P; k++) {
        int from = (r - k + P) % P;
        if (rbuf[from])
            GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], from, sub, sig, rbuf[from],
                                                 rcap[from], GCOLL_TREQ_ANYLEN),
                             st, out);
    }
    for (int k = 1; k < P; k++) {
        int to = (r + k) % P;
        if (sbuf[to])
            GCOLL_CHECK_GOTO(
                gcoll_channel_isend(ctx->ch, &req[n++], to, sub, sig, sbuf[to], slen[to]), st, out);
    }
    GCOLL_CHECK_GOTO(gcoll_channel_waitall(ctx->ch, req, n), st, out);
    for (int i = 0; i < n; i++)
        if (req[i].flags & GCOLL_TREQ_ANYLEN)
            rlen[req[i].peer] = req[i].nbytes;
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    free(req);
    return st;
}
