/* compressed.h: pieces shared by the schemes of the compressed allreduce. Internal. */
#ifndef GCOLL_COMPRESSED_H
#define GCOLL_COMPRESSED_H

#include "collectives/coll.h"
#include "compress/compress.h"

/* The balanced split of count elements over P ranks: chunk j (the first count % P chunks
 * one element longer). Rank j owns chunk j in both schemes. */
static inline gcoll_span_t gcoll_even_chunk(size_t count, int P, int j)
{
    size_t base = count / (size_t)P, extra = count % (size_t)P;
    return (gcoll_span_t){(size_t)j * base + GCOLL_MIN((size_t)j, extra),
                          base + ((size_t)j < extra)};
}

/* Makes sure s->server is a server-mode state of n elements (a new, zero residual when
 * the chunk length changed). */
gcoll_status_t gcoll_compressed_server_state(gcoll_tensor_state_t *s, size_t n);

/* Elements per compressed message of the ring scheme for count elements over P ranks:
 * GCOLL_RING_CHUNK / 8 (a segment of floats half the dense ring's chunk in bytes),
 * at least GCOLL_CRING_MIN_SEG (each message carries ~100 bytes of
 * headers), at most one rank's chunk, doubled until every (step, segment) pair has its
 * own tag below the phase bits. The ring and gcoll_compressed_scheme both use it. */
#define GCOLL_CRING_MIN_SEG 1024
#define GCOLL_CRING_SEG(ring_chunk)                                                                \
    GCOLL_MAX((ring_chunk) / (2 * sizeof(float)), (size_t)GCOLL_CRING_MIN_SEG)
size_t gcoll_cring_segment(size_t ring_chunk, size_t count, int P);

/* The pipelined ring with re-quantization at every hop (compressed_ring.c). */
gcoll_status_t gcoll_compressed_ring(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     int shard_only, gcoll_nancheck_t check, uint32_t sig);

/* Top-k with its selection pass streamed to the other ranks (topk_stream.c): elements
 * per segment (GCOLL_TOPK_STREAM, widened for very large tensors; 0: off), whether a
 * compressed allreduce of count elements with compressor c (error feedback ef, k values
 * this step) takes that path, and the path itself. */
size_t gcoll_topk_stream_segment(const gcoll_coll_t *ctx, size_t count);
int gcoll_coll_topk_stream_eligible(const gcoll_coll_t *ctx, const gcoll_compressor_t *c, int ef,
                                    size_t count, size_t k);
gcoll_status_t gcoll_topk_stream_run(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     gcoll_nancheck_t check, const gcoll_step_plan_t *plan,
                                     uint32_t sig);

/* A compressed allreduce in two stages, for a caller that encodes ahead of its turn on the
 * wire (the bucketer's codec worker, lib/bucket/bucket_sched.c). The encode stage is local work
 * only -- the scheme's choice, the selection or quantization, the error-feedback update --
 * reads only the communicator's rank, size and configuration and writes only the state and
 * e, so it may run on any thread while the progress thread runs other operations (the
 * state's owner keeps everyone else off the state meanwhile). The exchange stage, in the
 * operation's turn on the progress thread, sends, reduces and decodes. Together they give
 * bit for bit what gcoll_compressed_run gives: the same encode of the same state at the
 * same step, then the same exchange. Only schemes whose encode precedes all traffic are
 * split (the sparse allgather and allreduce of top-k and DGC, random-k's dense values);
 * for the others (dense, the quantizers' schemes, streamed top-k) the encode stage leaves
 * staged 0 and the exchange stage runs gcoll_compressed_run whole, with the same plan. */
typedef struct {
    int staged;             /* the encode ran: the exchange stage sends what it made */
    gcoll_step_plan_t plan; /* the call's (gcoll_coll_compressed_plan, before the encode) */
    gcoll_status_t st;      /* of the encode */
    char err[256];          /* the caller's reason for st (the exchange stage reports it) */
    uint32_t sig;
    uint8_t *msg; /* the message (grown, kept across steps) */
    size_t cap, len;
    uint32_t *idx; /* random-k: the k values at their indices (grown, kept) */
    float *val;
    size_t k, kcap;
    uint64_t ns; /* the encode's time, counted as codec time by the exchange stage */
} gcoll_encoded_t;

void gcoll_encoded_free(gcoll_encoded_t *e);

/* ---- the same on the collectives' context, for lib/api/compressed_api.c ---- */
/* The plan of a call of c on count elements (the codec's, gcoll_codec_plan, at the
 * state's step; s NULL: past its warm-up) with its scheme (a number the functions below
 * take) and why; the scheme's name, whether the feedback pass may fold the NaN/Inf check
 * into it, whether it is the ring, whether it is streamed top-k. */
void gcoll_coll_compressed_plan(const gcoll_coll_t *ctx, const gcoll_compressor_t *c,
                                const gcoll_tensor_state_t *s, size_t count, int shard_only,
                                gcoll_step_plan_t *plan);
const char *gcoll_coll_compressed_name(int scheme);
/* Schemes are numbered 0 .. GCOLL_COMPRESSED_SCHEMES - 1; the calls each ran in this
 * process (every rank's, where ranks share it), for tests. */
#define GCOLL_COMPRESSED_SCHEMES 6
uint64_t gcoll_coll_compressed_runs(int scheme);
int gcoll_coll_compressed_foldable(int scheme);
int gcoll_coll_compressed_is_ring(int scheme);
int gcoll_coll_compressed_is_stream(int scheme);
/* The call by the plan (of this state at its step); check: its NaN/Inf policy. */
gcoll_status_t gcoll_coll_compressed_run(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                         const float *grad, float *out, size_t count, gcoll_op_t op,
                                         int shard_only, gcoll_nancheck_t check,
                                         const gcoll_step_plan_t *plan);
/* The two stages; e->plan is the call's, made by the caller before the encode stage. */
gcoll_status_t gcoll_coll_compressed_encode(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                            const float *grad, size_t count, gcoll_op_t op,
                                            gcoll_nancheck_t check, gcoll_encoded_t *e);
gcoll_status_t gcoll_coll_compressed_exchange(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                              gcoll_encoded_t *e, float *out, size_t count,
                                              gcoll_op_t op);

#endif /* GCOLL_COMPRESSED_H */
