/* transport.h: the interface every transport implements (an ops table in the manner of
 * NCCL's net plugin and libfabric's providers). Collectives see only this. */
#ifndef GCOLL_TRANSPORT_H
#define GCOLL_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "base/auth.h"
#include "base/config.h"
#include "gcoll.h"

typedef struct gcoll_transport gcoll_transport_t;

enum {
    GCOLL_TREQ_ANYLEN = 1,  /* irecv: accept any message up to len bytes (nbytes says how many) */
    GCOLL_TREQ_COUNTED = 2, /* comm.c: an ANYLEN receive's bytes are in the counters (not for
                             * transports) */
    /* irecv: kept posted for a message that may never come (the rooted calls' probes): it
     * does not make the transport take in the messages queued before its own */
    GCOLL_TREQ_STANDING = 4,
    /* irecv: this rank has copying of its own to do while the message arrives (a gather's
     * root): a transport with the choice has the sender's CPU move the data into buf (a
     * single copy the sender writes) rather than this rank's (one it reads) */
    GCOLL_TREQ_RECEIVER_BUSY = 8
};

/* One point-to-point operation. The caller owns the memory and fills the first block;
 * the transport fills the results and may use the private block until done is set. A
 * (peer, tag) pair must be unique among a direction's outstanding messages: the
 * collectives put their sequence number in the tag. */
typedef struct gcoll_treq {
    int peer;
    uint64_t tag;
    uint32_t sig;   /* signature both sides must agree on (0 on both: not checked) */
    unsigned flags; /* GCOLL_TREQ_* */
    void *buf;
    size_t len;
    /* results */
    int done;
    gcoll_status_t status;
    size_t nbytes; /* bytes received (irecv) */
    /* private to the transport */
    struct gcoll_treq *next;
    size_t pending;
    void *priv;
} gcoll_treq_t;

typedef struct {
    int rank;
    int size;
    const gcoll_config_t *cfg;
    const char *local_ip; /* address on the interface that routes to the root */
    gcoll_key_t key;
    int wake_fd; /* readable when the communicator is aborted: progress must return */
} gcoll_transport_params_t;

/* Blocking rules are given per field; "never blocks" means it returns without waiting
 * for a peer. All but probe are called from the one thread that owns the communicator. */
typedef struct gcoll_transport_ops {
    size_t size; /* sizeof(gcoll_transport_ops_t): the table can grow */
    const char *name;
    /* Whether this transport can run here; reason in why. Never blocks for long. */
    gcoll_status_t (*probe)(char *why, size_t whylen);
    /* Creates an instance listening on its local address. Never blocks on peers. */
    gcoll_status_t (*create)(const gcoll_transport_params_t *params, gcoll_transport_t **t_p);
    /* Writes the local address blob (at most *len_p bytes; *len_p receives the length). */
    gcoll_status_t (*address)(gcoll_transport_t *t, void *buf, size_t *len_p);
    /* Connects to every peer from all ranks' blobs. Blocks until connected or deadline. */
    gcoll_status_t (*connect)(gcoll_transport_t *t, const void *const *blobs, const size_t *lens,
                              uint64_t deadline_ms);
    /* Posts a send/receive. Never blocks. A failure to post is returned; a failure later
     * is reported in req->status when req->done is set. */
    gcoll_status_t (*isend)(gcoll_transport_t *t, gcoll_treq_t *req);
    gcoll_status_t (*irecv)(gcoll_transport_t *t, gcoll_treq_t *req);
    /* Advances outstanding operations, waiting at most timeout_ms for an event. Returns an
     * error only for failures of the transport as a whole. */
    gcoll_status_t (*progress)(gcoll_transport_t *t, int timeout_ms);
    /* Withdraws an incomplete request (after a timeout or abort). Never blocks. */
    void (*cancel)(gcoll_transport_t *t, gcoll_treq_t *req);
    /* Tells every peer this rank gives up, with the status and a reason; peers fail their
     * pending operations with GCOLL_ERR_MISMATCH if that was the cause, else
     * GCOLL_ERR_PEER. Best effort; bounded. */
    void (*abort)(gcoll_transport_t *t, gcoll_status_t status, const char *reason);
    /* Detail of the last failure ("connection to rank 3 closed"), "" if none. */
    const char *(*last_error)(gcoll_transport_t *t);
    /* Registers memory for repeated use; TCP needs none (handle NULL). */
    gcoll_status_t (*mem_reg)(gcoll_transport_t *t, void *buf, size_t len, void **handle_p);
    void (*mem_dereg)(gcoll_transport_t *t, void *handle);
    /* Closes every connection and frees the instance. Bounded. */
    void (*destroy)(gcoll_transport_t *t);
    /* Optional (NULL: unknown). Whether the peer last ran on the CPU the caller runs on:
     * 1 yes, 0 on another one, -1 unknown. Waits use it to choose between polling (the
     * peer runs elsewhere) and yielding the CPU (the peer needs it). Never blocks. */
    int (*peer_shares_cpu)(gcoll_transport_t *t, int peer);
    /* Optional (NULL: never). Whether this transport reaches peers over RDMA here; desc
     * receives what it found. GCOLL_TRANSPORT=auto takes the first built transport that
     * answers 1, else tcp. Called before any instance exists; never blocks for long. */
    int (*rdma_capable)(char *desc, size_t desclen);
    /* Optional (NULL: unknown). The network interface this transport's traffic leaves by,
     * from its settings in cfg or the route to root (host:port, may be NULL), into ifname;
     * GCOLL_PROGRESS_CPU=auto places the progress thread near it. 0 when found, else -1.
     * Called before an instance exists; never blocks. */
    int (*nic)(const gcoll_config_t *cfg, const char *root, char *ifname, size_t len);
    /* Optional (NULL: no receive from any source). Of the messages with tag tags[peer] from
     * each peer (tags[peer] 0: that peer is left out) that arrived and no receive claimed
     * yet, the first come: GCOLL_OK with its peer in *peer_p, or -1 when none came. When
     * none came and an included peer failed, its status with *peer_p naming it. A receive
     * posted next for that peer and tag takes the message (match.h's peek). Never blocks. */
    gcoll_status_t (*peek)(gcoll_transport_t *t, const uint64_t *tags, int *peer_p);
    /* Optional (NULL: never). Whether this transport moves data between ranks of one host
     * through memory (shared memory, single copy) rather than the network stack; desc
     * receives what it found. GCOLL_TRANSPORT=auto takes it when the launcher puts every
     * rank on this host. Called before any instance exists; never blocks for long. */
    int (*local_capable)(char *desc, size_t desclen);
    /* Optional (NULL: nothing to do). Called when an operation has ended on this rank:
     * moves the control messages it owes its peers (answers to their sends) that the
     * transport had to queue, until they leave or timeout_ms passes. Such
     * a message otherwise moves only while this rank progresses this transport again,
     * and a peer that waits for it before it can finish may be what this rank waits for
     * elsewhere (two communicators in one process). Never fails the operation. */
    void (*flush)(gcoll_transport_t *t, int64_t timeout_ms);
    /* Optional (NULL: 0). The largest message that every rank sends every other through
     * shared memory without a handshake (a mailbox record), agreed at connect so that it is
     * the same on every rank; 0 when some pair has no such path. Pipelined collectives cut
     * their segments to it. Never blocks. */
    size_t (*mesh_max)(gcoll_transport_t *t);
    /* Optional (NULL: never). Whether a send of len bytes to peer, should it arrive before
     * its receive is posted, is held there without its data (a descriptor; the data waits
     * in the sender's buffer): such a send needs no handshake to spare the receiver a copy
     * into memory of its own. Never blocks. */
    int (*send_held)(gcoll_transport_t *t, int peer, size_t len);
} gcoll_transport_ops_t;

extern const gcoll_transport_ops_t gcoll_tcp_ops;
#ifdef GCOLL_HAVE_UCX
extern const gcoll_transport_ops_t gcoll_ucx_ops;
#endif
#ifdef GCOLL_HAVE_VERBS
extern const gcoll_transport_ops_t gcoll_verbs_ops;
#endif

/* Looks up a built transport by name; NULL if not built. */
const gcoll_transport_ops_t *gcoll_transport_find(const char *name);
/* GCOLL_TRANSPORT=auto: the first built transport whose rdma_capable answers 1, else with
 * one_host (every rank on this host) the first whose local_capable does, else tcp (desc
 * "": desc receives what the chosen one found; *local_p says which question it answered). */
const gcoll_transport_ops_t *gcoll_transport_auto(char *desc, size_t desclen, int one_host,
                                                  int *local_p);

#endif /* GCOLL_TRANSPORT_H */
