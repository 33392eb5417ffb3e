/* sparse_api.h: the sparse allreduce's internal entry, for tests of a misbehaving peer. */
#ifndef GCOLL_SPARSE_API_H
#define GCOLL_SPARSE_API_H

#include "gcoll.h"

/* Internal entry with switches for tests of a misbehaving peer: GCOLL_SPARSE_NOCHECK skips
 * the local argument checks, GCOLL_SPARSE_BADCOUNT announces a wrong dense size on the
 * wire. Never used by the library itself. */
enum { GCOLL_SPARSE_NOCHECK = 1, GCOLL_SPARSE_BADCOUNT = 2 };
gcoll_status_t gcoll_sparse_submit(gcoll_comm_t *comm, const uint32_t *idx, const float *val,
                                   size_t nnz, size_t dense_count, float *out, gcoll_op_t op,
                                   unsigned flags, gcoll_request_t **req_p);

#endif /* GCOLL_SPARSE_API_H */
