/* comm.h: the communicator, its operation queue and progress thread, and the channel of
 * its running operation (collectives/channel.h). Internal. */
#ifndef GCOLL_COMM_H
#define GCOLL_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "collectives/channel.h"
#include "collectives/coll.h"
#include "base/config.h"
#include "gcoll.h"
#include "transports/transport.h"

typedef gcoll_status_t (*gcoll_run_fn_t)(gcoll_comm_t *comm, gcoll_request_t *req);

/* Arguments of one queued collective; ext carries what a collective needs beyond these
 * (owned by the request and released with release). */
typedef struct {
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    gcoll_dtype_t dtype;
    gcoll_op_t op;
    int root;
    int kind; /* GCOLL_KIND_* where one run function serves several calls */
    void *ext;
    void (*release)(void *ext);
} gcoll_args_t;

struct gcoll_request {
    gcoll_comm_t *comm;
    gcoll_run_fn_t run;
    const char *name;
    gcoll_args_t a;
    gcoll_status_t status;
    int done;
    int blocking; /* the caller waits for it in the call (no request handle) */
    /* point-to-point and groups: takes no sequence number of its own among the
     * collectives (a group's collectives take theirs as they run) */
    int noseq;
    int grouped; /* captured by an open group, not yet handed to the queue */
    int stacked; /* on the blocking caller's stack (gcoll_request_init): never freed */
    struct gcoll_request *next;
};

/* Freed requests kept per communicator for reuse. */
#define GCOLL_REQ_CACHE 4

struct gcoll_comm {
    int rank, size;
    gcoll_config_t cfg;
    char *keybuf;
    gcoll_key_t key;
    gcoll_channel_t chan; /* the transport, as the running operation reaches it */
    int wake_fd;
    /* queue and completion, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    gcoll_request_t *qhead, *qtail;
    gcoll_request_t *req_cache[GCOLL_REQ_CACHE]; /* freed requests kept for reuse (atomic) */
    int busy;    /* an operation is running (on the progress thread or inline) */
    int waiters; /* threads in gcoll_wait */
    int stop;
    pthread_t thread;
    int thread_started;
    /* failure state: written by the running operation or gcoll_comm_abort */
    volatile int abort_requested;
    volatile gcoll_status_t broken;
    char last_error[1024];
    char op_error[1024]; /* detail set by the running collective */
    /* A running operation that fails before it sent or consumed anything sets
     * chan.op_local: for a blocking call with nothing queued behind it, the failure is its
     * caller's alone (the call is undone, the communicator stays usable); otherwise the
     * communicator fails, as a call queued behind would take the undone call's place among
     * the peers' calls. */
    /* owned by the running operation */
    gcoll_coll_scratch_t scratch; /* reused temporary of the algorithms (coll.h) */
    size_t algo_memo_bytes;       /* allreduce: the last size the cost model chose for, and */
    int algo_memo;                /* its choice (-1: none yet) */
    double probe_bw;   /* GCOLL_PROBE: bytes/s per rank the slowest rank saw at init; 0: none */
    char local_ip[64]; /* this rank's address for transports (a split's new instance) */
    struct gcoll_hier *hier; /* host layout and hierarchy children (lib/hier/hier.c) */
    /* point-to-point: messages sent to and received from each peer so far (2 * size,
     * allocated at the first); owned by the running operation */
    uint64_t *p2p_count;
    /* An open group (group.c): the thread that opened it ((uintptr_t)pthread_self(), 0
     * when none; atomic, and written only by that thread, which alone then touches the
     * rest), its depth, and the requests captured so far, in issue order. Without the
     * lock: a send and a receive in a group took four lock and unlock pairs more than
     * they needed, a quarter of an 8-byte exchange over shared memory. */
    uintptr_t group_owner;
    int group_depth;
    gcoll_request_t *ghead, *gtail;
};

/* Whether the calling thread has a group open on comm. Never blocks. */
static inline int gcoll_comm_group_mine(gcoll_comm_t *comm)
{
    return __atomic_load_n(&comm->group_owner, __ATOMIC_ACQUIRE) == (uintptr_t)pthread_self();
}

/* The steps of creating a communicator that init and split share: allocation with the
 * configuration loaded (*comm_p set even on failure, for gcoll_comm_free); the job key;
 * the progress thread, once the transport is connected. */
gcoll_status_t gcoll_comm_alloc(gcoll_comm_t **comm_p, char *err, size_t errlen);
gcoll_status_t gcoll_comm_set_key(gcoll_comm_t *comm, const char *key);
gcoll_status_t gcoll_comm_start(gcoll_comm_t *comm, const char *root, char *err, size_t errlen);
void gcoll_comm_free(gcoll_comm_t *comm);
/* The hierarchy's child communicators (lib/hier/hier.c): destroyed (collective, as
 * gcoll_comm_destroy) with the layout, or aborted with the parent. No-ops without. */
void gcoll_hier_release(gcoll_comm_t *comm);
void gcoll_hier_abort(gcoll_comm_t *comm);

/* The context the algorithms run with (coll.h), for the running operation of comm. */
static inline gcoll_coll_t gcoll_comm_coll(gcoll_comm_t *comm)
{
    return (gcoll_coll_t){.ch = &comm->chan,
                          .rank = comm->rank,
                          .size = comm->size,
                          .cfg = &comm->cfg.coll,
                          .scratch = &comm->scratch,
                          .hier = comm->hier};
}

/* Queues req (nonblocking form) or runs it (blocking form, inline when idle). */
gcoll_status_t gcoll_comm_submit(gcoll_comm_t *comm, gcoll_request_t *req, gcoll_request_t **req_p);
/* Completes a request that ran inside another (a group's): status set, waiters woken;
 * a blocking one (no handle) is freed. */
void gcoll_request_complete(gcoll_request_t *req, gcoll_status_t st);
/* Frees a request (its release runs). */
void gcoll_request_free(gcoll_request_t *req);
/* Whether the calling thread has a group open on comm (inside a group, calls are captured,
 * and the hierarchy is not used). */
int gcoll_comm_in_group(gcoll_comm_t *comm);
/* Fills *req for run with args: a blocking call's request on its caller's stack, which
 * gcoll_comm_submit copies to the heap only if a group captures it. */
void gcoll_request_init(gcoll_request_t *req, gcoll_comm_t *comm, const char *name,
                        gcoll_run_fn_t run, const gcoll_args_t *args);
/* Allocates a request for run with args; NULL on ENOMEM. */
gcoll_request_t *gcoll_request_new(gcoll_comm_t *comm, const char *name, gcoll_run_fn_t run,
                                   const gcoll_args_t *args);
/* Validation shared by entry points: GCOLL_OK when ok, else GCOLL_ERR_INVALID with the
 * message logged and kept as the comm's error (comm may be NULL). A macro so that the
 * passing check, on every call, costs a branch and not a variadic call. */
#define gcoll_comm_check_args(comm, what, ok, ...)                                                 \
    ((ok) ? GCOLL_OK : gcoll_comm_args_failed((comm), (what), __VA_ARGS__))
gcoll_status_t gcoll_comm_args_failed(gcoll_comm_t *comm, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), cold));

/* The running collective records why it failed (first message wins). */
void gcoll_comm_set_error(gcoll_comm_t *comm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- the running operation's channel, for code written against the communicator ---- */

static inline uint64_t gcoll_tag(const gcoll_comm_t *comm, uint32_t sub)
{
    return gcoll_channel_tag(&comm->chan, sub);
}
static inline int gcoll_net_peer_shares_cpu(const gcoll_comm_t *comm, int peer)
{
    return gcoll_channel_peer_shares_cpu(&comm->chan, peer);
}
static inline gcoll_status_t gcoll_net_isend(gcoll_comm_t *comm, gcoll_treq_t *r, int peer,
                                             uint32_t sub, uint32_t sig, const void *buf,
                                             size_t len)
{
    return gcoll_channel_isend(&comm->chan, r, peer, sub, sig, buf, len);
}
static inline gcoll_status_t gcoll_net_irecv(gcoll_comm_t *comm, gcoll_treq_t *r, int peer,
                                             uint32_t sub, uint32_t sig, void *buf, size_t len,
                                             unsigned flags)
{
    return gcoll_channel_irecv(&comm->chan, r, peer, sub, sig, buf, len, flags);
}
static inline gcoll_status_t gcoll_net_poll(gcoll_comm_t *comm, const gcoll_treq_t *waiting)
{
    return gcoll_channel_poll(&comm->chan, waiting);
}
static inline gcoll_status_t gcoll_net_progress(gcoll_comm_t *comm, int timeout_ms)
{
    return gcoll_channel_progress(&comm->chan, timeout_ms);
}
static inline gcoll_status_t gcoll_net_done(gcoll_comm_t *comm, gcoll_treq_t *r, int *done_p)
{
    return gcoll_channel_done(&comm->chan, r, done_p);
}
static inline gcoll_status_t gcoll_net_waitall(gcoll_comm_t *comm, gcoll_treq_t *reqs, int n)
{
    return gcoll_channel_waitall(&comm->chan, reqs, n);
}
static inline void gcoll_net_cancel(gcoll_comm_t *comm, gcoll_treq_t *reqs, int n)
{
    gcoll_channel_cancel(&comm->chan, reqs, n);
}

#endif /* GCOLL_COMM_H */
