/* lifecycle.c: the collectives of a communicator's life cycle: the bandwidth probe at init
 * and the closing handshake of gcoll_comm_destroy (lib/core/dispatch.h). */
#include <stdlib.h>

#include "collectives/coll.h"
#include "collectives/guard.h"
#include "core/dispatch.h"
#include "base/util.h"
#include "core/ops.h"

/* GCOLL_PROBE=1: two ring allgathers of PROBE_BYTES per rank, the first warming the
 * connections (TCP's slow start, UCX's wire-up), the second timed; every rank takes the
 * slowest rank's time, so the ring's slowest link governs and every rank holds the same
 * estimate (adaptation starts from it instead of from its first step). */
#define PROBE_BYTES (1u << 20)
static gcoll_status_t probe(gcoll_comm_t *comm, double *bytes_per_s)
{
    size_t n = PROBE_BYTES / sizeof(float);
    float *buf = calloc((size_t)comm->size * n, sizeof(float));
    if (!buf)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    double secs = 0;
    for (int round = 0; round < 2 && st == GCOLL_OK; round++) {
        uint64_t t0 = gcoll_time_ns();
        st = gcoll_op_iallgather(comm, "gcoll_comm_destroy", buf + (size_t)comm->rank * n, buf, n,
                                 GCOLL_FLOAT32, NULL);
        secs = (double)(gcoll_time_ns() - t0) * 1e-9;
    }
    if (st == GCOLL_OK)
        st = gcoll_op_allreduce(comm, &secs, 1, GCOLL_FLOAT64, GCOLL_MAX);
    free(buf);
    if (st != GCOLL_OK)
        return st;
    double bytes = (double)(comm->size - 1) * PROBE_BYTES; /* what a rank sends */
    *bytes_per_s = secs > 0 ? bytes / secs : 0;
    GCOLL_INFO(GCOLL_SUBSYS_ADAPT,
               "probe: %.1f MB/s per rank (the slowest rank sent %.0f "
               "bytes in %.2f ms)",
               *bytes_per_s / 1e6, bytes, secs * 1e3);
    return GCOLL_OK;
}

/* The closing handshake of gcoll_comm_destroy, run as the communicator's last operation:
 * an empty message to every peer and one from every peer. A rank leaves only once every
 * peer has entered destroy, that is, completed every operation that involves this rank;
 * the messages still in flight when it closes precede its close on the wire, and every
 * transport delivers them before it reports the close (MPI_Finalize and ncclCommFinalize
 * are collective for the same reason). All to all rather than a dissemination barrier: a
 * rank that passed a barrier knows the others entered it, not that they received its last
 * round; here each one waits for nothing but its peers' own arrival. */
#define GCOLL_KIND_CLOSE 0x434c4f53 /* "CLOS": not a collective kind (coll.h) */
static gcoll_status_t run_close(gcoll_comm_t *comm, gcoll_request_t *req)
{
    (void)req;
    const int P = comm->size;
    gcoll_channel_t *ch = &comm->chan;
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_CLOSE, 0, 0, 0, 0);
    gcoll_treq_t *r = calloc(2 * (size_t)P, sizeof(*r));
    if (!r)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    /* this rank's calls are over: a peer's close must not find the receives of the rooted
     * calls' probes pending (a probe that still comes is dropped with the communicator) */
    gcoll_guard_retire(ch);
    /* receives first: a peer's message finds its receive posted */
    for (int k = 1; k < P && st == GCOLL_OK; k++, n++)
        st = gcoll_channel_irecv(ch, &r[n], (comm->rank + P - k) % P, 0, sig, NULL, 0, 0);
    for (int k = 1; k < P && st == GCOLL_OK; k++, n++)
        st = gcoll_channel_isend(ch, &r[n], (comm->rank + k) % P, 0, sig, NULL, 0);
    if (st == GCOLL_OK)
        st = gcoll_channel_waitall(ch, r, n);
    if (st != GCOLL_OK) {
        gcoll_channel_set_error(ch, "the closing handshake failed: %s",
                                gcoll_channel_last_error(ch));
        gcoll_channel_cancel(ch, r, n);
    }
    free(r);
    return st;
}

const gcoll_coll_dispatch_t gcoll_coll_dispatch = {.close = run_close, .probe = probe};
