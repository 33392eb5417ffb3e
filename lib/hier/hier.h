/* hier.h: hosts and hierarchical (two-level) allreduce: the host layout of a communicator,
 * the GCOLL_HIER decision, and the runs built on child communicators per host and across
 * hosts. Internal. */
#ifndef GCOLL_HIER_H
#define GCOLL_HIER_H

#include "collectives/coll.h"

#define GCOLL_HIER_HOSTLEN 64                   /* bytes of a host name exchanged (NUL included) */
#define GCOLL_HIER_AUTO_MIN ((size_t)256 << 10) /* GCOLL_HIER=auto: flat below this */

/* A communicator's host layout (learned once, collectively) and its child communicators
 * (made at the first hierarchical call). */
typedef struct gcoll_hier {
    int nhosts, host; /* hosts, and this rank's host index (order of first rank) */
    int local_rank, local_size;
    int max_local;  /* most ranks on one host */
    int uniform;    /* every host has local_size ranks */
    int ring_cross; /* most ring edges r -> r+1 leaving one host (flat ring load) */
    int *host_of;   /* host index of every rank */
    char name[GCOLL_HIER_HOSTLEN];
    gcoll_comm_t *local; /* the ranks of this host, by rank */
    gcoll_comm_t *rail;  /* uniform: the ranks of this local rank on every host (one
                          * per host); else the leaders (local rank 0) only; NULL for
                          * a rank in none */
    int split;           /* the children were made */
    uint8_t *shm;        /* local_size slots of shm_slot bytes shared by the host's ranks
                          * (hier_shm.c), NULL before the first use */
    size_t shm_slot;
    int shm_off; /* shared memory could not be set up: loopback instead */
} gcoll_hier_t;

/* What the GCOLL_HIER=auto cost estimate knows. */
typedef struct {
    int size, nhosts, max_local, uniform, ring_cross;
    double bw_inter, bw_intra;       /* bytes/s of one host's link, and inside a host */
    double alpha_inter, alpha_intra; /* seconds per message */
    double alpha_op;                 /* seconds per child collective a hierarchical run adds */
    double wire_ratio;               /* bytes on the inter-host wire per dense byte (1 dense) */
    double encode_s_per_byte;        /* codec time per dense input byte (0 dense) */
    int sparse_result;               /* the result inside the host travels as pairs, at
                                      * wire_ratio of the dense bytes (sparsifiers) */
} gcoll_hier_model_t;

/* The model's defaults: a 10 Gbit/s host link (or the GCOLL_PROBE bandwidth), 5 GB/s
 * inside a host, 25 us / 5 us per message, 30 us per child collective. */
void gcoll_hier_model_defaults(gcoll_hier_model_t *m, double probe_bw);

/* Estimated seconds of a flat and of a hierarchical allreduce of bytes (dense bytes). */
void gcoll_hier_estimate(const gcoll_hier_model_t *m, size_t bytes, double *flat_s, double *hier_s);

/* Whether to run hierarchically: mode is the config's (0 auto, 1 off, 2 on). Off, one
 * host, or one rank per host: flat. On: hierarchical. Auto: hierarchical when the
 * estimate is lower. why (not NULL) receives the reason. Pure: the same on every rank. */
int gcoll_hier_decide(int mode, const gcoll_hier_model_t *m, size_t bytes, char *why, size_t len);

/* Host layout from every rank's name (names[r], NUL-terminated): fills h (host_of
 * allocated; free with gcoll_hier_free). GCOLL_ERR_NOMEM. */
gcoll_status_t gcoll_hier_layout_from(gcoll_hier_t *h, const char *const *names, int size,
                                      int rank);

/* The layout of comm, exchanged over comm at the first call (collective then, from the
 * caller's thread), cached after. */
gcoll_status_t gcoll_hier_layout(gcoll_comm_t *comm, gcoll_hier_t **h_p);

/* Whether an allreduce of bytes dense bytes (wire_ratio and encode cost as in the model)
 * runs hierarchically on comm; makes the layout and the children when it does (collective:
 * every rank of comm decides the same and calls in the same order). *use_p = 0 or 1. */
gcoll_status_t gcoll_hier_use(gcoll_comm_t *comm, const char *what, size_t bytes, double wire_ratio,
                              double encode_s_per_byte, int sparse_result, int *use_p);

/* One hierarchical call: its kind and arguments (checked by the entry point; the pairs
 * are the request's copies). */
enum { GCOLL_HIER_DENSE, GCOLL_HIER_SPARSE, GCOLL_HIER_COMPRESSED };
typedef struct {
    int kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    gcoll_dtype_t dtype;
    gcoll_op_t op;
    uint32_t *idx; /* sparse */
    float *val;
    size_t nnz;
    gcoll_tensor_state_t *state; /* compressed */
} gcoll_hier_call_t;

/* Runs call as one operation of the parent (ctx, whose hierarchy has its children) whose
 * steps are collectives of the children (hier_run.c); their traffic counts as the
 * parent's. */
gcoll_status_t gcoll_hier_run(const gcoll_coll_t *ctx, const gcoll_hier_call_t *call);

/* The hierarchical forms, queued on comm like the flat ones (arguments already checked). */
gcoll_status_t gcoll_hier_iallreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                     gcoll_request_t **req_p);
gcoll_status_t gcoll_hier_isparse(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                  size_t nnz, size_t dense_count, float *out, gcoll_op_t op,
                                  gcoll_request_t **req_p);
gcoll_status_t gcoll_hier_icompressed(gcoll_comm_t *comm, gcoll_tensor_state_t *state,
                                      const float *grad, float *out, size_t count, gcoll_op_t op,
                                      gcoll_request_t **req_p);

/* Shared memory inside the host (uniform hosts): makes (collectively over h->local) or
 * grows the segment to slots of slot_bytes; *ok_p = 0 when it cannot (the same on every
 * local rank; loopback then). */
gcoll_status_t gcoll_hier_shm_ensure(gcoll_hier_t *h, size_t slot_bytes, int *ok_p);
/* Reduce-scatter through the segment: in[0, L * part) of every local rank summed (op) into
 * out[lr * part, (lr + 1) * part) of local rank lr, in local-rank order. */
gcoll_status_t gcoll_hier_shm_reduce_scatter(gcoll_hier_t *h, const void *in, void *out,
                                             size_t part, gcoll_dtype_t dtype, gcoll_op_t op);
/* Allgather through the segment: every local rank's out[lr * part, (lr + 1) * part) into
 * every rank's out[0, L * part). */
gcoll_status_t gcoll_hier_shm_allgather(gcoll_hier_t *h, void *out, size_t part,
                                        gcoll_dtype_t dtype);
void gcoll_hier_shm_free(gcoll_hier_t *h);

/* gcoll_hier_release and gcoll_hier_abort are declared in comm.h (comm.c calls them);
 * hier.c defines them, with the layout, the decision and the requests. */
void gcoll_hier_free(gcoll_hier_t *h);

#endif /* GCOLL_HIER_H */
