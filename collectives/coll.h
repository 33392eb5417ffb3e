/* coll.h: the context the algorithms run with, and the algorithms shared between
 * collectives, written once against it. */
#ifndef GCOLL_COLL_H
#define GCOLL_COLL_H

#include <stdlib.h>

#include "collectives/channel.h"
#include "base/config.h"

/* Kinds of collective call, hashed into message signatures. */
enum {
    GCOLL_KIND_ALLREDUCE = 1,
    GCOLL_KIND_BROADCAST,
    GCOLL_KIND_BARRIER,
    GCOLL_KIND_ALLGATHER,
    GCOLL_KIND_ALLGATHERV,
    GCOLL_KIND_REDUCE_SCATTER,
    GCOLL_KIND_ALLTOALL,
    GCOLL_KIND_ALLTOALLV,
    GCOLL_KIND_SPARSE,
    GCOLL_KIND_COMPRESSED,
    GCOLL_KIND_REDUCE,
    GCOLL_KIND_GATHER,
    GCOLL_KIND_SCATTER,
};

/* Allreduce algorithms (GCOLL_ALGO). */
typedef enum {
    GCOLL_ALGO_AUTO,
    GCOLL_ALGO_RING,
    GCOLL_ALGO_RHD,
    GCOLL_ALGO_TREE,
    GCOLL_ALGO_RD
} gcoll_algo_t;
extern const char *const gcoll_algo_names[];

typedef struct {
    size_t off, len;
} gcoll_span_t;

/* The figures of the alpha-beta-gamma cost model (select.c says how they were fitted): ns
 * per step, per byte on the wire, per byte reduced. The rooted collectives' choice
 * (rooted.c) uses them too. */
#define GCOLL_COST_ALPHA_NS 80000.0
#define GCOLL_COST_BETA_NS 0.5
#define GCOLL_COST_GAMMA_NS 0.05

/* The steps of a binomial tree or recursive doubling over p ranks: ceil(log2 p). */
static inline int gcoll_ceil_log2(int p)
{
    int l = 0;
    while ((1 << l) < p)
        l++;
    return l;
}

/* A temporary kept across operations: large buffers malloc'ed and freed per call are
 * mapped and faulted in afresh every time (a third of the CPU time of a 64 MiB
 * allreduce). Grown, never shrunk; the owner frees p. */
typedef struct {
    void *p;
    size_t len;
} gcoll_coll_scratch_t;

/* What an algorithm runs with: the running operation's channel (its transport, tags,
 * deadline, counters and error message), the ranks, the collectives' settings, the
 * owner's scratch and host layout. Built by the entry points from the communicator
 * (comm.h) for one operation; the algorithms never see the communicator. */
typedef struct gcoll_coll {
    gcoll_channel_t *ch;
    int rank, size;
    const gcoll_coll_cfg_t *cfg;
    gcoll_coll_scratch_t *scratch;
    struct gcoll_hier *hier; /* NULL until a hierarchical call learned it (hier.h) */
} gcoll_coll_t;

/* The scratch, at least len bytes; only for the running operation; NULL on ENOMEM. */
static inline void *gcoll_coll_scratch(const gcoll_coll_t *ctx, size_t len)
{
    gcoll_coll_scratch_t *s = ctx->scratch;
    if (len > s->len) {
        free(s->p);
        s->p = malloc(len);
        s->len = s->p ? len : 0;
    }
    return s->p;
}

/* A ring over P segments seg[0..P) (byte spans of buf). rs_steps reduce-scatter steps
 * (0 or P-1), then ag_steps allgather steps (0 or P-1). At reduce-scatter step g rank r
 * sends segment r+rs_shift-g and receives (into tmp, at the same offset) and reduces
 * segment r+rs_shift-g-1, so it ends owning r+rs_shift+1; at allgather step k it sends
 * r+ag_shift-k and receives r+ag_shift-k-1 in place. With both, ag_shift = rs_shift+1.
 * With src set (an out-of-place reduce-scatter, src != buf), src holds this rank's input
 * and buf is only output: step 0 sends from src, and reduce-scatter data is received
 * straight into buf and reduced there with src, so tmp is not needed and no copy of the
 * input into buf is made. */
typedef struct {
    uint8_t *buf;
    uint8_t *tmp;
    const uint8_t *src;
    const gcoll_span_t *seg;
    size_t esz;
    gcoll_dtype_t dtype;
    gcoll_op_t op;
    size_t rs_steps, ag_steps;
    long rs_shift, ag_shift;
    uint32_t sig, sub0;
} gcoll_ring_plan_t;

gcoll_status_t gcoll_ring_run(const gcoll_coll_t *ctx, const gcoll_ring_plan_t *plan);
/* The same, starting with the handshake of ring_allreduce's large slices (ring.c): each
 * rank tells its left neighbour on tag ready_sub that its receives are posted, and sends
 * to its right one only after hearing the same, so no data arrives unexpected. */
gcoll_status_t gcoll_ring_run_ready(const gcoll_coll_t *ctx, const gcoll_ring_plan_t *plan,
                                    uint32_t ready_sub);

/* Ring allreduce over recvbuf, which already holds this rank's input, its message tags
 * starting at sub0 (0 for a call of its own; else it is one phase of a collective).
 * Pipelined by GCOLL_RING_CHUNK, in passes of at most GCOLL_RING_SLICE bytes. Does not
 * finish AVG. */
gcoll_status_t gcoll_coll_ring_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                         gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                         uint32_t sub0);
/* Out-of-place ring allreduce: sendbuf is read, recvbuf written, and no copy of one into
 * the other is made (the copy is folded into the first reduction). Does not finish AVG. */
gcoll_status_t gcoll_ring_allreduce_oop(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                        uint32_t sig);

/* Recursive halving reduce-scatter + recursive doubling allgather with the
 * non-power-of-two fix-up (Rabenseifner; Thakur, Rabenseifner & Gropp 2005). */
gcoll_status_t gcoll_rhd_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                   gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig);

/* Recursive doubling: log2 P exchanges of the whole vector (latency-bound sizes). */
gcoll_status_t gcoll_rd_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                  gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig);
/* The same with message tags starting at sub0 (for use inside another operation). */
gcoll_status_t gcoll_rd_allreduce_at(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                     gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig,
                                     uint32_t sub0);

/* Binomial-tree reduce to rank 0, then binomial broadcast: 2 log2 P latency-bound steps. */
gcoll_status_t gcoll_tree_allreduce(const gcoll_coll_t *ctx, void *recvbuf, size_t count,
                                    gcoll_dtype_t dtype, gcoll_op_t op, uint32_t sig);

/* Picks the allreduce algorithm by the alpha-beta cost model, or GCOLL_ALGO; deterministic
 * from (count, dtype, P) so every rank picks the same. why (unless NULL) receives the reason. */
gcoll_algo_t gcoll_algo_select(const gcoll_coll_t *ctx, size_t bytes, char *why, size_t len);

/* Broadcast of bytes from root: binomial tree for small messages, pipelined chain for large. */
gcoll_status_t gcoll_bcast_run(const gcoll_coll_t *ctx, void *buf, size_t bytes, int root,
                               uint32_t sig, uint32_t sub0);

/* Dissemination barrier (Hensgen, Finkel & Manber 1988): ceil(log2 P) rounds. */
gcoll_status_t gcoll_barrier_run(const gcoll_coll_t *ctx, uint32_t sig);

/* Allgatherv on the ring: rank i's block (rcounts[i] elements at rdispls[i] of recvbuf)
 * to every rank, this rank's from sendbuf; kind (GCOLL_KIND_ALLGATHER or _ALLGATHERV)
 * goes into the signature with the count table. */
gcoll_status_t gcoll_allgatherv_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                    const size_t *rcounts, const size_t *rdispls,
                                    gcoll_dtype_t dtype, int kind);

/* Reduce-scatter on the ring: block r (n elements) of the P blocks of sendbuf, reduced
 * over the ranks, into recvbuf on rank r; AVG finished. */
gcoll_status_t gcoll_reduce_scatter_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t n, gcoll_dtype_t dtype, gcoll_op_t op);

/* Alltoallv: scounts[i] elements at sdispls[i] of sendbuf to rank i, rcounts[i] from it at
 * rdispls[i] of recvbuf (gcoll_alltoall_run); kind goes into the signature. */
gcoll_status_t gcoll_alltoallv_run(const gcoll_coll_t *ctx, const void *sendbuf,
                                   const size_t *scounts, const size_t *sdispls, void *recvbuf,
                                   const size_t *rcounts, const size_t *rdispls,
                                   gcoll_dtype_t dtype, int kind);

/* Pairwise exchange: block i of sendbuf (sspan[i]) to rank i, block from rank i into
 * rspan[i] of recvbuf; all transfers posted at once. */
gcoll_status_t gcoll_alltoall_run(const gcoll_coll_t *ctx, const uint8_t *sendbuf,
                                  const gcoll_span_t *sspan, uint8_t *recvbuf,
                                  const gcoll_span_t *rspan, uint32_t sig);

/* Every rank sends sbuf[j] (slen[j] bytes) to rank j and receives at most rcap[j] bytes
 * from it into rbuf[j] (rlen[j] receives the length), for exchanges whose lengths are not
 * known in advance; NULL buffers are skipped, and so is this rank's own entry. */
gcoll_status_t gcoll_exchange_anylen(const gcoll_coll_t *ctx, uint32_t sub, uint32_t sig,
                                     uint8_t *const *sbuf, const size_t *slen, uint8_t *const *rbuf,
                                     const size_t *rcap, size_t *rlen);

/* ---- rooted collectives (rooted.c) ---- */

/* Algorithms of reduce, gather and scatter (GCOLL_ROOTED_ALGO): a binomial tree, or the
 * large-message form (reduce: ring reduce-scatter then the blocks to the root; gather and
 * scatter: direct transfers between the root and every rank), or (reduce only; gather and
 * scatter take the tree) a chain: a pipeline from the root's predecessor round to it, or
 * linear (reduce: every rank's vector straight to the root; gather and scatter: direct). */
typedef enum {
    GCOLL_ROOTED_AUTO,
    GCOLL_ROOTED_TREE,
    GCOLL_ROOTED_DIRECT,
    GCOLL_ROOTED_CHAIN,
    GCOLL_ROOTED_LINEAR
} gcoll_rooted_algo_t;
extern const char *const gcoll_rooted_algo_names[];
/* A rooted call's message of this many bytes or more goes only once its receiver has said
 * that the receive is posted (rooted.c's READY_MIN). */
#define GCOLL_ROOTED_READY_MIN ((size_t)64 << 10)
/* The smallest mailbox record worth cutting the reduce tree's segments to. */
#define GCOLL_ROOTED_MESH_MIN ((size_t)4 << 10)

/* Place of virtual rank vr (rank - root, modulo P) in the binomial tree of P ranks: its
 * parent (-1 at the root), its children vr + 2^c for c < nchild, and the size of its
 * subtree, which holds virtual ranks vr .. vr + size - 1. */
typedef struct {
    int parent, nchild, size;
} gcoll_tree_pos_t;
gcoll_tree_pos_t gcoll_tree_pos(int vr, int P);

/* The algorithm for kind (GCOLL_KIND_REDUCE, _GATHER, _SCATTER) and bytes per rank (the
 * vector of a reduce, one rank's block of a gather or scatter), by the cost model or
 * GCOLL_ROOTED_ALGO; the same on every rank that passes the same arguments. why (unless
 * NULL) receives the reason. */
gcoll_rooted_algo_t gcoll_rooted_select(const gcoll_coll_t *ctx, int kind, size_t bytes, char *why,
                                        size_t len);

/* Reduce of count elements to root's recvbuf (in place when sendbuf == recvbuf there;
 * unused elsewhere); AVG finished. */
gcoll_status_t gcoll_reduce_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, gcoll_op_t op, int root,
                                gcoll_rooted_algo_t algo);
/* Gather of every rank's count elements into root's recvbuf, in rank order (in place when
 * sendbuf is the root's own block of recvbuf), and scatter, its mirror image. */
gcoll_status_t gcoll_gather_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, int root,
                                gcoll_rooted_algo_t algo);
gcoll_status_t gcoll_scatter_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                 size_t count, gcoll_dtype_t dtype, int root,
                                 gcoll_rooted_algo_t algo);

#endif /* GCOLL_COLL_H */
