/* gcoll.h: the only public API of gcoll, compression-aware collectives. */
#ifndef GCOLL_H
#define GCOLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(GCOLL_BUILDING_LIBRARY)
#define GCOLL_EXPORT __attribute__((visibility("default")))
#else
#define GCOLL_EXPORT
#endif

/*
 * Conventions that hold for every function below unless it says otherwise:
 * - Output arguments come last and are written only on success.
 * - A communicator is used by one application thread at a time; collectives on one
 *   communicator must be issued in the same order on every rank (as in MPI and NCCL).
 * - Every blocking call returns within GCOLL_TIMEOUT_MS of the last progress of its
 *   peers: a dead or silent peer yields GCOLL_ERR_PEER or GCOLL_ERR_TIMEOUT, never a hang.
 * - After a collective fails, the communicator is broken: every later call on it returns
 *   GCOLL_ERR_ABORTED (the original reason stays in gcoll_comm_last_error()). Its peers
 *   are told, so they fail too instead of waiting for their timeout.
 * - sendbuf == recvbuf means in place. count == 0 is valid and does nothing but order.
 */

#define GCOLL_VERSION_MAJOR 0
#define GCOLL_VERSION_MINOR 1
#define GCOLL_VERSION_PATCH 0

typedef enum {
    GCOLL_OK = 0,
    GCOLL_INPROGRESS = 1,
    GCOLL_ERR_INVALID = -1,     /* bad argument or malformed input */
    GCOLL_ERR_NOMEM = -2,       /* allocation failed */
    GCOLL_ERR_TRANSPORT = -3,   /* network or transport-level failure */
    GCOLL_ERR_TIMEOUT = -4,     /* a wait passed GCOLL_TIMEOUT_MS */
    GCOLL_ERR_PEER = -5,        /* a peer died, closed its connection or aborted */
    GCOLL_ERR_MISMATCH = -6,    /* ranks disagree (counts, settings, version) */
    GCOLL_ERR_UNSUPPORTED = -7, /* valid request this build or transport cannot do */
    GCOLL_ERR_ABORTED = -8,     /* the communicator was aborted or broken earlier */
    GCOLL_ERR_INTERNAL = -9     /* a bug in gcoll */
} gcoll_status_t;

/* Element types. Every collective that only moves bytes (broadcast, allgather(v),
 * alltoall(v)) takes every dtype; the reductions take the (dtype, op) pairs below.
 * Each combination of two values is computed once and rounded once to the dtype:
 * - float types: fp16, bf16 and both fp8 are computed in fp32 and rounded to nearest even;
 *   NaN operands give NaN for SUM/PROD/AVG; MIN and MAX keep the first operand when one
 *   is NaN (so the result may depend on the order ranks combine in).
 * - integer types: SUM and PROD wrap as the type does (modulo 2^bits); AVG is the wrapped
 *   sum divided by the rank count, truncated toward zero.
 * - bool (one byte, 0 is false, anything else true; a combined value is 0 or 1, on one rank
 *   the input is copied as it is): SUM, MAX and BOR are logical or; PROD, MIN and BAND
 *   logical and; BXOR exclusive or (PyTorch's mapping).
 * - BAND, BOR, BXOR are bitwise for the integer types and bool. They, and AVG on bool, are
 *   GCOLL_ERR_INVALID for a float type, with the reason in gcoll_comm_last_error().
 * Values are appended at the end: existing values never change. */
typedef enum {
    GCOLL_FLOAT32,
    GCOLL_FLOAT16,  /* IEEE binary16, reduced in fp32 */
    GCOLL_BFLOAT16, /* reduced in fp32 */
    GCOLL_FLOAT64,
    GCOLL_INT32,
    GCOLL_INT64,
    GCOLL_BOOL, /* one byte per value, as C's bool and PyTorch's torch.bool */
    GCOLL_INT8,
    GCOLL_UINT8,
    GCOLL_INT16,
    GCOLL_UINT32,
    GCOLL_UINT64,
    /* OCP 8-bit floating point (OFP8, v1.0, 2023): E4M3 is "fn": bias 7, no infinities,
     * S.1111.111 is NaN, largest 448, and a result beyond 464 (an infinity included) is NaN,
     * as PyTorch's float8_e4m3fn conversion gives; E5M2 is IEEE-like: bias 15, largest
     * 57344, overflow to infinity. Reduced in fp32, rounded to nearest even once. */
    GCOLL_FLOAT8_E4M3,
    GCOLL_FLOAT8_E5M2
} gcoll_dtype_t;

typedef enum {
    GCOLL_SUM,
    GCOLL_AVG,
    GCOLL_MIN,
    GCOLL_MAX,
    GCOLL_PROD,
    GCOLL_BAND, /* bitwise and (integer types and bool) */
    GCOLL_BOR,  /* bitwise or */
    GCOLL_BXOR  /* bitwise exclusive or */
} gcoll_op_t;

typedef struct gcoll_comm gcoll_comm_t;
typedef struct gcoll_request gcoll_request_t;

/* ------------------------------------------------------------------------ */
/* Library information                                                       */

/* "MAJOR.MINOR.PATCH". Never blocks; thread safe. */
GCOLL_EXPORT const char *gcoll_version(void);

/* Human-readable name of a status ("GCOLL_ERR_TIMEOUT: timed out"). Never NULL. */
GCOLL_EXPORT const char *gcoll_status_string(gcoll_status_t status);

/* The calling thread's last error message from any gcoll call, as NCCL's
 * ncclGetLastError(NULL): the reason a gcoll_comm_init, gcoll_compressor_create or any other
 * call failed on this thread (a blocking collective's or gcoll_wait's failure included),
 * also when GCOLL_DEBUG=none logs nothing. A warning logged on this thread also lands here,
 * so read it after a failed call. "" if none yet. Never NULL; valid until the thread's next
 * gcoll call. */
GCOLL_EXPORT const char *gcoll_last_error(void);

/* Size in bytes of one element of dtype, 0 for an unknown dtype. */
GCOLL_EXPORT size_t gcoll_dtype_size(gcoll_dtype_t dtype);

/* Name of a dtype ("float32", "bool", "uint8", "float8_e4m3", ...) or op ("sum", "band");
 * "?" when unknown. Never blocks; thread safe. */
GCOLL_EXPORT const char *gcoll_dtype_name(gcoll_dtype_t dtype);
GCOLL_EXPORT const char *gcoll_op_name(gcoll_op_t op);

/* Configuration table: every GCOLL_* environment variable gcoll reads.
 * gcoll_param_get(i, ...) for i in [0, gcoll_param_count()) describes one entry; value
 * is the current environment value or NULL if unset. Thread safe; never blocks. */
typedef struct {
    const char *name;  /* "GCOLL_TIMEOUT_MS" */
    const char *type;  /* "int", "size", "duration", "string", "enum", "bool" */
    const char *deflt; /* default as text ("" when none) */
    const char *help;  /* one line */
    const char *value; /* current environment value, NULL if unset */
} gcoll_param_info_t;
GCOLL_EXPORT size_t gcoll_param_count(void);
GCOLL_EXPORT gcoll_status_t gcoll_param_get(size_t i, gcoll_param_info_t *info_p);
/* The component entry i belongs to, as a heading: its short name, a colon and what it
 * covers ("tcp: TCP transport"); entries of one component are consecutive. NULL when i is
 * out of range. Thread safe; never blocks. */
GCOLL_EXPORT const char *gcoll_param_component(size_t i);

/* Checks every GCOLL_* variable in the environment: returns GCOLL_ERR_INVALID with the
 * message in errbuf (if not NULL) when one does not parse. Unknown names only warn. */
GCOLL_EXPORT gcoll_status_t gcoll_param_check(char *errbuf, size_t errlen);

/* Checks variable i's value in the environment as init does: GCOLL_OK when unset or valid,
 * else GCOLL_ERR_INVALID with "NAME='value' is invalid: expected ..." in errbuf. */
GCOLL_EXPORT gcoll_status_t gcoll_param_validate(size_t i, char *errbuf, size_t errlen);

/* Transports compiled into this library, e.g. "tcp,ucx". */
GCOLL_EXPORT const char *gcoll_transports_built(void);

/* Whether a transport can run here (devices present, libraries load). On
 * GCOLL_ERR_UNSUPPORTED, why (if not NULL) receives the reason. Never blocks for long. */
GCOLL_EXPORT gcoll_status_t gcoll_transport_probe(const char *name, char *why, size_t whylen);

/* ------------------------------------------------------------------------ */
/* Communicator                                                              */

/* Creates a communicator from the environment: rank and size from GCOLL_RANK/GCOLL_SIZE,
 * else OMPI_COMM_WORLD_RANK/SIZE (Open MPI's mpirun), SLURM_PROCID/SLURM_NTASKS, or
 * PMI_RANK/PMI_SIZE; rendezvous at GCOLL_ROOT (host:port, rank 0 listens there).
 * Collective over all ranks; blocks until every rank has joined or GCOLL_TIMEOUT_MS passes.
 * Errors: GCOLL_ERR_INVALID (missing/bad variables), GCOLL_ERR_TIMEOUT (root unreachable or
 * ranks missing), GCOLL_ERR_MISMATCH (ranks disagree on version, size or must-match
 * settings), GCOLL_ERR_PEER (authentication refused), GCOLL_ERR_TRANSPORT, GCOLL_ERR_NOMEM.
 * Thread safe with respect to other communicators. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_init(gcoll_comm_t **comm_p);

/* As gcoll_comm_init with rank, size and root address given explicitly (for frameworks
 * that bring their own launcher). root_addr may be NULL to read GCOLL_ROOT. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_init_rank(int size, int rank, const char *root_addr,
                                                 gcoll_comm_t **comm_p);

/* Releases the communicator. Collective: runs the queued operations, then a closing
 * handshake with every peer, so that every operation involving this rank completes on
 * every peer before it closes (the process may exit as soon as this returns). Waits for
 * the slowest peer to call it, for at most GCOLL_TIMEOUT_MS without progress. A broken or
 * aborted communicator is released at once, without the handshake. Returns the first
 * error of a queued operation or of the handshake (GCOLL_ERR_PEER, GCOLL_ERR_TIMEOUT), or
 * GCOLL_OK; the communicator is freed in every case. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_destroy(gcoll_comm_t *comm);

/* Marks the communicator broken, fails queued and running operations with
 * GCOLL_ERR_ABORTED and tells the peers (who then fail with GCOLL_ERR_PEER). May be
 * called from any thread, also while another thread is blocked in a collective.
 * The communicator must still be destroyed. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_abort(gcoll_comm_t *comm);

/* Splits comm (as MPI_Comm_split and ncclCommSplit do): collective over every rank of
 * comm. Ranks passing the same color >= 0 form a new communicator, ranked by (key, rank
 * in comm); a negative color (GCOLL_SPLIT_NOCOLOR) joins none and gets *newcomm_p = NULL.
 * The new communicator is independent of comm: its own transport connections (made over
 * comm, with comm's job key and settings), queue, progress thread, sequence and failure
 * state; comm stays usable, and each must be destroyed. comm must not be used by another
 * thread during the call. Errors: those of comm's collectives, GCOLL_ERR_NOMEM,
 * GCOLL_ERR_TRANSPORT/TIMEOUT from the new connections; on any error *newcomm_p is not set
 * and comm is still usable unless the error broke it. Blocks. */
#define GCOLL_SPLIT_NOCOLOR (-1)
GCOLL_EXPORT gcoll_status_t gcoll_comm_split(gcoll_comm_t *comm, int color, int key,
                                             gcoll_comm_t **newcomm_p);
/* gcoll_comm_split(comm, 0, rank, newcomm_p): the same ranks in the same order. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_dup(gcoll_comm_t *comm, gcoll_comm_t **newcomm_p);

/* Hosts: ranks are grouped by the name of their host, GCOLL_HOSTNAME if set, else
 * gethostname(); hosts are numbered in the order of their first rank, local ranks in rank
 * order. The names are exchanged over comm at the first of these calls, or at the first
 * allreduce that GCOLL_HIER lets consider the hierarchy: that first call is collective
 * (every rank must make it at the same point among its collectives) and blocks; later
 * ones only read. Errors: those of gcoll_allgather, GCOLL_ERR_INVALID for NULL. The int
 * getters return -1 on error. */
typedef struct {
    int host_count; /* distinct hosts among comm's ranks */
    int host_index; /* this rank's host, 0 .. host_count-1 */
    int local_rank; /* this rank among the ranks of its host */
    int local_size; /* ranks on this rank's host */
} gcoll_host_info_t;
GCOLL_EXPORT gcoll_status_t gcoll_comm_host_info(gcoll_comm_t *comm, gcoll_host_info_t *info_p);
GCOLL_EXPORT int gcoll_comm_local_rank(gcoll_comm_t *comm);
GCOLL_EXPORT int gcoll_comm_local_size(gcoll_comm_t *comm);
GCOLL_EXPORT int gcoll_comm_host_count(gcoll_comm_t *comm);

GCOLL_EXPORT int gcoll_comm_rank(const gcoll_comm_t *comm);
GCOLL_EXPORT int gcoll_comm_size(const gcoll_comm_t *comm);

/* Detailed message of the communicator's first error ("" if none). The string stays
 * valid until the communicator is destroyed. NULL comm: gcoll_last_error(). */
GCOLL_EXPORT const char *gcoll_comm_last_error(const gcoll_comm_t *comm);

/* Name of the transport in use ("tcp", "ucx", ...). */
GCOLL_EXPORT const char *gcoll_comm_transport(const gcoll_comm_t *comm);

/* Per-communicator counters, cumulative since init. */
typedef struct {
    uint64_t ops;            /* collectives completed, and one more the first time the host
                              * layout is looked up (GCOLL_HIER's choice on 3 ranks or more,
                              * gcoll_comm_host_info): an allgather of host names */
    uint64_t bytes_raw;      /* uncompressed payload bytes the collectives reduced/moved */
    uint64_t bytes_sent;     /* bytes this rank put on the wire (payload + frame headers) */
    uint64_t bytes_received; /* bytes this rank received off the wire */
    uint64_t ns_compress;    /* codec CPU time: input scan, compression, decompression
                              * and reduction of decoded values into the output */
    uint64_t ns_wire;        /* time spent in communication (waiting on the transport) */
    uint64_t ns_total;       /* time from start to end of collectives (timed by the TSC
                              * where the kernel's clocksource is tsc, else the monotonic
                              * clock) */
} gcoll_counters_t;
GCOLL_EXPORT gcoll_status_t gcoll_comm_counters(const gcoll_comm_t *comm,
                                                gcoll_counters_t *counters_p);
/* With GCOLL_PROBE=1: the bandwidth (bytes per second sent per rank) of the exchange timed
 * at init, the same on every rank (the slowest rank's); 0 without a probe. */
GCOLL_EXPORT gcoll_status_t gcoll_comm_probe_bandwidth(const gcoll_comm_t *comm,
                                                       double *bytes_per_s);

/* ------------------------------------------------------------------------ */
/* Dense collectives. Each blocking call is a nonblocking call plus gcoll_wait.
 * Errors common to all: GCOLL_ERR_INVALID (NULL comm, NULL buffer with count > 0, bad
 * dtype/op/root, an op the dtype does not take), GCOLL_ERR_MISMATCH (ranks passed different counts,
 * dtypes or ops), GCOLL_ERR_PEER, GCOLL_ERR_TIMEOUT, GCOLL_ERR_TRANSPORT, GCOLL_ERR_ABORTED. */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. AVG is the sum divided by the
 * rank count (for integers, truncated). fp16/bf16 are accumulated in fp32. Blocks.
 * Across hosts (GCOLL_HIER; this, gcoll_sparse_allreduce and gcoll_compressed_allreduce)
 * it may run hierarchically: a reduce-scatter inside each host, an allreduce of each part
 * across hosts, an allgather inside (fp16/bf16 rounded between the steps); the first such
 * call learns the host layout (see gcoll_comm_host_info) and makes the two child
 * communicators, so it is slower once. */
GCOLL_EXPORT gcoll_status_t gcoll_allreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t count, gcoll_dtype_t dtype, gcoll_op_t op);

/* Nonblocking allreduce: queues the operation and returns a request at once. The buffers
 * must stay valid and untouched until gcoll_wait/gcoll_test reports completion. */
GCOLL_EXPORT gcoll_status_t gcoll_iallreduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                             gcoll_request_t **req_p);

/* Copies root's buf (count elements) to every rank's buf. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_broadcast(gcoll_comm_t *comm, void *buf, size_t count,
                                            gcoll_dtype_t dtype, int root);
GCOLL_EXPORT gcoll_status_t gcoll_ibroadcast(gcoll_comm_t *comm, void *buf, size_t count,
                                             gcoll_dtype_t dtype, int root,
                                             gcoll_request_t **req_p);

/* Returns once every rank has entered the barrier. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_barrier(gcoll_comm_t *comm);
GCOLL_EXPORT gcoll_status_t gcoll_ibarrier(gcoll_comm_t *comm, gcoll_request_t **req_p);

/* recvbuf (size * sendcount elements) receives every rank's sendbuf, in rank order. In
 * place when sendbuf == recvbuf + rank * sendcount elements (as in NCCL). Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_allgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t sendcount, gcoll_dtype_t dtype);
GCOLL_EXPORT gcoll_status_t gcoll_iallgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t sendcount, gcoll_dtype_t dtype,
                                             gcoll_request_t **req_p);

/* Rank i's sendbuf (recvcounts[i] elements, == sendcount on rank i) lands at
 * recvbuf + displs[i] on every rank. recvcounts must be the same on every rank
 * (GCOLL_ERR_MISMATCH otherwise); blocks must not overlap (GCOLL_ERR_INVALID). The arrays
 * are copied: they may be reused as soon as the call returns. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_allgatherv(gcoll_comm_t *comm, const void *sendbuf,
                                             size_t sendcount, void *recvbuf,
                                             const size_t *recvcounts, const size_t *displs,
                                             gcoll_dtype_t dtype);
GCOLL_EXPORT gcoll_status_t gcoll_iallgatherv(gcoll_comm_t *comm, const void *sendbuf,
                                              size_t sendcount, void *recvbuf,
                                              const size_t *recvcounts, const size_t *displs,
                                              gcoll_dtype_t dtype, gcoll_request_t **req_p);

/* sendbuf holds size blocks of recvcount elements; rank i's recvbuf receives block i
 * reduced over ranks. In place when recvbuf == sendbuf + rank * recvcount elements. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_reduce_scatter(gcoll_comm_t *comm, const void *sendbuf,
                                                 void *recvbuf, size_t recvcount,
                                                 gcoll_dtype_t dtype, gcoll_op_t op);
GCOLL_EXPORT gcoll_status_t gcoll_ireduce_scatter(gcoll_comm_t *comm, const void *sendbuf,
                                                  void *recvbuf, size_t recvcount,
                                                  gcoll_dtype_t dtype, gcoll_op_t op,
                                                  gcoll_request_t **req_p);

/* Block j (count_per_rank elements) of rank i's sendbuf lands in block i of rank j's
 * recvbuf. Not in place (GCOLL_ERR_INVALID). Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_alltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count_per_rank, gcoll_dtype_t dtype);
GCOLL_EXPORT gcoll_status_t gcoll_ialltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t count_per_rank, gcoll_dtype_t dtype,
                                            gcoll_request_t **req_p);

/* Rank i sends sendcounts[j] elements from sendbuf + sdispls[j] to rank j, which receives
 * them at recvbuf + rdispls[i] and must pass recvcounts[i] equal to that count
 * (GCOLL_ERR_MISMATCH otherwise). Arrays are copied. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_alltoallv(gcoll_comm_t *comm, const void *sendbuf,
                                            const size_t *sendcounts, const size_t *sdispls,
                                            void *recvbuf, const size_t *recvcounts,
                                            const size_t *rdispls, gcoll_dtype_t dtype);
GCOLL_EXPORT gcoll_status_t gcoll_ialltoallv(gcoll_comm_t *comm, const void *sendbuf,
                                             const size_t *sendcounts, const size_t *sdispls,
                                             void *recvbuf, const size_t *recvcounts,
                                             const size_t *rdispls, gcoll_dtype_t dtype,
                                             gcoll_request_t **req_p);

/* ------------------------------------------------------------------------ */
/* Rooted collectives (as MPI_Reduce, MPI_Gather, MPI_Scatter and NCCL's ncclReduce).
 * root is a rank of comm (GCOLL_ERR_INVALID otherwise) and the same on every rank
 * (GCOLL_ERR_MISMATCH otherwise). Small messages go up or down a binomial tree; large ones
 * take a reduce-scatter then a gather to root (reduce) or direct transfers (gather,
 * scatter); the cost model chooses, as for allreduce. Errors as for the dense collectives.
 * Each blocking call is its nonblocking twin plus gcoll_wait. */

/* root's recvbuf[i] = op over ranks of sendbuf[i] (count elements). Other ranks may pass
 * NULL recvbuf. In place at root when sendbuf == recvbuf. AVG as in gcoll_allreduce.
 * Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_reduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                         int root);
GCOLL_EXPORT gcoll_status_t gcoll_ireduce(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                          int root, gcoll_request_t **req_p);

/* root's recvbuf (size * count elements) receives every rank's sendbuf (count elements) in
 * rank order. Other ranks may pass NULL recvbuf. In place at root when sendbuf == recvbuf +
 * root * count elements. Any dtype (bytes are moved). Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_gather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, gcoll_dtype_t dtype, int root);
GCOLL_EXPORT gcoll_status_t gcoll_igather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, gcoll_dtype_t dtype, int root,
                                          gcoll_request_t **req_p);

/* Block i (count elements) of root's sendbuf (size * count elements, rank order) lands in
 * rank i's recvbuf. Other ranks may pass NULL sendbuf. In place at root when recvbuf ==
 * sendbuf + root * count elements. Any dtype. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, gcoll_dtype_t dtype, int root);
GCOLL_EXPORT gcoll_status_t gcoll_iscatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, gcoll_dtype_t dtype, int root,
                                           gcoll_request_t **req_p);

/* ------------------------------------------------------------------------ */
/* Point-to-point (as NCCL's ncclSend/ncclRecv and MPI's MPI_Send/MPI_Recv).
 * - The n-th send from rank a to rank b matches the n-th receive rank b posts from rank a:
 *   messages between two ranks never overtake one another. There are no tags; a receive
 *   from any source is gcoll_recv_any (below).
 * - count may be 0; any dtype (bytes are moved); a rank may send to itself (the message is
 *   copied, and its receive must follow the send or share a group with it).
 * - Operations on a communicator run in the order they were issued, as NCCL's do on one
 *   stream: a receive holds back the calls issued after it until its message arrives, and
 *   a send until the peer has taken it (a message of up to GCOLL_UNEXPECTED_BYTES may be
 *   buffered by the receiver before its receive is posted). To exchange in both
 *   directions at once (a ring shift, a halo exchange), issue the sends and receives
 *   between gcoll_group_start and gcoll_group_end: a group posts them all together.
 * - Point-to-point calls do not take part in the collectives' ordering: ranks that do not
 *   exchange messages need not make matching calls.
 * Errors: GCOLL_ERR_INVALID (NULL comm, NULL buf with count > 0, bad dtype, peer out of
 * range), GCOLL_ERR_MISMATCH on the receiving rank when the send's count or dtype differs
 * from the receive's (nothing is written past the receive's buffer; the communicator then
 * fails, as after any mismatch), GCOLL_ERR_PEER (the peer died or aborted), GCOLL_ERR_TIMEOUT
 * (no progress for GCOLL_TIMEOUT_MS), GCOLL_ERR_ABORTED. Thread safety as the collectives.
 * Large messages are sent from buf without a copy (the transport's rendezvous where it has
 * one). */

/* Sends count elements of buf to peer. Blocks until buf may be reused. */
GCOLL_EXPORT gcoll_status_t gcoll_send(gcoll_comm_t *comm, const void *buf, size_t count,
                                       gcoll_dtype_t dtype, int peer);
/* Receives count elements from peer into buf. Blocks until they are there. */
GCOLL_EXPORT gcoll_status_t gcoll_recv(gcoll_comm_t *comm, void *buf, size_t count,
                                       gcoll_dtype_t dtype, int peer);
/* Nonblocking twins: return a request at once; buf stays untouched (isend: unmodified)
 * until gcoll_wait/gcoll_test reports completion. */
GCOLL_EXPORT gcoll_status_t gcoll_isend(gcoll_comm_t *comm, const void *buf, size_t count,
                                        gcoll_dtype_t dtype, int peer, gcoll_request_t **req_p);
GCOLL_EXPORT gcoll_status_t gcoll_irecv(gcoll_comm_t *comm, void *buf, size_t count,
                                        gcoll_dtype_t dtype, int peer, gcoll_request_t **req_p);

/* Receive from any source (MPI_Recv with MPI_ANY_SOURCE): receives count elements into buf
 * from whichever rank's next message came first (a rank's own sends included), and writes
 * that rank to *source (source may be NULL). The message taken is the one that would have
 * met a gcoll_recv from that rank in its place: messages between two ranks still never
 * overtake one another, whether the receives that take them name their sender or not (a
 * gcoll_recv from p issued before gcoll_recv_any gets p's earlier message, one issued after
 * it the next). *source is -1 from the call until a message is matched, then the sender
 * (also when the match fails with GCOLL_ERR_MISMATCH); it is final once the call returns
 * (gcoll_recv_any) or the request completes (gcoll_wait/gcoll_test: keep source valid until
 * then). Errors as gcoll_recv's (GCOLL_ERR_MISMATCH when the count or dtype of the message
 * taken differs), plus GCOLL_ERR_INVALID inside a group (a group posts its receives before
 * any message arrives: issue this one outside it), and GCOLL_ERR_PEER when a rank dies or
 * aborts before any message came, as MPI's ULFM fails a pending any-source receive (the
 * communicator then fails). GCOLL_ERR_TIMEOUT when no message comes for GCOLL_TIMEOUT_MS.
 * gcoll_recv and gcoll_irecv keep refusing a peer out of range, -1 included: a receive from
 * any source is asked for by name, never by a rank computed wrong. Blocks (gcoll_recv_any)
 * until the message is there; gcoll_irecv_any returns a request at once. */
GCOLL_EXPORT gcoll_status_t gcoll_recv_any(gcoll_comm_t *comm, void *buf, size_t count,
                                           gcoll_dtype_t dtype, int *source);
GCOLL_EXPORT gcoll_status_t gcoll_irecv_any(gcoll_comm_t *comm, void *buf, size_t count,
                                            gcoll_dtype_t dtype, int *source,
                                            gcoll_request_t **req_p);

/* ------------------------------------------------------------------------ */
/* Group calls (as NCCL's ncclGroupStart/ncclGroupEnd). Between gcoll_group_start(comm)
 * and gcoll_group_end(comm), the calls the same thread makes on comm (collectives,
 * rooted, point-to-point, compressed) are queued, not run: each returns GCOLL_OK at once
 * once its arguments check out (blocking calls too), and a nonblocking call's request
 * completes when the group has run. gcoll_group_end runs them together and waits for all:
 * the group's sends and receives are posted at once (so a ring shift written as a blocking
 * send then a blocking recv completes), its collectives run in the order issued, and
 * consecutive allreduces of one dtype and op of at most GCOLL_GROUP_FUSE_BYTES in all are
 * fused into one (PyTorch's coalesced all-reduce). Buffers must stay valid until
 * gcoll_group_end returns. Groups nest (only the outermost end runs them). Every rank
 * that takes part in a group's collectives must issue them in a group too or in the same
 * order outside one. Errors: GCOLL_ERR_INVALID (NULL comm, end without start, a start or
 * end while another thread has a group open on comm: one thread's group at a time; the
 * other threads' calls meanwhile run as usual), else the first failure among the group's
 * operations (the others then fail with it or GCOLL_ERR_ABORTED). Blocks (group_end). */
GCOLL_EXPORT gcoll_status_t gcoll_group_start(gcoll_comm_t *comm);
GCOLL_EXPORT gcoll_status_t gcoll_group_end(gcoll_comm_t *comm);

/* Waits for a request to complete and frees it; returns the operation's status. Blocks
 * (bounded by the timeout). A request that has not started when the communicator is idle
 * runs in the waiting thread (as a blocking call does; the progress thread leaves a call's
 * caller GCOLL_SPIN_US to get there). Any thread may wait for a request
 * (completion is guarded by the communicator's lock), but only one thread may wait for a
 * given request. */
GCOLL_EXPORT gcoll_status_t gcoll_wait(gcoll_request_t *req);

/* Sets *done_p to 1 if the request completed (then gcoll_wait returns at once with its
 * status), else 0. Never blocks. Returns GCOLL_ERR_INVALID for a NULL request. */
GCOLL_EXPORT gcoll_status_t gcoll_test(gcoll_request_t *req, int *done_p);

/* ------------------------------------------------------------------------ */
/* Compressors (codec layer; network-free). BEGIN COMPRESSOR SECTION          */

/* A compressor is named by a spec string, the same as in GCOLL_COMPRESSOR:
 * "none", "fp16", "bf16", "q8", "topk:density=0.001", "topk:k=100,select=sample",
 * "randomk:density=0.01,seed=7", "threshold:tau=0.01", "sign:scale=l2",
 * "qsgd:bits=4,bucket=512", "topk:density=0.01+q8", "dgc:density=0.001,momentum=0.9".
 * Any spec also takes clip=C (scale the whole gradient to l2 norm <= C before
 * compressing, however a collective cuts it into chunks), clip_value=V (clamp each element
 * to [-V, V] first) and ef=0|1 (error feedback, default 1: the codec's contractive form;
 * ef=0: its unbiased form). Full syntax and each codec's forms: docs/compressors.md.
 * Compressors are immutable once created and may be shared by threads; a tensor state
 * is used by one thread at a time. None of these calls blocks or communicates. */
typedef struct gcoll_compressor gcoll_compressor_t;
/* Per-tensor state: error-feedback residual, DGC buffers, step counter. */
typedef struct gcoll_tensor_state gcoll_tensor_state_t;

/* Parses spec. GCOLL_ERR_INVALID with a logged message naming the bad part. Thread safe. */
GCOLL_EXPORT gcoll_status_t gcoll_compressor_create(const char *spec, gcoll_compressor_t **c_p);
/* As create, without creating: errbuf (if not NULL) receives the message on error. */
GCOLL_EXPORT gcoll_status_t gcoll_compressor_check(const char *spec, char *errbuf, size_t errlen);
GCOLL_EXPORT void gcoll_compressor_destroy(gcoll_compressor_t *c);
/* Canonical spec: every parameter spelled out, equal for equal settings (ranks compare
 * it at init). Valid while c lives. */
GCOLL_EXPORT const char *gcoll_compressor_spec(const gcoll_compressor_t *c);
/* Worst-case encoded size in bytes (header included) of count elements; 0 if count
 * exceeds 2^32 - 1 (indices are 32-bit) or c is NULL. */
GCOLL_EXPORT size_t gcoll_compressor_bound(const gcoll_compressor_t *c, size_t count);

/* Properties of a codec (bits of gcoll_compressor_flags). */
#define GCOLL_CODEC_SPARSE 0x1u     /* sends (index, value) pairs: topk, randomk, threshold, dgc */
#define GCOLL_CODEC_RANDOMK 0x2u    /* indices follow from (seed, step): only values travel */
#define GCOLL_CODEC_QUANTIZED 0x4u  /* values travel at reduced precision */
#define GCOLL_CODEC_STOCHASTIC 0x8u /* unbiased random rounding (qsgd) */
#define GCOLL_CODEC_LOSSLESS 0x10u  /* decode(encode(x)) == x */
#define GCOLL_CODEC_NEEDS_STATE 0x20u /* gcoll_encode needs a tensor state (dgc) */
GCOLL_EXPORT unsigned gcoll_compressor_flags(const gcoll_compressor_t *c);

/* State for one tensor of count elements; error feedback on unless the spec says ef=0. */
GCOLL_EXPORT gcoll_status_t gcoll_state_create(gcoll_compressor_t *c, size_t count,
                                               gcoll_tensor_state_t **s_p);
GCOLL_EXPORT void gcoll_state_destroy(gcoll_tensor_state_t *s);
/* The residual (count floats), NULL if the state keeps no feedback. For dgc it is the
 * accumulation v (what was selected from but not yet sent). Valid until the next call
 * with this state (a compressed allreduce may move the residual to another buffer). */
GCOLL_EXPORT const float *gcoll_state_residual(const gcoll_tensor_state_t *s);
/* Encodes done with this state so far (the step warm-up schedules use). */
GCOLL_EXPORT uint64_t gcoll_state_step(const gcoll_tensor_state_t *s);
/* Encodes in[0..count) into out (cap bytes); *len_p receives the encoded length. With a
 * state, applies error feedback / DGC and advances the state's step. GCOLL_ERR_INVALID on
 * NaN/Inf input (the state is then unchanged), a too small cap, or a count that does not
 * match the state. */
GCOLL_EXPORT gcoll_status_t gcoll_encode(gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                         const float *in, size_t count, void *out, size_t cap,
                                         size_t *len_p);
/* Streaming form: encodes in[0..count) as elements [offset, offset+count) of the state's
 * tensor (feedback uses that slice of the residual), one message per chunk, so chunks can
 * be sent as soon as they are ready. Does not advance the step: call gcoll_state_advance
 * once after the last chunk of a step. top-k (k=K), density and clip=C (by the chunk's
 * own norm) apply per chunk. The
 * worst-case size of a chunk message is gcoll_compressor_bound(c, count). */
GCOLL_EXPORT gcoll_status_t gcoll_encode_chunk(gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                               size_t offset, const float *in, size_t count,
                                               void *out, size_t cap, size_t *len_p);
GCOLL_EXPORT void gcoll_state_advance(gcoll_tensor_state_t *s);
/* Checkpoints: writes everything that decides the state's later encodes (step, residual,
 * DGC velocity, the reused threshold, vq's warm codebook, the compressed allreduce's server
 * residual, the hierarchical allreduce's residual of this rank's part) and its
 * compressor's canonical spec into buf (cap bytes); *len_p receives the length. buf NULL
 * with cap 0 only sets *len_p. Host byte order (gcoll builds on little-endian hosts only).
 * GCOLL_ERR_INVALID for NULL arguments or a too small cap. */
GCOLL_EXPORT gcoll_status_t gcoll_state_save(const gcoll_tensor_state_t *s, void *buf, size_t cap,
                                             size_t *len_p);
/* Restores what gcoll_state_save wrote into s, a state of a compressor with the same
 * canonical spec and count: the next encode is then bit-identical to the saved state's.
 * GCOLL_ERR_MISMATCH (other spec, count or buffers) or GCOLL_ERR_INVALID (malformed,
 * truncated) leave s unchanged; GCOLL_ERR_NOMEM (the server residual) may leave it half
 * loaded. Not while a collective uses s. */
GCOLL_EXPORT gcoll_status_t gcoll_state_load(gcoll_tensor_state_t *s, const void *buf, size_t len);
/* Decodes len bytes into out[0..count) (overwrite, or add when accumulate != 0). Every
 * field is checked against len and count: GCOLL_ERR_INVALID on malformed input, never an
 * out-of-bounds access; out is untouched on error. Adding a sparse message costs O(nnz). */
GCOLL_EXPORT gcoll_status_t gcoll_decode(const gcoll_compressor_t *c, const void *in, size_t len,
                                         float *out, size_t count, int accumulate);
/* Elements and carried values of a well-formed message (header checks only). */
GCOLL_EXPORT gcoll_status_t gcoll_decode_info(const void *in, size_t len, size_t *count_p,
                                              size_t *nnz_p);
/* Decodes to (index, value) pairs in ascending index order: nnz pairs for sparse and
 * random-k messages, every element for dense ones. cap is the room in idx and val;
 * GCOLL_ERR_INVALID if the message holds more (get nnz from gcoll_decode_info). */
GCOLL_EXPORT gcoll_status_t gcoll_decode_pairs(const gcoll_compressor_t *c, const void *in,
                                               size_t len, size_t count, uint32_t *idx, float *val,
                                               size_t cap, size_t *nnz_p);

/* END COMPRESSOR SECTION */

/* ------------------------------------------------------------------------ */
/* Sparse and compressed collectives                                         */

/* out[0..dense_count) = op over ranks of each rank's sparse tensor: nnz (idx, val) pairs,
 * indices unsorted and possibly repeated (repeats add), every index < dense_count, values
 * finite. op is GCOLL_SUM or GCOLL_AVG. The plan (allgather of the pairs, split-and-reduce
 * by index range, or a dense ring once the merged density makes it cheaper) is chosen
 * from every rank's nnz, identically on every rank (GCOLL_SPARSE_ALGO forces one); the
 * result is bit-identical on every rank. Inputs are copied. Errors: GCOLL_ERR_INVALID
 * (bad index, NaN/Inf, NULL buffers, op), GCOLL_ERR_MISMATCH (dense_count or op differ
 * across ranks), the transport errors. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_sparse_allreduce(gcoll_comm_t *comm, const uint32_t *idx,
                                                   const float *val, size_t nnz, size_t dense_count,
                                                   float *out, gcoll_op_t op);
GCOLL_EXPORT gcoll_status_t gcoll_isparse_allreduce(gcoll_comm_t *comm, const uint32_t *idx,
                                                    const float *val, size_t nnz,
                                                    size_t dense_count, float *out, gcoll_op_t op,
                                                    gcoll_request_t **req_p);

/* out[0..count) = SUM or AVG over ranks of grad, each rank's grad passed through its
 * tensor state's compressor with error feedback (and DGC state): the residual keeps what
 * was not sent and the state's step advances. Schemes by codec: sparsifiers (topk,
 * threshold, dgc) through the sparse allreduce of what was sent; random-k (shared seed,
 * the same indices on every rank) by a dense allreduce of the k values; quantizers (fp16,
 * bf16, q8, sign, qsgd) by all-to-all of compressed chunks, reduction of its chunk on each
 * rank, re-compression with a per-state server residual, and a gather (1-bit Adam's
 * scheme), or by a pipelined ring re-quantizing partial sums at every hop
 * (GCOLL_COMPRESSED_ALGO; see gcoll_compressed_scheme); "none" by the dense ring. The result is
 * bit-identical on every rank. Every rank must pass states of the same spec, count and step:
 * GCOLL_ERR_MISMATCH otherwise. GCOLL_ERR_INVALID for NaN/Inf in grad, a count that is not the
 * state's, op other than SUM/AVG. The state must not be used elsewhere until the call completes.
 * Blocks. Hierarchical (GCOLL_HIER, see gcoll_allreduce): the sum inside each host is exact, and
 * only this rank's part of it is compressed across hosts, with its error feedback in a
 * second state the call keeps inside state: gcoll_state_residual does not show that
 * residual; gcoll_state_save and gcoll_state_load carry it. */
GCOLL_EXPORT gcoll_status_t gcoll_compressed_allreduce(gcoll_comm_t *comm,
                                                       gcoll_tensor_state_t *state,
                                                       const float *grad, float *out, size_t count,
                                                       gcoll_op_t op);
GCOLL_EXPORT gcoll_status_t gcoll_icompressed_allreduce(gcoll_comm_t *comm,
                                                        gcoll_tensor_state_t *state,
                                                        const float *grad, float *out, size_t count,
                                                        gcoll_op_t op, gcoll_request_t **req_p);

/* ZeRO-style sharding: shard receives this rank's part of the SUM/AVG over ranks of the
 * compressed grad: elements [offset, offset+len) as given by gcoll_shard_range (balanced
 * split of count over ranks, rank order). The all-to-all half of the quantizer scheme,
 * for every codec. Parameters are gathered back with gcoll_allgatherv. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_compressed_reduce_scatter(gcoll_comm_t *comm,
                                                            gcoll_tensor_state_t *state,
                                                            const float *grad, float *shard,
                                                            size_t count, gcoll_op_t op);
GCOLL_EXPORT gcoll_status_t gcoll_icompressed_reduce_scatter(gcoll_comm_t *comm,
                                                             gcoll_tensor_state_t *state,
                                                             const float *grad, float *shard,
                                                             size_t count, gcoll_op_t op,
                                                             gcoll_request_t **req_p);
GCOLL_EXPORT void gcoll_shard_range(const gcoll_comm_t *comm, size_t count, size_t *offset_p,
                                    size_t *len_p);

/* The scheme a compressed allreduce (or reduce-scatter, shard_only != 0) of count elements
 * with compressor c runs on comm: "dense ring", "sparse", "streamed sparse" (top-k whose
 * selection pass is sent as it goes: GCOLL_TOPK_STREAM; for a state past its warm-up with
 * the compressor's error feedback), "random-k dense values", "alltoall" or "ring"
 * (GCOLL_COMPRESSED_ALGO and its cost rule), the same on every rank.
 * For "ring", *segment_p (if not NULL) receives the elements per compressed message
 * (GCOLL_RING_CHUNK / 8, at least 1024, at most one rank's chunk): each segment of each
 * chunk is compressed on its own. NULL for a
 * NULL comm or compressor. Never blocks.
 * This is the state-less answer: the scheme of a state of c past its warm-up (its last
 * step's density and bit width). During a warm-up, or under an attached adaptation
 * controller, the call may run another: gcoll_compressed_scheme_state names that one. */
GCOLL_EXPORT const char *gcoll_compressed_scheme(const gcoll_comm_t *comm,
                                                 const gcoll_compressor_t *c, size_t count,
                                                 int shard_only, size_t *segment_p);

/* The scheme (a name as for gcoll_compressed_scheme, and *segment_p likewise) that the
 * next gcoll_compressed_allreduce (shard_only != 0: gcoll_compressed_reduce_scatter) of
 * state's count elements on comm runs: with the codec the state encodes with (an attached
 * controller's copy, gcoll_adapt_attach) at the state's step, its warm-up included, as
 * that call plans it. The same on every rank whose state is at the same step. Where the
 * call runs hierarchically (GCOLL_HIER, see gcoll_allreduce) this is the scheme of the
 * flat call instead. Reads the state: not while a call on it is in flight. NULL for a
 * NULL comm or state. Never blocks. */
GCOLL_EXPORT const char *gcoll_compressed_scheme_state(const gcoll_comm_t *comm,
                                                       const gcoll_tensor_state_t *state,
                                                       int shard_only, size_t *segment_p);

/* ------------------------------------------------------------------------ */
/* Bucketer: overlap of gradient reduction with the backward pass            */

typedef struct gcoll_bucketer gcoll_bucketer_t;
typedef struct {
    size_t bucket_bytes;      /* largest fused bucket (0: GCOLL_BUCKET_BYTES; that 0 or unset:
                               * sized from the model and the link, docs/overlap.md) */
    gcoll_op_t op;            /* GCOLL_AVG (as DDP) or GCOLL_SUM */
    const char *policy;       /* layer policy, GCOLL_LAYER_POLICY syntax (NULL: none) */
    const char *default_spec; /* compressor when no rule matches (NULL: "none") */
    int accumulate_steps;     /* communicate every N steps, summing locally (0, 1: every step) */
    uint64_t warmup_steps;    /* warm-up of sparsifiers (topk, randomk, dgc) whose spec sets no
                               * warmup_steps (0: none) */
} gcoll_bucketer_config_t;

/* Creates a bucketer on comm; cfg NULL reads GCOLL_BUCKET_BYTES, GCOLL_BUCKET_OP,
 * GCOLL_LAYER_POLICY, GCOLL_COMPRESSOR, GCOLL_ACCUMULATE_STEPS. GCOLL_ERR_INVALID names
 * a bad policy rule. Not collective; does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_create(gcoll_comm_t *comm,
                                                  const gcoll_bucketer_config_t *cfg,
                                                  gcoll_bucketer_t **b_p);
/* Registers a gradient tensor once, in backward order (last layer first), before the first
 * ready(). compressor_spec NULL lets the policy decide; only float32 tensors are
 * compressed. Reduced results are written back into grad. GCOLL_ERR_INVALID for a name
 * registered twice, or a registration after training started. */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_add_tensor(gcoll_bucketer_t *b, const char *name,
                                                      float *grad, size_t count,
                                                      gcoll_dtype_t dtype,
                                                      const char *compressor_spec, int *id_p);
/* This tensor's gradient is final for this step. Returns at once; when its bucket is
 * complete (and the buckets before it are launched), the bucket is compressed, reduced and
 * written back on the progress thread. The gradient must not change until wait(). */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_ready(gcoll_bucketer_t *b, int id);
/* Waits until every bucket of this step is reduced and written back. A tensor not marked
 * ready is GCOLL_ERR_INVALID here, naming it (the other ranks then time out in its bucket,
 * with an error naming the bucket and its tensors). Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_wait(gcoll_bucketer_t *b);
/* Waits until tensor id (marked ready this step) is reduced and written back, while later
 * buckets may still run: the next forward pass can start on the first layers before
 * gcoll_bucketer_wait. gcoll_bucketer_wait still ends the step. Returns at once in a
 * step that only accumulates. GCOLL_ERR_INVALID for an unknown id or one not marked
 * ready, GCOLL_ERR_TIMEOUT after GCOLL_TIMEOUT_MS. Blocks; thread safe. */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_wait_tensor(gcoll_bucketer_t *b, int id);
GCOLL_EXPORT int gcoll_bucketer_num_buckets(const gcoll_bucketer_t *b);
/* The density bucket i compresses to now (1 for codecs without one). With GCOLL_ADAPT it
 * changes between steps, identically on every rank. */
GCOLL_EXPORT double gcoll_bucketer_density(const gcoll_bucketer_t *b, int bucket);
/* The compressor spec tensor id gets: its explicit spec, else the first matching rule of
 * the layer policy (first / last: the model's first / last layer in forward order, the
 * tensors sharing a name up to the last '.' with the last / first tensor registered), else
 * the default; "none" for a tensor that is not float32. Before the first ready() it
 * answers for the tensors registered so far; from then on it is final (finalizing logs
 * each tensor's spec and rule at info level, subsystem COLL). The string lives as long as
 * b. NULL for a bad id. Thread safe; does not block. */
GCOLL_EXPORT const char *gcoll_bucketer_tensor_spec(gcoll_bucketer_t *b, int id);
/* Waits for launched buckets, then frees. */
GCOLL_EXPORT void gcoll_bucketer_destroy(gcoll_bucketer_t *b);

/* ------------------------------------------------------------------------ */
/* Adaptation: the density or bit width of a tensor's codec chosen every step from the    */
/* link (bandwidth), the gradient's noise scale (snr), the convergence stage (stage),     */
/* ACCORDION's critical phase (phase) and a per-bucket budget (budget); docs/adaptation.md */

#define GCOLL_ADAPT_BANDWIDTH 1u
#define GCOLL_ADAPT_PHASE 2u
#define GCOLL_ADAPT_SNR 4u
#define GCOLL_ADAPT_STAGE 8u
#define GCOLL_ADAPT_BUDGET 16u

/* What a controller measured and decided, the same on every rank. */
typedef struct {
    long steps;         /* decisions taken */
    double noise_scale; /* B_noise = tr(Sigma) / |G|^2, in per-rank batches (multiply by the
                         * per-rank batch size for examples); 0 unknown (one rank) */
    double grad_sq;     /* smoothed estimate of |G|^2, the true gradient's squared norm */
    double noise_sq;    /* smoothed estimate of tr(Sigma) / b, one rank's batch noise */
    double noise_share; /* tr(Sigma)/(P b) over |G|^2 + tr(Sigma)/(P b): the noise's share
                         * of the reduced gradient's energy, 0..1; -1 unknown */
    double stage;       /* convergence stage, 1 (start) falling towards 0 */
    double phase_boost; /* ACCORDION ramp, 0..1 */
    double bandwidth;   /* bytes per second of the wire estimate; 0 none */
    double density;     /* density in force (1 for codecs without one) */
    unsigned bits;      /* bit width in force for qsgd / q8 codecs, else 0 */
} gcoll_adapt_stats_t;

/* Parses GCOLL_ADAPT syntax ("off", "bandwidth", "snr+bandwidth", "both" = bandwidth+phase)
 * into a GCOLL_ADAPT_* mask. GCOLL_ERR_INVALID for an unknown rule. */
GCOLL_EXPORT gcoll_status_t gcoll_adapt_parse(const char *rules, unsigned *mask_p);

/* A controller for gcoll_compressed_allreduce callers. rules NULL reads GCOLL_ADAPT; the
 * bounds are GCOLL_DENSITY_MIN/MAX. "budget" splits a total over several tensors: it acts
 * on controllers joined by gcoll_adapt_join and does nothing for a controller alone.
 * GCOLL_ERR_INVALID for an unknown rule. Not collective; does not block. */
typedef struct gcoll_adapt gcoll_adapt_t;
GCOLL_EXPORT gcoll_status_t gcoll_adapt_create(gcoll_comm_t *comm, const char *rules,
                                               gcoll_adapt_t **a_p);
/* Attaches the controller to a state (one state per controller): from the next call of
 * gcoll_compressed_allreduce on it, the state encodes with the controller's own copy of
 * its compressor at the chosen density (top-k, random-k, DGC) or width (qsgd, q8), and
 * after each call the ranks agree on the measurements in one small allreduce (the sampled
 * gradient values of 16 coordinates, bytes, wire time), so every rank
 * decides alike. Every rank must attach alike. GCOLL_ERR_INVALID for a state already
 * attached, a codec with nothing to adapt, or a controller already attached. */
GCOLL_EXPORT gcoll_status_t gcoll_adapt_attach(gcoll_adapt_t *a, gcoll_tensor_state_t *state);
/* Puts controller a into the budget of controller with (and of the controllers already
 * joined to it): after each call on a member's state, that member's density is its share
 * of the members' total k (each at the density the other rules chose), split in proportion
 * to sqrt(n_j E_j) (n_j the tensor's size, E_j its smoothed squared norm; the bucketer's
 * budget rule), within GCOLL_DENSITY_MIN/MAX. Both attached to density codecs (top-k,
 * random-k, DGC) on the same communicator, both with the budget rule, before the first
 * call on either; every rank must join alike. gcoll_adapt_destroy leaves the group.
 * GCOLL_ERR_INVALID otherwise. Not collective; does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_adapt_join(gcoll_adapt_t *a, gcoll_adapt_t *with);
/* What the controller measured and decided so far; read it between calls (not while a
 * nonblocking call on its state is in flight). Does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_adapt_stats(const gcoll_adapt_t *a, gcoll_adapt_stats_t *stats_p);
/* Detaches (the state goes back to its own compressor) and frees. Call it after the last
 * call on the state completed and before gcoll_state_destroy of that state. */
GCOLL_EXPORT void gcoll_adapt_destroy(gcoll_adapt_t *a);

/* The bucketer's controller (GCOLL_ADAPT): bucket i's statistics, or with bucket -1 those
 * of all adaptive buckets together (their norms summed; density the mean weighted by
 * size). GCOLL_ERR_INVALID for a bad bucket. Read between steps. */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_stats(const gcoll_bucketer_t *b, int bucket,
                                                 gcoll_adapt_stats_t *stats_p);

/* Local SGD and the parameter server: gcoll_training.h, included here. */
#include "gcoll_training.h"

#ifdef __cplusplus
}
#endif

#endif /* GCOLL_H */
