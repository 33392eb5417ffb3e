/* p2p_api.c: public entry points of point-to-point and group calls: argument checks, then
 * lib/core/group.c's queued operations. */
#include "api/checks.h"
#include "base/log.h"
#include "base/util.h"
#include "core/comm.h"
#include "core/ops.h"

static gcoll_status_t check_p2p(gcoll_comm_t *comm, const char *what, const void *buf, size_t count,
                                gcoll_dtype_t dtype, int peer, int nonblocking,
                                gcoll_request_t **req_p)
{
    GCOLL_CHECK(gcoll_api_check_common(comm, what, count, dtype));
    GCOLL_CHECK(
        gcoll_comm_check_args(comm, what, count == 0 || buf, "NULL buffer with count %zu", count));
    GCOLL_CHECK(gcoll_api_check_rank(comm, what, "peer", peer));
    return gcoll_comm_check_args(comm, what, !nonblocking || req_p, "NULL request pointer");
}

gcoll_status_t gcoll_isend(gcoll_comm_t *comm, const void *buf, size_t count, gcoll_dtype_t dtype,
                           int peer, gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_p2p(comm, "gcoll_isend", buf, count, dtype, peer, 1, req_p));
    return gcoll_op_p2p(comm, "gcoll_isend", GCOLL_P2P_SEND, buf, NULL, count, dtype, peer, req_p);
}

gcoll_status_t gcoll_send(gcoll_comm_t *comm, const void *buf, size_t count, gcoll_dtype_t dtype,
                          int peer)
{
    GCOLL_CHECK(check_p2p(comm, "gcoll_send", buf, count, dtype, peer, 0, NULL));
    return gcoll_op_p2p(comm, "gcoll_send", GCOLL_P2P_SEND, buf, NULL, count, dtype, peer, NULL);
}

gcoll_status_t gcoll_irecv(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                           int peer, gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_p2p(comm, "gcoll_irecv", buf, count, dtype, peer, 1, req_p));
    return gcoll_op_p2p(comm, "gcoll_irecv", GCOLL_P2P_RECV, NULL, buf, count, dtype, peer, req_p);
}

gcoll_status_t gcoll_recv(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                          int peer)
{
    GCOLL_CHECK(check_p2p(comm, "gcoll_recv", buf, count, dtype, peer, 0, NULL));
    return gcoll_op_p2p(comm, "gcoll_recv", GCOLL_P2P_RECV, NULL, buf, count, dtype, peer, NULL);
}

static gcoll_status_t check_any(gcoll_comm_t *comm, const char *what, const void *buf, size_t count,
                                gcoll_dtype_t dtype, int nonblocking, gcoll_request_t **req_p)
{
    GCOLL_CHECK(gcoll_api_check_common(comm, what, count, dtype));
    GCOLL_CHECK(
        gcoll_comm_check_args(comm, what, count == 0 || buf, "NULL buffer with count %zu", count));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, !nonblocking || req_p, "NULL request pointer"));
    return gcoll_comm_check_args(comm, what, !gcoll_comm_in_group(comm),
                                 "a receive from any source cannot join a group (a group posts "
                                 "its receives before any message arrives, and this one's "
                                 "sender is known only then): issue it outside "
                                 "gcoll_group_start/gcoll_group_end");
}

gcoll_status_t gcoll_irecv_any(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                               int *source, gcoll_request_t **req_p)
{
    if (source)
        *source = -1;
    GCOLL_CHECK(check_any(comm, "gcoll_irecv_any", buf, count, dtype, 1, req_p));
    return gcoll_op_p2p_any(comm, "gcoll_irecv_any", buf, count, dtype, source, req_p);
}

gcoll_status_t gcoll_recv_any(gcoll_comm_t *comm, void *buf, size_t count, gcoll_dtype_t dtype,
                              int *source)
{
    if (source)
        *source = -1;
    GCOLL_CHECK(check_any(comm, "gcoll_recv_any", buf, count, dtype, 0, NULL));
    return gcoll_op_p2p_any(comm, "gcoll_recv_any", buf, count, dtype, source, NULL);
}

gcoll_status_t gcoll_group_start(gcoll_comm_t *comm)
{
    if (!comm) {
        GCOLL_WARN("gcoll_group_start: NULL communicator");
        return GCOLL_ERR_INVALID;
    }
    return gcoll_op_group_start(comm);
}

gcoll_status_t gcoll_group_end(gcoll_comm_t *comm)
{
    if (!comm) {
        GCOLL_WARN("gcoll_group_end: NULL communicator");
        return GCOLL_ERR_INVALID;
    }
    return gcoll_op_group_end(comm);
}
