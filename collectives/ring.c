/* ring.c: pipelined ring allreduce. Every receive is posted up front (reduce-scatter data
 * into a temporary, allgather data straight into place), so no message is ever unexpected
 * and TCP's own flow control paces the sender; each chunk moves to its next step as soon
 * as it has arrived and been reduced. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "reduce.h"
#include "util.h"

typedef struct {
    size_t off, len; /* elements */
} span_t;

/* Balanced split of n items into k parts: part i. */
static span_t split(size_t n, size_t k, size_t i)
{
    size_t base = n / k, extra = n % k;
    return (span_t){i * base + GCOLL_MIN(i, extra), base + (i < extra)};
}

static size_t mod(long a, long p) { return (size_t)(((a % p) + p) % p); }

/* One pass of the ring over buf[0..count). sub0 offsets the message tags of this pass. */
static gcoll_status_t ring_pass(gcoll_comm_t *comm, uint8_t *buf, uint8_t *tmp, size_t count,
                                size_t esz, gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                uint32_t sub0, gcoll_treq_t *reqs, size_t *cur)
{
    const long P = comm->size, r = comm->rank;
    const int right = (int)mod(r + 1, P), left = (int)mod(r - 1, P);
    const size_t nsteps = 2 * (size_t)(P - 1);
    size_t maxseg = split(count, (size_t)P, 0).len;
    size_t chunk_elems = GCOLL_MAX(comm->cfg.ring_chunk / esz, (size_t)1);
    size_t nch = GCOLL_MAX(GCOLL_DIV_UP(maxseg, chunk_elems), (size_t)1);
    gcoll_treq_t *rreq = reqs, *sreq = reqs + nsteps * nch;
    gcoll_status_t st = GCOLL_OK;

    /* Segment and chunk that step g receives / sends. */
#define RECV_SEG(g) ((g) < (size_t)(P - 1) ? mod(r - (long)(g)-1, P) : mod(r - (long)((g) - (P - 1)), P))
#define SEND_SEG(g) ((g) < (size_t)(P - 1) ? mod(r - (long)(g), P) : mod(r + 1 - (long)((g) - (P - 1)), P))
#define CHUNK(seg, c) ({                                                                  \
        span_t s_ = split(count, (size_t)P, (seg));                                       \
        span_t c_ = split(s_.len, nch, (c));                                              \
        (span_t){s_.off + c_.off, c_.len};                                                \
    })

    for (size_t g = 0; g < nsteps; g++) {
        for (size_t c = 0; c < nch; c++) {
            span_t ch = CHUNK(RECV_SEG(g), c);
            uint8_t *dst = (g < (size_t)(P - 1) ? tmp : buf) + ch.off * esz;
            GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &rreq[g * nch + c], left,
                                             sub0 + (uint32_t)(g * nch + c), sig, dst,
                                             ch.len * esz, 0), st, out);
        }
    }
    for (size_t c = 0; c < nch; c++) {
        span_t ch = CHUNK(SEND_SEG(0), c);
        GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &sreq[c], right, sub0 + (uint32_t)c, sig,
                                         buf + ch.off * esz, ch.len * esz), st, out);
        cur[c] = 0;
    }
    size_t finished = 0; /* chunks through every step */
    while (finished < nch) {
        int progressed = 0;
        for (size_t c = 0; c < nch; c++) {
            while (cur[c] < nsteps) {
                size_t g = cur[c];
                int done;
                GCOLL_CHECK_GOTO(gcoll_net_done(comm, &rreq[g * nch + c], &done), st, out);
                if (!done)
                    break;
                progressed = 1;
                if (g < (size_t)(P - 1)) {
                    span_t ch = CHUNK(RECV_SEG(g), c);
                    gcoll_reduce(buf + ch.off * esz, tmp + ch.off * esz, ch.len, dtype, op);
                }
                if (g + 1 < nsteps) {
                    span_t ch = CHUNK(SEND_SEG(g + 1), c);
                    GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &sreq[(g + 1) * nch + c], right,
                                                     sub0 + (uint32_t)((g + 1) * nch + c), sig,
                                                     buf + ch.off * esz, ch.len * esz), st, out);
                }
                if (++cur[c] == nsteps)
                    finished++;
            }
        }
        if (finished < nch && !progressed)
            GCOLL_CHECK_GOTO(gcoll_net_poll(comm, &rreq[cur[0] < nsteps ? cur[0] * nch : 0]), st,
                             out);
    }
    st = gcoll_net_waitall(comm, sreq, (int)(nsteps * nch));
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, reqs, (int)(2 * nsteps * nch));
    return st;
#undef RECV_SEG
#undef SEND_SEG
#undef CHUNK
}

gcoll_status_t gcoll_ring_allreduce(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig)
{
    const size_t P = (size_t)comm->size, esz = gcoll_dtype_size(dtype);
    if (P == 1 || count == 0)
        return GCOLL_OK;
    /* Passes of at most ring_slice bytes bound the temporary; a pass needs >= P elements
     * per rank to keep every link busy, so slices never go below that. */
    size_t slice = GCOLL_MAX(comm->cfg.ring_slice / esz, P);
    size_t maxcount = GCOLL_MIN(count, slice);
    size_t maxnch = GCOLL_MAX(GCOLL_DIV_UP(GCOLL_DIV_UP(maxcount, P),
                                           GCOLL_MAX(comm->cfg.ring_chunk / esz, (size_t)1)),
                              (size_t)1);
    size_t nreq = 2 * 2 * (P - 1) * maxnch;
    uint8_t *tmp = malloc(maxcount * esz);
    gcoll_treq_t *reqs = calloc(nreq, sizeof(*reqs));
    size_t *cur = calloc(maxnch, sizeof(*cur));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!tmp || !reqs || !cur) {
        gcoll_comm_set_error(comm, "cannot allocate %zu bytes for the ring", maxcount * esz);
        goto out;
    }
    uint32_t sub0 = 0;
    for (size_t off = 0; off < count; off += slice) {
        size_t n = GCOLL_MIN(slice, count - off);
        memset(reqs, 0, nreq * sizeof(*reqs));
        st = ring_pass(comm, (uint8_t *)recvbuf + off * esz, tmp, n, esz, dtype, op, sig, sub0,
                       reqs, cur);
        if (st != GCOLL_OK)
            break;
        sub0 += (uint32_t)nreq;
    }
out:
    free(cur);
    free(reqs);
    free(tmp);
    return st;
}
