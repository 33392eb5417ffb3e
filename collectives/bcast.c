/* bcast.c: broadcast (binomial tree for latency, pipelined chain for bandwidth) and the
 * dissemination barrier. */
#include <stdlib.h>

#include "coll.h"
#include "util.h"

/* Below this a binomial tree's log2(P) hops beat a chain's pipeline fill. */
#define BCAST_TREE_MAX 65536

static gcoll_status_t bcast_tree(gcoll_comm_t *comm, void *buf, size_t bytes, int root,
                                 uint32_t sig, uint32_t sub0)
{
    const int P = comm->size, vr = (comm->rank - root + P) % P;
    gcoll_treq_t req[33] = {0};
    int n = 0;
    gcoll_status_t st = GCOLL_OK;
    int mask = 1;
    /* Receive from the parent: the rank that differs in our lowest set bit. */
    while (mask < P) {
        if (vr & mask) {
            int parent = ((vr - mask) + root) % P;
            GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &req[n], parent, sub0, sig, buf, bytes, 0), st,
                             out);
            GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, &req[n], 1), st, out);
            n++;
            break;
        }
        mask <<= 1;
    }
    /* Send to children, largest subtree first. */
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < P) {
            int child = (vr + mask + root) % P;
            GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &req[n++], child, sub0, sig, buf, bytes), st, out);
        }
    }
    st = gcoll_net_waitall(comm, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, req, n + 1);
    return st;
}

/* Chain root -> root+1 -> ... in chunks: each rank forwards a chunk as soon as it has it. */
static gcoll_status_t bcast_chain(gcoll_comm_t *comm, void *buf, size_t bytes, int root,
                                  uint32_t sig, uint32_t sub0)
{
    const int P = comm->size, vr = (comm->rank - root + P) % P;
    const int prev = (comm->rank - 1 + P) % P, next = (comm->rank + 1) % P;
    size_t chunk = GCOLL_MAX(comm->cfg.coll.ring_chunk, (size_t)1);
    size_t nch = GCOLL_DIV_UP(bytes, chunk);
    gcoll_treq_t *rreq = calloc(2 * nch, sizeof(*rreq)), *sreq = rreq + nch;
    if (!rreq)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    uint8_t *p = buf;
    int has_next = vr + 1 < P;
    for (size_t c = 0; vr > 0 && c < nch; c++)
        GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &rreq[c], prev, sub0 + (uint32_t)c, sig, p + c * chunk,
                                         GCOLL_MIN(chunk, bytes - c * chunk), 0), st, out);
    for (size_t c = 0; c < nch; c++) {
        if (vr > 0)
            GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, &rreq[c], 1), st, out);
        if (has_next)
            GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &sreq[c], next, sub0 + (uint32_t)c, sig,
                                             p + c * chunk, GCOLL_MIN(chunk, bytes - c * chunk)),
                             st, out);
    }
    if (has_next)
        st = gcoll_net_waitall(comm, sreq, (int)nch);
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, rreq, (int)(2 * nch));
    free(rreq);
    return st;
}

gcoll_status_t gcoll_bcast_run(gcoll_comm_t *comm, void *buf, size_t bytes, int root,
                               uint32_t sig, uint32_t sub0)
{
    if (comm->size == 1)
        return GCOLL_OK;
    if (bytes <= BCAST_TREE_MAX || comm->size == 2)
        return bcast_tree(comm, buf, bytes, root, sig, sub0);
    return bcast_chain(comm, buf, bytes, root, sig, sub0);
}

gcoll_status_t gcoll_barrier_run(gcoll_comm_t *comm, uint32_t sig)
{
    const int P = comm->size;
    gcoll_treq_t req[2] = {0};
    gcoll_status_t st = GCOLL_OK;
    uint32_t round = 0;
    for (int k = 1; k < P; k <<= 1, round++) {
        GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &req[0], (comm->rank - k + P) % P, round, sig,
                                         NULL, 0, 0), st, out);
        GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &req[1], (comm->rank + k) % P, round, sig, NULL,
                                         0), st, out);
        GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, req, 2), st, out);
    }
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, req, 2);
    return st;
}
