/* sparse.h: the sparse allreduce engine, shared by gcoll_sparse_allreduce and the
 * compressed allreduce of sparsifying codecs. */
#ifndef GCOLL_SPARSE_H
#define GCOLL_SPARSE_H

#include "collectives/coll.h"
#include "compress/compress.h"

typedef enum { GCOLL_SPARSE_ALLGATHER, GCOLL_SPARSE_SPLIT, GCOLL_SPARSE_DENSE } gcoll_sparse_plan_t;
enum { GCOLL_SPARSE_AUTO = 0 }; /* GCOLL_SPARSE_ALGO: 0 auto, else plan + 1 */
extern const char *const gcoll_sparse_plan_names[];

/* Sorted, distinct (index, value) pairs. */
typedef struct {
    uint32_t *idx;
    float *val;
    size_t n;
} gcoll_pairs_t;

/* One rank's contribution: its pairs, and the same pairs as a self-describing message of
 * codec (NULL: f32 values) that the allgather plan sends as is. pairs->idx may be NULL
 * with only pairs->n set: the plans that need the pairs then decode them from msg. */
typedef struct {
    const gcoll_compressor_t *codec;
    const gcoll_pairs_t *pairs;
    const void *msg;
    size_t msglen;
    size_t count;
    float *out;
    gcoll_op_t op; /* SUM or AVG */
    int kind;      /* hashed into the signature: which call this is */
    uint32_t sig;  /* signature of the caller's call (0: derived from kind, count and op) */
} gcoll_sparse_call_t;

/* Copies, sorts and merges repeated indices (no validation: callers check first). */
gcoll_status_t gcoll_sparse_prepare(const uint32_t *idx, const float *val, size_t nnz,
                                    gcoll_pairs_t *p);
void gcoll_pairs_free(gcoll_pairs_t *p);

/* Runs the sparse allreduce; *plan_p (if not NULL) receives the plan used. */
gcoll_status_t gcoll_sparse_run(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *call,
                                gcoll_sparse_plan_t *plan_p);

#endif /* GCOLL_SPARSE_H */
