/* ring.c: the ring, written once: a pipelined engine that runs reduce-scatter steps,
 * allgather steps, or both, over P segments of a buffer; allreduce, reduce-scatter and
 * allgather(v) are plans for it (Patarasuk & Yuan 2009). Every receive is posted up front
 * (reduce-scatter data into a temporary, allgather data straight into place), so no
 * message is ever unexpected and TCP's own flow control paces the sender; each chunk moves
 * to its next step as soon as it has arrived and been reduced. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "base/util.h"

static size_t mod(long a, long p)
{
    return (size_t)(((a % p) + p) % p);
}

/* Balanced split of n items into k parts: part i. */
static gcoll_span_t split(size_t n, size_t k, size_t i)
{
    size_t base = n / k, extra = n % k;
    return (gcoll_span_t){i * base + GCOLL_MIN(i, extra), base + (i < extra)};
}

/* Bytes [off, off+len) of chunk c of segment seg. */
static gcoll_span_t chunk_of(const gcoll_ring_plan_t *p, size_t seg, size_t c, size_t nch)
{
    gcoll_span_t e = split(p->seg[seg].len / p->esz, nch, c);
    return (gcoll_span_t){p->seg[seg].off + e.off * p->esz, e.len * p->esz};
}

/* Segment that step g sends / receives (see coll.h for the shifts). */
static size_t step_seg(const gcoll_ring_plan_t *p, long r, long P, size_t g, int recv)
{
    if (g < p->rs_steps)
        return mod(r + p->rs_shift - (long)g - recv, P);
    return mod(r + p->ag_shift - (long)(g - p->rs_steps) - recv, P);
}

/* Slices at least this large start with a handshake (see ring_run). Below it the receiver
 * copes with early data cheaply (small unexpected buffers), and the extra round trip
 * would show. */
#define RING_READY_MIN ((size_t)1 << 20)
#define NO_READY UINT32_MAX

/* The engine. With ready_sub != NO_READY, every rank tells its left neighbour (on tag
 * ready_sub) once its receives are posted, and sends to its right neighbour only after
 * hearing the same: otherwise a rank that finished the last collective early streams into
 * a neighbour still busy with it, and the transport must buffer that data as unexpected
 * (a fresh allocation, page faults and one more copy of every early chunk; measured on
 * loopback at 64 MiB, about a tenth of the chunks). */
/* The ring's sends, in the order the schedule makes them: order[0..queued) are due,
 * order[0..started) posted, order[0..reaped) seen complete. With a depth, at most depth
 * are posted and not yet complete (GCOLL_RING_DEPTH, as NCCL's steps in flight). */
typedef struct {
    size_t depth; /* 0: no limit */
    size_t *order;
    size_t queued, started, reaped;
} send_q_t;

/* Reaps completed sends and posts due ones the depth allows; *progressed is set when it
 * did either (NULL: not wanted). A due send's sreq entry holds peer, buf and len. */
static gcoll_status_t send_q_run(const gcoll_coll_t *ctx, send_q_t *q, gcoll_treq_t *sreq,
                                 const gcoll_ring_plan_t *p, int *progressed)
{
    /* completion only: a failed send's status is left to the final wait, as before the
     * depth existed (an early "connection reset" must not beat the abort that explains
     * it, a mismatch say) */
    while (q->reaped < q->started && sreq[q->order[q->reaped]].done) {
        q->reaped++;
        if (progressed)
            *progressed = 1;
    }
    while (q->started < q->queued && (q->depth == 0 || q->started - q->reaped < q->depth)) {
        size_t i = q->order[q->started++];
        gcoll_treq_t *s = &sreq[i];
        GCOLL_CHECK(gcoll_channel_isend(ctx->ch, s, s->peer, p->sub0 + (uint32_t)i, p->sig, s->buf,
                                        s->len));
        if (progressed)
            *progressed = 1;
    }
    return GCOLL_OK;
}

/* The handshake before a large slice (ready_sub, below): the left neighbour hears that
 * this rank's receives are posted, and this rank sends to the right one only once it has
 * heard the same from it. */
static gcoll_status_t ready_handshake(const gcoll_coll_t *ctx, int left, int right, uint32_t sub,
                                      uint32_t sig)
{
    gcoll_treq_t rd[2];
    GCOLL_CHECK(gcoll_channel_irecv(ctx->ch, &rd[0], right, sub, sig, NULL, 0, 0));
    gcoll_status_t st = gcoll_channel_isend(ctx->ch, &rd[1], left, sub, sig, NULL, 0);
    if (st == GCOLL_OK)
        st = gcoll_channel_waitall(ctx->ch, rd, 2);
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, rd, 2);
    return st;
}

static gcoll_status_t ring_run(const gcoll_coll_t *ctx, const gcoll_ring_plan_t *p,
                               uint32_t ready_sub)
{
    const long P = ctx->size, r = ctx->rank;
    const int right = (int)mod(r + 1, P), left = (int)mod(r - 1, P);
    const size_t nsteps = p->rs_steps + p->ag_steps;
    if (P == 1 || nsteps == 0)
        return GCOLL_OK;
    /* out of place: reduce-scatter data lands in buf, where the input is not */
    const int oop = p->src && p->src != p->buf && p->rs_steps > 0;
    const uint8_t *first = oop ? p->src : p->buf; /* what step 0 sends */
    size_t maxseg = 0;
    for (long i = 0; i < P; i++)
        maxseg = GCOLL_MAX(maxseg, p->seg[i].len / p->esz);
    size_t chunk_elems = GCOLL_MAX(ctx->cfg->ring_chunk / p->esz, (size_t)1);
    size_t nch = GCOLL_MAX(GCOLL_DIV_UP(maxseg, chunk_elems), (size_t)1);
    size_t nreq = nsteps * nch;
    gcoll_treq_t *rreq = calloc(2 * nreq, sizeof(*rreq)), *sreq = rreq + nreq;
    size_t *cur = calloc(nch, sizeof(*cur));
    /* GCOLL_RING_DEPTH: sends in order, at most depth of them in flight (0: no limit) */
    send_q_t q = {.depth = (size_t)ctx->cfg->ring_depth, .order = calloc(nreq, sizeof(size_t))};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!rreq || !cur || !q.order)
        goto out;
    st = GCOLL_OK;
    for (size_t g = 0; g < nsteps; g++) {
        for (size_t c = 0; c < nch; c++) {
            gcoll_span_t ch = chunk_of(p, step_seg(p, r, P, g, 1), c, nch);
            uint8_t *dst = (g < p->rs_steps && !oop ? p->tmp : p->buf) + ch.off;
            GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &rreq[g * nch + c], left,
                                                 p->sub0 + (uint32_t)(g * nch + c), p->sig, dst,
                                                 ch.len, 0),
                             st, out);
        }
    }
    if (ready_sub != NO_READY)
        GCOLL_CHECK_GOTO(ready_handshake(ctx, left, right, ready_sub, p->sig), st, out);
    for (size_t c = 0; c < nch; c++) {
        gcoll_span_t ch = chunk_of(p, step_seg(p, r, P, 0, 0), c, nch);
        sreq[c] = (gcoll_treq_t){.peer = right, .buf = (void *)(first + ch.off), .len = ch.len};
        q.order[q.queued++] = c;
    }
    GCOLL_CHECK_GOTO(send_q_run(ctx, &q, sreq, p, NULL), st, out);
    size_t finished = 0; /* chunks through every step */
    while (finished < nch) {
        int progressed = 0;
        GCOLL_CHECK_GOTO(send_q_run(ctx, &q, sreq, p, &progressed), st, out);
        for (size_t c = 0; c < nch; c++) {
            while (cur[c] < nsteps) {
                size_t g = cur[c];
                int done;
                GCOLL_CHECK_GOTO(gcoll_channel_done(ctx->ch, &rreq[g * nch + c], &done), st, out);
                if (!done)
                    break;
                progressed = 1;
                if (g < p->rs_steps) {
                    gcoll_span_t ch = chunk_of(p, step_seg(p, r, P, g, 1), c, nch);
                    if (oop)
                        gcoll_reduce_rev(p->buf + ch.off, p->src + ch.off, ch.len / p->esz,
                                         p->dtype, p->op);
                    else
                        gcoll_reduce_local(p->buf + ch.off, p->tmp + ch.off, ch.len / p->esz,
                                           p->dtype, p->op);
                }
                if (g + 1 < nsteps) {
                    gcoll_span_t ch = chunk_of(p, step_seg(p, r, P, g + 1, 0), c, nch);
                    sreq[(g + 1) * nch + c] =
                        (gcoll_treq_t){.peer = right, .buf = p->buf + ch.off, .len = ch.len};
                    q.order[q.queued++] = (g + 1) * nch + c;
                    GCOLL_CHECK_GOTO(send_q_run(ctx, &q, sreq, p, NULL), st, out);
                }
                if (++cur[c] == nsteps)
                    finished++;
            }
        }
        if (finished < nch && !progressed) {
            size_t c = 0;
            while (cur[c] == nsteps)
                c++;
            GCOLL_CHECK_GOTO(gcoll_channel_poll(ctx->ch, &rreq[cur[c] * nch + c]), st, out);
        }
    }
    while (q.started < q.queued) { /* sends the depth held back */
        int progressed = 0;
        GCOLL_CHECK_GOTO(send_q_run(ctx, &q, sreq, p, &progressed), st, out);
        if (!progressed && q.started < q.queued)
            GCOLL_CHECK_GOTO(gcoll_channel_poll(ctx->ch, &sreq[q.order[q.reaped]]), st, out);
    }
    st = gcoll_channel_waitall(ctx->ch, sreq, (int)nreq);
out:
    if (st != GCOLL_OK && rreq) /* the sends never started are all-zero: nothing to cancel */
        gcoll_channel_cancel(ctx->ch, rreq, (int)(2 * nreq));
    free(q.order);
    free(cur);
    free(rreq);
    return st;
}

gcoll_status_t gcoll_ring_run(const gcoll_coll_t *ctx, const gcoll_ring_plan_t *p)
{
    return ring_run(ctx, p, NO_READY);
}

gcoll_status_t gcoll_ring_run_ready(const gcoll_coll_t *ctx, const gcoll_ring_plan_t *p,
                                    uint32_t ready_sub)
{
    return ring_run(ctx, p, ready_sub);
}

/* The passes of both forms, in slices of at most GCOLL_RING_SLICE bytes so the temporary
 * stays bounded; sendbuf NULL (or recvbuf) means in place. */
static gcoll_status_t ring_allreduce(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                     size_t count, gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                     uint32_t sub0)
{
    const size_t P = (size_t)ctx->size, esz = gcoll_dtype_size(dtype);
    const int oop = sendbuf && sendbuf != recvbuf;
    if (count == 0)
        return GCOLL_OK;
    if (P == 1) {
        if (oop)
            memcpy(recvbuf, sendbuf, count * esz);
        return GCOLL_OK;
    }
    size_t slice = GCOLL_MAX(ctx->cfg->ring_slice / esz, P);
    size_t maxcount = GCOLL_MIN(count, slice);
    gcoll_span_t *seg = calloc(P, sizeof(*seg));
    /* out of place, reduce-scatter data is received into recvbuf: no temporary */
    uint8_t *tmp = oop ? NULL : gcoll_coll_scratch(ctx, maxcount * esz);
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if ((!oop && !tmp) || !seg) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the ring", maxcount * esz);
        goto out;
    }
    gcoll_ring_plan_t plan = {.tmp = tmp,
                              .seg = seg,
                              .esz = esz,
                              .dtype = dtype,
                              .op = op,
                              .rs_steps = P - 1,
                              .ag_steps = P - 1,
                              .rs_shift = 0,
                              .ag_shift = 1,
                              .sig = sig,
                              .sub0 = sub0};
    for (size_t off = 0; off < count; off += slice) {
        size_t n = GCOLL_MIN(slice, count - off);
        for (size_t i = 0; i < P; i++) {
            gcoll_span_t s = split(n, P, i);
            seg[i] = (gcoll_span_t){s.off * esz, s.len * esz};
        }
        plan.buf = (uint8_t *)recvbuf + off * esz;
        plan.src = oop ? (const uint8_t *)sendbuf + off * esz : NULL;
        /* data takes tags sub0 .. sub0 + 2 (P-1) nch - 1; the 2 P after them are free */
        uint32_t nsub = (uint32_t)(2 * (P - 1) *
                                   GCOLL_DIV_UP(GCOLL_DIV_UP(n, P),
                                                GCOLL_MAX(ctx->cfg->ring_chunk / esz, (size_t)1)));
        GCOLL_CHECK_GOTO(
            ring_run(ctx, &plan, n * esz >= RING_READY_MIN ? plan.sub0 + nsub : NO_READY), st, out);
        plan.sub0 += nsub + 2 * (uint32_t)P;
    }
    st = GCOLL_OK;
out:
    free(seg);
    return st;
}

gcoll_status_t gcoll_coll_ring_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                         gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                         uint32_t sub0)
{
    return ring_allreduce(ctx, NULL, recvbuf, count, dtype, op, sig, sub0);
}

gcoll_status_t gcoll_ring_allreduce_oop(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                        uint32_t sig)
{
    return ring_allreduce(ctx, sendbuf, recvbuf, count, dtype, op, sig, 0);
}
