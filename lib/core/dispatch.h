/* dispatch.h: the collectives the communicator's life cycle runs, the one table through
 * which lib/core/comm.c reaches collectives/ (the calls users make come with their own run
 * function in the request). */
#ifndef GCOLL_DISPATCH_H
#define GCOLL_DISPATCH_H

#include "core/comm.h"

typedef struct {
    /* The closing handshake, gcoll_comm_destroy's last operation on a healthy
     * communicator of more than one rank. */
    gcoll_run_fn_t close;
    /* GCOLL_PROBE=1 at init, once the progress thread runs: the bandwidth in bytes per
     * second per rank, the same on every rank. Collective; blocks. */
    gcoll_status_t (*probe)(gcoll_comm_t *comm, double *bytes_per_s);
} gcoll_coll_dispatch_t;

extern const gcoll_coll_dispatch_t gcoll_coll_dispatch;

#endif /* GCOLL_DISPATCH_H */
