/* ops.h: the queued operations shared by the entry points (lib/api) and the library's own
 * callers (split, teardown, the bucketer, adaptation), and the collectives inside a running
 * operation of a communicator. Arguments are trusted: the entry points check them. */
#ifndef GCOLL_OPS_H
#define GCOLL_OPS_H

#include "collectives/compressed/compressed.h"
#include "core/comm.h"

/* A request for run with arguments a, submitted (req_p NULL: waited for). On failure to
 * allocate, a->release(a->ext) runs. */
gcoll_status_t gcoll_op_submit(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                               gcoll_args_t *a, gcoll_request_t **req_p);
/* The same for a call that takes no sequence number among the collectives (point-to-point). */
gcoll_status_t gcoll_op_submit_noseq(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                                     gcoll_args_t *a, gcoll_request_t **req_p);

/* Per-rank counts and displacements of the v-collectives, one allocation, copied at the
 * call so that the caller may reuse its arrays at once (NULL arrays are left NULL). */
typedef struct {
    size_t *rcounts, *rdispls, *scounts, *sdispls;
    size_t storage[];
} gcoll_vargs_t;
gcoll_vargs_t *gcoll_vargs_new(int P, const size_t *rc, const size_t *rd, const size_t *sc,
                               const size_t *sd);

/* Dense allreduce (through the hierarchy where it decides so) and allgather(v). */
gcoll_status_t gcoll_op_iallreduce(gcoll_comm_t *comm, const char *what, const void *sendbuf,
                                   void *recvbuf, size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                   gcoll_request_t **req_p);
gcoll_status_t gcoll_op_allreduce(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                                  gcoll_op_t op);
/* The run function of a flat dense allreduce (a group fuses consecutive ones: group.c). */
gcoll_status_t gcoll_op_run_allreduce(gcoll_comm_t *comm, gcoll_request_t *req);
/* Point-to-point (group.c): kind GCOLL_P2P_SEND or _RECV, peer in a->root. */
enum { GCOLL_P2P_SEND = 1, GCOLL_P2P_RECV = 2 };
gcoll_status_t gcoll_op_p2p(gcoll_comm_t *comm, const char *what, int kind, const void *sendbuf,
                            void *recvbuf, size_t count, gcoll_dtype_t dtype, int peer,
                            gcoll_request_t **req_p);
/* A receive from any source (group.c): the sender's rank goes to *source (NULL: not
 * wanted) once a message is matched; -1 until then. Not inside a group (the caller checks). */
gcoll_status_t gcoll_op_p2p_any(gcoll_comm_t *comm, const char *what, void *recvbuf, size_t count,
                                gcoll_dtype_t dtype, int *source, gcoll_request_t **req_p);
/* Groups (group.c): gcoll_group_start/end's work, arguments checked. */
gcoll_status_t gcoll_op_group_start(gcoll_comm_t *comm);
gcoll_status_t gcoll_op_group_end(gcoll_comm_t *comm);
gcoll_status_t gcoll_op_iallgatherv(gcoll_comm_t *comm, const char *what, int kind,
                                    const void *sendbuf, size_t sendcount, void *recvbuf,
                                    const size_t *recvcounts, const size_t *displs,
                                    gcoll_dtype_t dtype, gcoll_request_t **req_p);
gcoll_status_t gcoll_op_iallgather(gcoll_comm_t *comm, const char *what, const void *sendbuf,
                                   void *recvbuf, size_t sendcount, gcoll_dtype_t dtype,
                                   gcoll_request_t **req_p);

/* ---- inside a running operation of comm: the ring allreduce with tags from 0 or from
 * sub0, and recursive doubling (log2 P latencies: for a few bytes) ---- */
gcoll_status_t gcoll_ring_allreduce(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig);
gcoll_status_t gcoll_ring_allreduce_at(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                       gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                       uint32_t sub0);
gcoll_status_t gcoll_small_allreduce_at(gcoll_comm_t *comm, void *recvbuf, size_t count,
                                        gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                        uint32_t sub0);
/* The step plan of the next compressed call on s with count elements on comm (its
 * scheme: collectives/compressed/compressed.c decides). */
void gcoll_compressed_plan(const gcoll_comm_t *comm, const gcoll_tensor_state_t *s, size_t count,
                           int shard_only, gcoll_step_plan_t *plan);

/* Compressed allreduce (shard_only: reduce-scatter) from inside a running operation;
 * check: GCOLL_NANCHECK_DONE where the caller verified grad is finite, else
 * GCOLL_NANCHECK_SCAN; plan: the call's (gcoll_compressed_plan), or NULL to make it here. */
gcoll_status_t gcoll_compressed_run(gcoll_comm_t *comm, gcoll_tensor_state_t *s, const float *grad,
                                    float *out, size_t count, gcoll_op_t op, int shard_only,
                                    gcoll_nancheck_t check, const gcoll_step_plan_t *plan);
/* The two stages of gcoll_encoded_t (collectives/compressed/compressed.h) on comm: the
 * encode stage makes the call's plan (e->plan) and the exchange runs by it; the
 * exchange returns e->st when the encode failed (with e->err, if set, as comm's error). */
gcoll_status_t gcoll_compressed_encode_stage(const gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                             const float *grad, size_t count, gcoll_op_t op,
                                             gcoll_nancheck_t check, gcoll_encoded_t *e);
gcoll_status_t gcoll_compressed_exchange_stage(gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                               gcoll_encoded_t *e, const float *grad, float *out,
                                               size_t count, gcoll_op_t op, gcoll_nancheck_t check);

#endif /* GCOLL_OPS_H */
