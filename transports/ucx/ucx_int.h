/* ucx_int.h: state shared by the UCX transport's files (ucx.c data path, ucx_setup.c life
 * cycle, ucx_mem.c registration cache). Internal to the files of transports/ucx/. */
#ifndef GCOLL_UCX_INT_H
#define GCOLL_UCX_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "transports/match.h"
#include "transports/transport.h"
#include "transports/ucx/ucx.h"

/* Every message is one UCP active message (ucp_am_send_nbx) with this header. AM rather
 * than tag matching because gcoll's tag is already 64 bits (seq << 32 | sub): UCP's 64-bit
 * tag has no room left for the source rank and the 32-bit signature, while an AM header
 * carries all of them, and the receiver sees length and signature before a byte lands in
 * the caller's buffer (so a mismatch is never an overrun nor a UCX truncation error).
 *
 * Layout (little-endian, GCOLL_UCX_HDR_LEN bytes): magic u32, version u8, type u8,
 * status u8 (abort: the gcoll status, negated), reserved u8, source rank u32, sig u32,
 * cookie u64 (the receiver's, from its address blob), tag u64. */
#define GCOLL_UCX_AM_ID 7
#define GCOLL_UCX_MAGIC 0x58554347u /* "GCUX" */
#define GCOLL_UCX_VERSION 5
#define GCOLL_UCX_HDR_LEN 32
#define GCOLL_UCX_MAX_REASON 1024 /* longest abort reason accepted */
/* Longest abort reason sent: the whole message must fit one UCX short active message
 * (100 bytes on UCX 1.13's shared-memory fifo, with UCP's 8-byte header and ours); a
 * longer one waits on shared memory until the peer progresses, which may be too late. */
#define GCOLL_UCX_ABORT_INLINE 56

enum {
    UCX_MSG_DATA = 1,
    UCX_MSG_HELLO = 2,
    UCX_MSG_ABORT = 3,
    UCX_MSG_CMA = 4,
    UCX_MSG_FIN = 5,
    UCX_MSG_BELL = 6, /* no payload: a small message is waiting in the shared-memory mailbox */
    UCX_MSG_PUT = 7,  /* single copy: the receiver asks the sender to write (below) */
    UCX_MSG_PUTFIN = 8
};

/* Single copy between ranks on one host (GCOLL_UCX_CMA_MIN): instead of the data, the
 * sender sends a UCX_MSG_CMA message (header as a data message's; payload: the buffer's
 * address u64, its length u64, the address of a token word u64 and the token u64); the
 * receiver, once the message matches a receive, reads the buffer with process_vm_readv
 * straight into it, then reads the token word again, and answers UCX_MSG_FIN (payload: the
 * token u64; status: the receiver's outcome). The send completes on the FIN. A send that is
 * cancelled or fails clears its token word before its buffer goes back to the caller, so a
 * read racing with that sees the token gone and fails instead of delivering stale data. The
 * hello of the connect round says whether its sender can read the receiver (flag byte 1),
 * which each rank checks at connect by reading a random word the peer published with its
 * address. */
#define GCOLL_UCX_CMA_DESC 32
#define GCOLL_UCX_HELLO_CMA 1u

/* A receive made with GCOLL_TREQ_RECEIVER_BUSY (its rank copies its own data meanwhile)
 * answers a matched UCX_MSG_CMA with UCX_MSG_PUT instead of reading (payload, u64 each: the
 * sender's token, the receive buffer's address, the length, how many bytes from the start
 * the sender is to write, the address of the receiver's token word, its token). The
 * sender checks that word, writes its part with process_vm_writev, checks the word again,
 * and answers UCX_MSG_PUTFIN (payload: the receiver's token; status: GCOLL_OK once
 * written; GCOLL_ERR_UNSUPPORTED when it cannot write, the receiver then reads it all as
 * above; else the send was withdrawn). Written whole, the send is then complete;
 * otherwise the receiver reads the rest as soon as its PUT left, and answers the PUTFIN
 * with a FIN that ends the send. A receive withdrawn meanwhile clears its word first and
 * waits (briefly) for the PUTFIN, so no write lands in a buffer handed back. */
#define GCOLL_UCX_PUT_LEN 48
typedef struct {
    uint64_t send_token, addr, len, wlen, tok_addr, token;
} ucx_put_t;
void gcoll_ucx_put_encode(const ucx_put_t *m, uint8_t out[GCOLL_UCX_PUT_LEN]);
/* NULL if valid, else what is wrong. */
const char *gcoll_ucx_put_decode(const void *buf, size_t len, ucx_put_t *m);

/* Shared-memory mailbox between ranks of one host (GCOLL_UCX_SHM_MAX, ucx_shm.c): every
 * rank creates a memfd (named gcoll-shm-<cookie>) holding a header page (magic, cookie,
 * communicator size, ring bytes; at byte 64 a word the owner sets while it sleeps in
 * epoll) and one ring per possible sender: a 128-byte control block (at 64 the
 * receiver's total bytes consumed, told in steps of 2 KiB (a 32nd of the ring) while records
 * wait in it, at once when it is empty or the sender asks; at 0 a flag the sender sets
 * when it aborts, at 8 the sender's ask, set while it has waited 25 us for room) and
 * GCOLL_UCX_SHM_RING bytes of records (sequence u64, tag u64, sig u32, length u32, payload; each
 * padded to 64 bytes; a length of 0xffffffff skips to the ring's end). A record is complete when
 * its sequence word, stored last, equals its position in the ring's byte stream plus one. Its
 * address blob carries pid u32 and fd u32; a peer maps it through /proc/<pid>/fd/<fd> after
 * checking name, size and header, and says so in its hello (flag byte 2), so the owner polls that
 * ring. A send of at most GCOLL_UCX_SHM_MAX bytes is written into the ring and complete; with the
 * ring full it waits for room while the owner drains it, and goes through UCX once the owner's head
 * stands still for SHM_STALL_NS (a (peer, tag) pair is unique among outstanding
 * messages, so the two paths need no order). After writing, the sender reads the
 * owner's sleep word (both sides fence) and, if set, sends UCX_MSG_BELL to wake it. */
#define GCOLL_UCX_HELLO_SHM 2u
#define GCOLL_UCX_SHM_RING 65536u
/* A sender that waits this long for ring room without the receiver's head moving sends
 * through UCX instead (ucx_shm.c's SHM_STALL_NS, per instance in shm_stall_limit_ns). */
#define GCOLL_UCX_SHM_STALL_NS 100000ull
#define GCOLL_UCX_SHM_MAX_LIMIT 16384u /* GCOLL_UCX_SHM_MAX is capped at a quarter ring */
#define GCOLL_UCX_BLOB_SHM_LEN 8

typedef struct {
    int type;
    int status; /* abort: the gcoll status (<= 0) */
    uint32_t src;
    uint32_t sig;
    uint64_t cookie;
    uint64_t tag;
} ucx_hdr_t;

void gcoll_ucx_hdr_encode(const ucx_hdr_t *h, uint8_t out[GCOLL_UCX_HDR_LEN]);
/* NULL if valid, else what is wrong. */
const char *gcoll_ucx_hdr_decode(const void *buf, size_t len, ucx_hdr_t *h);

/* An operation handed to UCX (a send, or the data phase of a rendezvous receive). UCX's
 * callback gets this, never the gcoll_treq_t, so a withdrawn request can be forgotten
 * while UCX still owns the operation. */
typedef struct ucx_op {
    struct ucx_op *next, *prev;
    gcoll_transport_t *t;
    gcoll_treq_t *req; /* NULL once withdrawn (cancel) or failed with the peer */
    void *ucp_req;     /* UCX's request while in flight */
    int peer;
    int is_recv;
    int is_ctl;                  /* hello or abort: no gcoll request behind it */
    int posting;                 /* inside the UCX call that starts it */
    int inline_done;             /* UCX called back before that call returned */
    void *inline_req;            /* ... with this request */
    ucs_status_t inline_status;  /* ... and this status */
    uint8_t *owned;              /* control payload owned by the op */
    size_t len;                  /* receive: message length */
    int cma;                     /* a single-copy send waiting for its FIN */
    int shm_wait;                /* a send waiting for room in the peer's ring (next) */
    volatile uint64_t cma_token; /* read by the receiver; 0 once the send is over */
    /* a single-copy receive the sender writes (cma and is_recv set): */
    uint64_t put_token;                   /* cma_token as sent, to find the op by */
    size_t put_wlen;                      /* the sender's part; we read the rest */
    int put_reading;                      /* our part is still to read (after the PUT left) */
    int put_fin;                          /* the PUTFIN's status + 1, come before that */
    uint8_t cma_desc[GCOLL_UCX_CMA_DESC]; /* the send's descriptor, to read it ourselves */
    uint8_t hdr[GCOLL_UCX_HDR_LEN];       /* send: must live until UCX completes the send */
} ucx_op_t;

/* What an unexpected message's entry (gcoll_unexp_t, kind) holds: a copy of its data
 * (data), UCX's descriptor of it (priv; eager persistent data, or a rendezvous whose data
 * is still at the sender), or a single-copy descriptor (data, GCOLL_UCX_CMA_DESC bytes;
 * the data is at the sender). */
enum { UCX_UNEXP_COPY = 0, UCX_UNEXP_DESC, UCX_UNEXP_RNDV, UCX_UNEXP_CMA };

typedef struct ucx_peer {
    gcoll_transport_t *t;
    int rank;
    ucp_ep_h ep;
    gcoll_match_peer_t rx; /* posted receives, unexpected messages, failure */
    int close_pending;     /* failed: force-close ep once out of UCX's callbacks */
    int tell_nomem;        /* given up with GCOLL_ERR_NOMEM: tell it before the close */
    ucs_status_t ep_error; /* UCX reported the endpoint failed; handled after progress */
    uint64_t ep_error_ms;  /* when */
    int hello;             /* last connect round heard from it (1 hello, 2 ready) */
    uint64_t cookie;       /* the peer's cookie, echoed in every header sent to it */
    int cma_pid;           /* its pid when we can read its memory (CMA), else 0 */
    int cma_send;          /* it said it can read ours: large sends go single-copy */
    /* shared-memory mailbox (ucx_shm.c) */
    uint8_t *shm_box;                        /* its mailbox mapped here, or NULL */
    uint8_t *shm_ring;                       /* our ring in it */
    uint64_t shm_tail;                       /* bytes we wrote into that ring */
    uint64_t shm_head_seen;                  /* its consumption as last read */
    struct ucx_op *shm_wait, *shm_wait_tail; /* sends waiting for room, oldest first */
    uint64_t shm_stall_head;                 /* the head we wait on moving ... */
    uint64_t shm_stall_ns;                   /* ... since then (gcoll_time_ns) */
    int shm_asked;                           /* we asked it for every head (ring_ask) */
    int shm_stalled;                         /* it stood still SHM_STALL_NS: sends by UCX */
    int shm_from;                            /* it writes into our mailbox: poll its ring */
    uint32_t shm_mesh;                       /* its ready hello: its mailbox size, when it
                                              * has a mailbox both ways with every rank */
    int shm_polling;                         /* inside poll_ring for it */
    uint64_t shm_head;                       /* bytes of its ring in our mailbox consumed */
    uint64_t shm_head_pub;                   /* ... as last told to it (poll_ring) */
    gcoll_treq_t *failing, *failing_tail;    /* failed in UCX, held for an abort (EP_ERROR_GRACE) */
} ucx_peer_t;

#define GCOLL_UCX_RCACHE_SIZE 16

typedef struct {
    void *addr;
    size_t len;
    ucp_mem_h memh;
    int refs;  /* handles given out and not yet deregistered */
    int stale; /* the range was unmapped: never hand out again */
    uint64_t used;
} ucx_reg_t;

struct gcoll_transport {
    int rank, size;
    int wake_fd;
    int epfd;
    int efd; /* UCX's worker event fd */
    ucp_context_h ctx;
    ucp_worker_h worker;
    uint64_t cookie;
    void *addr; /* worker address */
    size_t addr_len;
    ucx_peer_t *peers;
    gcoll_match_t match;
    ucx_op_t *ops;      /* in flight in UCX */
    ucx_op_t *op_cache; /* finished operations kept for reuse (linked by next) */
    int op_cached;
    unsigned long events; /* completions and arrivals, to tell progress it did something */
    int in_cb;            /* inside a UCX callback: defer endpoint closes */
    int aborted;          /* a peer's abort arrived (its status is in the peers) */
    int ep_errors;        /* some peer has ep_error set */
    int closing;          /* destroy: arrivals are dropped */
    int close_any;        /* some peer has close_pending */
    /* single copy (CMA) */
    size_t cma_min;     /* GCOLL_UCX_CMA_MIN; 0: off */
    uint64_t cma_probe; /* the word peers read at connect to test access */
    uint64_t cma_next;  /* next send token */
    struct ucx_fin {
        int peer, type, status;
        size_t len;
        uint8_t data[GCOLL_UCX_PUT_LEN];
    } * fin; /* FIN, PUT and PUTFIN messages to send */
    int nfin, capfin;
    unsigned long st_cma_sends, st_cma_recvs; /* logged by destroy (test-ucx.sh) */
    unsigned long st_cma_puts;                /* ... of the receives, written by the sender */
    int nput_reads;                           /* receives with put_reading set */
    int nbusy; /* GCOLL_TREQ_RECEIVER_BUSY receives posted and not complete */

    /* shared-memory mailbox (ucx_shm.c) */
    size_t shm_max;    /* GCOLL_UCX_SHM_MAX, capped; 0: off */
    size_t shm_mesh;   /* the least shm_mesh of all ranks (ours too) after connect */
    int shm_fd;        /* our mailbox's memfd until connected, else -1 */
    uint8_t *shm_box;  /* our mailbox */
    int shm_cpu1;      /* the CPU we last published in our mailbox, plus one (0: none) */
    unsigned shm_only; /* progress rounds in a row that polled the mailbox alone */
    int *shm_senders;  /* peers whose rings we poll */
    int nshm_senders;
    unsigned nshm_wait;          /* sends waiting for ring room, all peers */
    uint64_t shm_stall_limit_ns; /* SHM_STALL_NS (ucx_shm.c); a unit test stretches it */
    unsigned long st_shm_sends, st_shm_recvs, st_shm_bells, st_shm_full, st_shm_waits;

    uint64_t held_since_ns; /* start of the current run of held polls (ucx.c), or 0 */
    /* progress statistics, logged by destroy (GCOLL_DEBUG=debug; test-ucx.sh reads them) */
    unsigned long dropped;           /* messages refused (bad header, cookie or rank) */
    unsigned long st_sleeps;         /* waits on the event fd */
    unsigned long st_sleep_timeouts; /* ... that ran into their timeout, operations in flight */
    unsigned long st_held_polls;     /* arm said BUSY and progress found nothing to do */
    unsigned long st_held_naps;      /* ... of which napped (the others yielded the CPU) */
    unsigned long st_flush_polls;    /* an operation's end moved queued control messages */
    char errmsg[512];
    /* registration cache (ucx_mem.c) */
    pthread_mutex_t reg_lock;
    ucx_reg_t reg[GCOLL_UCX_RCACHE_SIZE];
    uint64_t reg_clock;
    int reg_hooked; /* UCM unmap events invalidate entries */
    int reg_held;   /* handles given out and not deregistered: 0 spares lookups the lock */
};

void gcoll_ucx_set_error(gcoll_transport_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
gcoll_status_t gcoll_ucx_status(ucs_status_t s);
/* Fails everything pending with this peer; later posts to it fail at once. */
void gcoll_ucx_peer_fail(gcoll_transport_t *t, int peer, gcoll_status_t st);
/* ucx_fail.c: endpoints of failed peers force-closed (outside UCX's callbacks); failed
 * endpoints UCX reported, taken up once their grace period allows. */
void gcoll_ucx_close_failed_eps(gcoll_transport_t *t);
void gcoll_ucx_handle_ep_errors(gcoll_transport_t *t);
/* The hooks of t->match (ctx: the transport): completing a request; releasing UCX's
 * descriptor of an unexpected message (rendezvous: tells the sender). */
void gcoll_ucx_match_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st);
void gcoll_ucx_match_release(void *ctx, gcoll_unexp_t *u);
/* Whether UCX_TLS leaves us shared-memory transports to bypass (single copy). */
int gcoll_ucx_tls_local(void);
/* Data path helpers shared by ucx.c and ucx_cma.c. */
void gcoll_ucx_complete(gcoll_transport_t *t, gcoll_treq_t *req, gcoll_status_t st);
ucx_op_t *gcoll_ucx_op_alloc(gcoll_transport_t *t);
void gcoll_ucx_op_release(gcoll_transport_t *t, ucx_op_t *op);
void gcoll_ucx_op_link(gcoll_transport_t *t, ucx_op_t *op);
void gcoll_ucx_op_unlink(gcoll_transport_t *t, ucx_op_t *op);
/* Holds a failed request of a live peer for the abort that may explain it. */
void gcoll_ucx_hold_for_abort(gcoll_transport_t *t, ucx_peer_t *p, gcoll_treq_t *req,
                              ucs_status_t status);
/* Sends one message (req NULL: a control message, its payload copied). */
gcoll_status_t gcoll_ucx_send_op(gcoll_transport_t *t, int peer, gcoll_treq_t *req,
                                 const ucx_hdr_t *h, const void *buf, size_t len);

/* Single copy (ucx_cma.c). */
/* Sends the single-copy answers (FIN) queued inside UCX's callbacks. */
void gcoll_ucx_fin_flush(gcoll_transport_t *t);
/* Queues (inside callbacks) or sends the answer to a single-copy send. */
void gcoll_ucx_fin_queue(gcoll_transport_t *t, int peer, uint64_t token, gcoll_status_t status);
/* Reads a matched descriptor's message into req->buf, then answers. */
void gcoll_ucx_cma_pull(gcoll_transport_t *t, int peer, gcoll_treq_t *req, const uint8_t *desc);
/* Takes a matched descriptor's message into req->buf: asks the sender to write it when req
 * has GCOLL_TREQ_RECEIVER_BUSY, else reads it (gcoll_ucx_cma_pull). */
void gcoll_ucx_cma_take(gcoll_transport_t *t, int peer, gcoll_treq_t *req, const uint8_t *desc);
/* Reads our share of the receives the sender writes, once their PUTs left. */
void gcoll_ucx_cma_put_reads(gcoll_transport_t *t);
/* A PUT for one of our single-copy sends; a PUTFIN for one of our receives. */
void gcoll_ucx_on_put(gcoll_transport_t *t, int peer, const void *data, size_t len);
void gcoll_ucx_on_putfin(gcoll_transport_t *t, int peer, int status, const void *data, size_t len);
/* A FIN arrived for one of our single-copy sends. */
void gcoll_ucx_on_fin(gcoll_transport_t *t, int peer, int status, const void *data, size_t len);
/* Ends (or withdraws) a single-copy send, its token cleared first. */
void gcoll_ucx_cma_send_end(gcoll_transport_t *t, ucx_op_t *op, gcoll_status_t st);
/* transport op send_held: whether a send of len to peer goes single-copy (not through the
 * mailbox), its data left here until the receiver takes it. */
int gcoll_ucx_cma_held(gcoll_transport_t *t, int peer, size_t len);
/* Starts a single-copy send of req (h: its data header, retyped). */
gcoll_status_t gcoll_ucx_cma_send(gcoll_transport_t *t, gcoll_treq_t *req, ucx_hdr_t *h);
/* Shared-memory mailbox (ucx_shm.c). */
gcoll_status_t gcoll_ucx_shm_create(gcoll_transport_t *t);
/* Writes the mailbox's GCOLL_UCX_BLOB_SHM_LEN blob bytes (zeros when off). */
void gcoll_ucx_shm_blob(gcoll_transport_t *t, uint8_t *c);
/* Maps the peer's mailbox from its blob bytes when it is on this host and ours to use. */
void gcoll_ucx_shm_attach(gcoll_transport_t *t, int peer, const uint8_t *c);
/* The peer's hello said it writes to our mailbox. */
void gcoll_ucx_shm_expect(gcoll_transport_t *t, int peer);
/* Connected: the mailbox's fd is no longer needed. */
void gcoll_ucx_shm_connected(gcoll_transport_t *t);
void gcoll_ucx_shm_destroy(gcoll_transport_t *t);
/* Sends req through the peer's mailbox: 1 taken (complete, or waiting for room in the
 * ring), 0 to be sent through UCX (the peer stopped draining its ring). */
int gcoll_ucx_shm_send(gcoll_transport_t *t, ucx_peer_t *p, gcoll_treq_t *req);
/* Writes waiting sends that now fit; the number completed. */
unsigned gcoll_ucx_shm_retry(gcoll_transport_t *t);
/* Withdraws a waiting send (cancel), or ends them all with st (the peer failed; st 0:
 * destroy, the requests are left alone). */
void gcoll_ucx_shm_unwait(gcoll_transport_t *t, struct ucx_op *op);
void gcoll_ucx_shm_end_waits(gcoll_transport_t *t, ucx_peer_t *p, gcoll_status_t st);
/* Sends req's data through UCX (ucx.c). */
gcoll_status_t gcoll_ucx_send_data(gcoll_transport_t *t, gcoll_treq_t *req);
/* Writes an abort to the peer's ring when it has room (the UCX copy is sent as well). */
void gcoll_ucx_shm_abort(ucx_peer_t *p, gcoll_status_t status, const char *reason, size_t len);
/* A peer's abort, from UCX or its ring: fails every peer. */
void gcoll_ucx_on_abort(gcoll_transport_t *t, int peer, int status, const void *data, size_t len);
/* Takes in everything the peer's ring holds (before it is failed), or every ring's (a
 * receive from any source). */
void gcoll_ucx_shm_drain(gcoll_transport_t *t, ucx_peer_t *p);
void gcoll_ucx_shm_drain_all(gcoll_transport_t *t);
/* Delivers what the rings hold for the receives posted; the number of messages. */
unsigned gcoll_ucx_shm_poll(gcoll_transport_t *t);
/* transport op peer_shares_cpu: from the CPU each rank publishes in its mailbox. */
int gcoll_ucx_shm_peer_cpu(gcoll_transport_t *t, int peer);
/* Our mailbox size when every peer and we write into each other's mailboxes, else 0 (sent
 * in the ready hello); transport op mesh_max: the agreed t->shm_mesh. */
uint32_t gcoll_ucx_shm_mesh_own(gcoll_transport_t *t);
size_t gcoll_ucx_shm_mesh_max(gcoll_transport_t *t);
/* Before and after sleeping in epoll: nonzero from sleep means do not (messages came). */
int gcoll_ucx_shm_sleep(gcoll_transport_t *t);
void gcoll_ucx_shm_wake(gcoll_transport_t *t);
/* Hands an arrived message (copied out of data) to its receive or the unexpected list. */
void gcoll_ucx_deliver(gcoll_transport_t *t, int peer, uint64_t tag, uint32_t sig, const void *data,
                       size_t len);

/* Drives UCX until it has nothing more to do right now; returns the work done. */
unsigned gcoll_ucx_drive(gcoll_transport_t *t);
/* Endpoint error handler (arg: the ucx_peer_t): a failed peer fails its operations. */
void gcoll_ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status);
/* UCX's active-message handler (ucx.c), installed by create. */
ucs_status_t gcoll_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param);
/* Sends a small control message (hello, abort) to peer; the op is tracked like a send. */
gcoll_status_t gcoll_ucx_send_ctl(gcoll_transport_t *t, int peer, int type, int status,
                                  const void *data, size_t len);

/* Registration cache (ucx_mem.c). */
gcoll_status_t gcoll_ucx_reg_init(gcoll_transport_t *t);
void gcoll_ucx_reg_fini(gcoll_transport_t *t);
gcoll_status_t gcoll_ucx_mem_reg(gcoll_transport_t *t, void *buf, size_t len, void **handle_p);
void gcoll_ucx_mem_dereg(gcoll_transport_t *t, void *handle);
/* Memory handle of a live registration covering [buf, buf+len), or NULL. */
ucp_mem_h gcoll_ucx_reg_lookup(gcoll_transport_t *t, const void *buf, size_t len);

/* Life cycle (ucx_setup.c). */
gcoll_status_t gcoll_ucx_probe(char *why, size_t whylen);
gcoll_status_t gcoll_ucx_create(const gcoll_transport_params_t *params, gcoll_transport_t **t_p);
gcoll_status_t gcoll_ucx_address(gcoll_transport_t *t, void *buf, size_t *len_p);
gcoll_status_t gcoll_ucx_connect(gcoll_transport_t *t, const void *const *blobs, const size_t *lens,
                                 uint64_t deadline_ms);
void gcoll_ucx_destroy(gcoll_transport_t *t);

#endif /* GCOLL_UCX_INT_H */
