/* checks.h: the argument checks the entry points share (lib/api): each returns GCOLL_OK or
 * GCOLL_ERR_INVALID with the reason as the communicator's error (gcoll_comm_check_args). */
#ifndef GCOLL_API_CHECKS_H
#define GCOLL_API_CHECKS_H

#include "core/comm.h"

/* A communicator (NULL: logged), a known dtype, and count elements of it that fit. */
gcoll_status_t gcoll_api_check_common(gcoll_comm_t *comm, const char *what, size_t count,
                                      gcoll_dtype_t dtype);
/* A known op that the reduction kernels apply to dtype (after gcoll_api_check_common). */
gcoll_status_t gcoll_api_check_op(gcoll_comm_t *comm, const char *what, gcoll_dtype_t dtype,
                                  gcoll_op_t op);
/* r is a rank of comm; role names it in the error ("root", "peer"). */
gcoll_status_t gcoll_api_check_rank(gcoll_comm_t *comm, const char *what, const char *role, int r);

#endif /* GCOLL_API_CHECKS_H */
