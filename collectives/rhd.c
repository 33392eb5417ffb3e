/* rhd.c: allreduce by recursive halving (reduce-scatter) and recursive doubling
 * (allgather), with the fix-up that folds a non-power-of-two rank count into the largest
 * power of two below it (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005). */
#include <stdlib.h>

#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "base/util.h"

/* Real rank of a rank in the power-of-two group: the first 2*rem ranks pair up and only
 * the odd one of each pair stays. */
static int real_rank(int nr, int rem)
{
    return nr < rem ? 2 * nr + 1 : nr + rem;
}

/* Sends one span and receives another with a partner, then waits for both. */
static gcoll_status_t exchange(const gcoll_coll_t *ctx, int peer, uint32_t sub, uint32_t sig,
                               const uint8_t *sbuf, size_t slen, uint8_t *rbuf, size_t rlen)
{
    gcoll_treq_t req[2] = {0};
    gcoll_status_t st;
    int n = 0;
    if (rbuf)
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], peer, sub, sig, rbuf, rlen, 0), st,
                         out);
    if (sbuf)
        GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], peer, sub, sig, sbuf, slen), st,
                         out);
    st = gcoll_channel_waitall(ctx->ch, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, 2);
    return st;
}

/* The largest power of two p2 <= P (*steps_p = log2 p2) that the algorithms below run on;
 * the P - p2 extra ranks fold in before and out after. */
static int pow2_group(int P, int *steps_p)
{
    int p2 = 1, steps = 0;
    while (p2 * 2 <= P) {
        p2 *= 2;
        steps++;
    }
    *steps_p = steps;
    return p2;
}

typedef void (*reduce_fn_t)(void *dst, const void *src, size_t n, gcoll_dtype_t dtype,
                            gcoll_op_t op);

/* Fold-in: the first 2*rem ranks pair up, the even one sends its whole vector to the odd
 * one, which combines it (with fold, in the operand order its algorithm keeps) and stays.
 * *nr_p: the rank in the power-of-two group, -1 if folded away. */
static gcoll_status_t fold_in(const gcoll_coll_t *ctx, int rem, uint32_t sub, uint32_t sig,
                              uint8_t *buf, uint8_t *tmp, size_t count, gcoll_dtype_t dtype,
                              gcoll_op_t op, reduce_fn_t fold, int *nr_p)
{
    const int r = ctx->rank;
    const size_t bytes = count * gcoll_dtype_size(dtype);
    *nr_p = r - rem;
    if (r >= 2 * rem)
        return GCOLL_OK;
    *nr_p = r % 2 ? r / 2 : -1;
    if (r % 2 == 0)
        return exchange(ctx, r + 1, sub, sig, buf, bytes, NULL, 0);
    GCOLL_CHECK(exchange(ctx, r - 1, sub, sig, NULL, 0, tmp, bytes));
    fold(buf, tmp, count, dtype, op);
    return GCOLL_OK;
}

/* Fold-out: the odd rank of each pair hands the result back (message `sub`). */
static gcoll_status_t fold_out(const gcoll_coll_t *ctx, int rem, uint32_t sub, uint32_t sig,
                               uint8_t *buf, size_t bytes)
{
    const int r = ctx->rank;
    if (r >= 2 * rem)
        return GCOLL_OK;
    if (r % 2 == 1)
        return exchange(ctx, r - 1, sub, sig, buf, bytes, NULL, 0);
    return exchange(ctx, r + 1, sub, sig, NULL, 0, buf, bytes);
}

gcoll_status_t gcoll_rhd_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                   gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig)
{
    const int P = ctx->size;
    const size_t esz = gcoll_dtype_size(dtype);
    if (P == 1 || count == 0)
        return GCOLL_OK;
    int steps, p2 = pow2_group(P, &steps);
    const int rem = P - p2;
    uint8_t *buf = recvbuf, *tmp = gcoll_coll_scratch(ctx, count * esz);
    size_t *lo = malloc(((size_t)steps + 1) * 2 * sizeof(size_t)), *hi = lo ? lo + steps + 1 : NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!tmp || !lo)
        goto out;
    int nr; /* rank in the power-of-two group, -1 if folded away */
    GCOLL_CHECK_GOTO(fold_in(ctx, rem, 0, sig, buf, tmp, count, dtype, op, gcoll_reduce_local, &nr),
                     st, out);
    if (nr >= 0) {
        /* Halving: at each step keep one half of the current range and reduce into it. */
        lo[0] = 0;
        hi[0] = count;
        for (int s = 0, mask = p2 / 2; mask >= 1; s++, mask /= 2) {
            int pnr = nr ^ mask, peer = real_rank(pnr, rem);
            size_t mid = lo[s] + (hi[s] - lo[s]) / 2;
            size_t klo = nr < pnr ? lo[s] : mid, khi = nr < pnr ? mid : hi[s];
            size_t slo = nr < pnr ? mid : lo[s], shi = nr < pnr ? hi[s] : mid;
            GCOLL_CHECK_GOTO(exchange(ctx, peer, 1 + (uint32_t)s, sig, buf + slo * esz,
                                      (shi - slo) * esz, tmp + klo * esz, (khi - klo) * esz),
                             st, out);
            gcoll_reduce_local(buf + klo * esz, tmp + klo * esz, khi - klo, dtype, op);
            lo[s + 1] = klo;
            hi[s + 1] = khi;
        }
        /* Doubling: retrace the steps, swapping the fully reduced halves in place. */
        for (int s = steps - 1, mask = 1; s >= 0; s--, mask *= 2) {
            int peer = real_rank(nr ^ mask, rem);
            size_t olo = lo[s + 1] == lo[s] ? hi[s + 1] : lo[s];
            size_t ohi = lo[s + 1] == lo[s] ? hi[s] : lo[s + 1];
            GCOLL_CHECK_GOTO(exchange(ctx, peer, 1 + (uint32_t)(steps + s), sig,
                                      buf + lo[s + 1] * esz, (hi[s + 1] - lo[s + 1]) * esz,
                                      buf + olo * esz, (ohi - olo) * esz),
                             st, out);
        }
    }
    st = fold_out(ctx, rem, 1 + 2 * (uint32_t)steps, sig, buf, count * esz);
out:
    free(lo);
    return st;
}

/* Recursive doubling: log2(P) exchanges of the whole vector, for latency-bound sizes (one
 * message time per step where a binomial tree needs two, reduce then broadcast). Partners
 * combine in one order, lower group rank first (gcoll_reduce_rev on the upper one), so both
 * hold the same bits after every step and all ranks end identical whatever the op.
 * Non-power-of-two rank counts fold in and out as gcoll_rhd_allreduce does. */
gcoll_status_t gcoll_rd_allreduce_at(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                     gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                     uint32_t sub0)
{
    const int P = ctx->size;
    const size_t bytes = count * gcoll_dtype_size(dtype);
    if (P == 1 || count == 0)
        return GCOLL_OK;
    int steps, p2 = pow2_group(P, &steps);
    const int rem = P - p2;
    uint8_t *buf = recvbuf, *tmp = gcoll_coll_scratch(ctx, bytes);
    if (!tmp)
        return GCOLL_ERR_NOMEM;
    int nr; /* rank in the power-of-two group, -1 if folded away */
    GCOLL_CHECK(fold_in(ctx, rem, sub0, sig, buf, tmp, count, dtype, op, gcoll_reduce_rev, &nr));
    for (int s = 0, mask = 1; nr >= 0 && mask < p2; s++, mask <<= 1) {
        int pnr = nr ^ mask;
        GCOLL_CHECK(exchange(ctx, real_rank(pnr, rem), sub0 + 1 + (uint32_t)s, sig, buf, bytes, tmp,
                             bytes));
        if (nr < pnr)
            gcoll_reduce_local(buf, tmp, count, dtype, op);
        else
            gcoll_reduce_rev(buf, tmp, count, dtype, op);
    }
    return fold_out(ctx, rem, sub0 + 1 + (uint32_t)steps, sig, buf, bytes);
}

gcoll_status_t gcoll_rd_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                  gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig)
{
    return gcoll_rd_allreduce_at(ctx, recvbuf, count, dtype, op, sig, 0);
}

gcoll_status_t gcoll_tree_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    const size_t esz = gcoll_dtype_size(dtype), bytes = count * esz;
    if (P == 1 || count == 0)
        return GCOLL_OK;
    uint8_t *tmp = gcoll_coll_scratch(ctx, bytes);
    if (!tmp)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    /* Binomial reduce to rank 0: children (r + 2^k) first, then send to the parent. */
    uint32_t sub = 0;
    for (int mask = 1; mask < P; mask <<= 1, sub++) {
        if (r & mask) {
            GCOLL_CHECK_GOTO(exchange(ctx, r - mask, sub, sig, recvbuf, bytes, NULL, 0), st, out);
            break;
        }
        if (r + mask < P) {
            GCOLL_CHECK_GOTO(exchange(ctx, r + mask, sub, sig, NULL, 0, tmp, bytes), st, out);
            gcoll_reduce_local(recvbuf, tmp, count, dtype, op);
        }
    }
    st = gcoll_bcast_run(ctx, recvbuf, bytes, 0, sig, 64);
out:
    return st;
}
