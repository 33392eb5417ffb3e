/* bcast.c: broadcast (binomial tree for latency, pipelined chain for bandwidth) and the
 * dissemination barrier. */
#include <stdlib.h>

#include "collectives/coll.h"
#include "base/util.h"

/* Below this a binomial tree's log2(P) hops beat a chain's pipeline fill. */
#define BCAST_TREE_MAX 65536

static gcoll_status_t bcast_tree(const gcoll_coll_t *ctx, void *buf, size_t bytes, int root,
                                 uint32_t sig, uint32_t sub0)
{
    const int P = ctx->size, vr = (ctx->rank - root + P) % P;
    gcoll_treq_t req[33] = {0};
    int n = 0;
    gcoll_status_t st = GCOLL_OK;
    int mask = 1;
    /* Receive from the parent: the rank that differs in our lowest set bit. */
    while (mask < P) {
        if (vr & mask) {
            int parent = ((vr - mask) + root) % P;
            GCOLL_CHECK_GOTO(
                gcoll_channel_irecv(ctx->ch, &req[n], parent, sub0, sig, buf, bytes, 0), st, out);
            GCOLL_CHECK_GOTO(gcoll_channel_waitall(ctx->ch, &req[n], 1), st, out);
            n++;
            break;
        }
        mask <<= 1;
    }
    /* Send to children, largest subtree first. */
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < P) {
            int child = (vr + mask + root) % P;
            GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], child, sub0, sig, buf, bytes),
                             st, out);
        }
    }
    st = gcoll_channel_waitall(ctx->ch, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n + 1);
    return st;
}

/* Chain root -> root+1 -> ... in chunks: each rank forwards a chunk as soon as it has it. */
static gcoll_status_t bcast_chain(const gcoll_coll_t *ctx, void *buf, size_t bytes, int root,
                                  uint32_t sig, uint32_t sub0)
{
    const int P = ctx->size, vr = (ctx->rank - root + P) % P;
    const int prev = (ctx->rank - 1 + P) % P, next = (ctx->rank + 1) % P;
    size_t chunk = GCOLL_MAX(ctx->cfg->ring_chunk, (size_t)1);
    size_t nch = GCOLL_DIV_UP(bytes, chunk);
    gcoll_treq_t *rreq = calloc(2 * nch, sizeof(*rreq)), *sreq = rreq + nch;
    if (!rreq)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    uint8_t *p = buf;
    int has_next = vr + 1 < P;
    for (size_t c = 0; vr > 0 && c < nch; c++)
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &rreq[c], prev, sub0 + (uint32_t)c, sig,
                                             p + c * chunk, GCOLL_MIN(chunk, bytes - c * chunk), 0),
                         st, out);
    for (size_t c = 0; c < nch; c++) {
        if (vr > 0)
            GCOLL_CHECK_GOTO(gcoll_channel_waitall(ctx->ch, &rreq[c], 1), st, out);
        if (has_next)
            GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &sreq[c], next, sub0 + (uint32_t)c, sig,
                                                 p + c * chunk,
                                                 GCOLL_MIN(chunk, bytes - c * chunk)),
                             st, out);
    }
    if (has_next)
        st = gcoll_channel_waitall(ctx->ch, sreq, (int)nch);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, rreq, (int)(2 * nch));
    free(rreq);
    return st;
}

gcoll_status_t gcoll_bcast_run(const gcoll_coll_t *ctx, void *buf, size_t bytes, int root,
                               uint32_t sig, uint32_t sub0)
{
    if (ctx->size == 1)
        return GCOLL_OK;
    if (bytes <= BCAST_TREE_MAX || ctx->size == 2)
        return bcast_tree(ctx, buf, bytes, root, sig, sub0);
    return bcast_chain(ctx, buf, bytes, root, sig, sub0);
}

gcoll_status_t gcoll_barrier_run(const gcoll_coll_t *ctx, uint32_t sig)
{
    const int P = ctx->size;
    gcoll_treq_t req[2] = {0};
    gcoll_status_t st = GCOLL_OK;
    uint32_t round = 0;
    for (int k = 1; k < P; k <<= 1, round++) {
        GCOLL_CHECK_GOTO(
            gcoll_channel_irecv(ctx->ch, &req[0], (ctx->rank - k + P) % P, round, sig, NULL, 0, 0),
            st, out);
        GCOLL_CHECK_GOTO(
            gcoll_channel_isend(ctx->ch, &req[1], (ctx->rank + k) % P, round, sig, NULL, 0), st,
            out);
        GCOLL_CHECK_GOTO(gcoll_channel_waitall(ctx->ch, req, 2), st, out);
    }
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, 2);
    return st;
}
