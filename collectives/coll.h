/* coll.h: algorithms shared between collectives, written once against comm.h. */
#ifndef GCOLL_COLL_H
#define GCOLL_COLL_H

#include "comm.h"

/* Kinds of collective call, hashed into message signatures. */
enum {
    GCOLL_KIND_ALLREDUCE = 1,
    GCOLL_KIND_BROADCAST,
    GCOLL_KIND_BARRIER,
};

/* Ring allreduce (reduce-scatter then allgather, Patarasuk & Yuan 2009) over recvbuf,
 * which already holds this rank's input. Pipelined by GCOLL_RING_CHUNK, in passes of at
 * most GCOLL_RING_SLICE bytes. Does not finish AVG. */
gcoll_status_t gcoll_ring_allreduce(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig);

/* Broadcast of count elements from root: binomial tree for small messages, pipelined chain
 * for large ones. */
gcoll_status_t gcoll_bcast_run(gcoll_comm_t *comm, void *buf, size_t bytes, int root,
                               uint32_t sig);

/* Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(log2 P) rounds. */
gcoll_status_t gcoll_barrier_run(gcoll_comm_t *comm, uint32_t sig);

#endif /* GCOLL_COLL_H */
