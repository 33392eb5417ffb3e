/* compressed.h: pieces shared by the schemes of the compressed allreduce. Internal. */
#ifndef GCOLL_COMPRESSED_H
#define GCOLL_COMPRESSED_H

#include "coll.h"
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
#define GCOLL_CRING_SEG(ring_chunk) \
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
                                     gcoll_nancheck_t check, uint32_t sig);
/* The same decision on a communicator, for lib/ (api.c builds the context). */
int gcoll_topk_stream_eligible(gcoll_comm_t *comm, const gcoll_compressor_t *c, int ef,
                               size_t count, size_t k);

#endif /* GCOLL_COMPRESSED_H */
