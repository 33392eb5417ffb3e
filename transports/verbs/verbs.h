/* verbs.h: internals of the verbs transport shared by verbs*.c and its unit tests: wire
 * format of slot messages and immediates, registration cache, per-peer state. */
#ifndef GCOLL_VERBS_H
#define GCOLL_VERBS_H

#include <stddef.h>
#include <stdint.h>

#include "transports/verbs/ibvwrap.h"
#include "transports/match.h"
#include "transports/transport.h"

/* ---- wire format -------------------------------------------------------------------
 * Every eager message is one RDMA write with immediate into a slot of the receiver's
 * ring: a 48-byte header (little-endian) then the payload. The 32-bit immediate says what
 * arrived: type in the top 2 bits, a value in the low 30.
 *   SLOT   value = slot index; the slot holds a header (DATA, RTS, CTS or NACK)
 *   CREDIT value = slots the receiver freed since it last said so (zero-length write)
 *   FIN    value = receiver's rendezvous id: the last chunk of a rendezvous landed
 * Header: 0 magic u16 | 2 version u8 | 3 type u8 | 4 sig u32 | 8 tag u64 | 16 len u64 |
 *         24 addr u64 | 32 rkey u32 | 36 id1 u32 | 40 id2 u32 | 44 credits u16 |
 *         46 status u8 (negated gcoll_status_t) | 47 zero u8 */
#define GCOLL_VB_HDR_LEN 48
#define GCOLL_VB_MAGIC 0x5647u /* "GV" */
#define GCOLL_VB_VERSION 1
#define GCOLL_VB_IMM_MAX 0x3fffffffu

enum { GCOLL_VB_IMM_SLOT = 0, GCOLL_VB_IMM_CREDIT = 1, GCOLL_VB_IMM_FIN = 2 };
enum {
    GCOLL_VB_MSG_DATA = 1, /* eager payload; len = payload bytes */
    GCOLL_VB_MSG_RTS = 2,  /* rendezvous offer: len = message bytes, id1 = sender's id */
    GCOLL_VB_MSG_CTS = 3,  /* rendezvous answer: write len bytes at addr/rkey, id1 = sender's
                            * id, id2 = receiver's id for the FIN immediate */
    GCOLL_VB_MSG_NACK = 4  /* rendezvous refused (mismatch): id1 = sender's id, status */
};

typedef struct {
    uint8_t type;
    uint8_t status;   /* -gcoll_status_t */
    uint16_t credits; /* piggybacked credit return */
    uint32_t sig;
    uint64_t tag;
    uint64_t len;
    uint64_t addr;
    uint32_t rkey;
    uint32_t id1, id2;
} gcoll_vb_hdr_t;

static inline uint32_t gcoll_vb_imm(unsigned type, uint32_t value)
{
    return ((uint32_t)type << 30) | (value & GCOLL_VB_IMM_MAX);
}

void gcoll_vb_hdr_encode(const gcoll_vb_hdr_t *h, uint8_t *p);
/* Validates a slot message of byte_len bytes (as the completion reported) against the
 * slot's payload room: NULL if well formed, else why not. Never reads past byte_len. */
const char *gcoll_vb_hdr_decode(const uint8_t *p, size_t byte_len, size_t eager_max,
                                gcoll_vb_hdr_t *h);

/* ---- registration cache --------------------------------------------------------------
 * Registrations of user buffers for rendezvous, looked up by address range. Without a
 * memory-release hook a cached registration can outlive the pages it pinned (free, then a
 * new mapping at the same address), so caching of transient buffers is off unless
 * GCOLL_IB_REG_CACHE > 0; regions registered through mem_reg are always found. */
typedef struct gcoll_vb_reg {
    struct gcoll_vb_reg *prev, *next; /* in the cache, most recently used first */
    uintptr_t start, end;             /* registered range (page aligned) */
    struct ibv_mr *mr;
    int refs;
    int in_cache;
    int user; /* from mem_reg: never evicted, dropped by mem_dereg */
} gcoll_vb_reg_t;

typedef struct {
    const gcoll_ibv_ops_t *ibv;
    struct ibv_pd *pd;
    int access;
    gcoll_vb_reg_t *head, *tail;
    long count, max; /* cached entries that are not user regions; max 0 = no caching */
    uint64_t hits, misses, evictions, registrations;
} gcoll_vb_regcache_t;

void gcoll_vb_reg_init(gcoll_vb_regcache_t *c, const gcoll_ibv_ops_t *ibv, struct ibv_pd *pd,
                       int access, long max);
/* A registration covering [addr, addr+len), from the cache or new. errno-style reason in
 * err on failure (GCOLL_ERR_TRANSPORT; GCOLL_ERR_NOMEM). */
gcoll_status_t gcoll_vb_reg_acquire(gcoll_vb_regcache_t *c, const void *addr, size_t len, int user,
                                    gcoll_vb_reg_t **reg_p, char *err, size_t errlen);
void gcoll_vb_reg_release(gcoll_vb_regcache_t *c, gcoll_vb_reg_t *r);
/* Forgets every registration overlapping [addr, addr+len); ones in use are deregistered
 * when released. */
void gcoll_vb_reg_invalidate(gcoll_vb_regcache_t *c, const void *addr, size_t len);
void gcoll_vb_reg_destroy(gcoll_vb_regcache_t *c);

/* ---- work request ids: kind (4 bits) | peer (28 bits) | value (32 bits) ---------------- */
enum { GCOLL_VB_WR_SLOT = 1, GCOLL_VB_WR_CREDIT, GCOLL_VB_WR_RDV, GCOLL_VB_WR_RECV };

static inline uint64_t gcoll_vb_wrid(unsigned kind, int peer, uint32_t value)
{
    return ((uint64_t)kind << 60) | ((uint64_t)(uint32_t)peer & 0xfffffffull) << 32 | value;
}

/* ---- transport state ----------------------------------------------------------------- */
typedef struct {
    struct ibv_qp *qp;
    uint32_t psn; /* our initial send PSN */
    int sq_free;  /* send work requests we may still post */
} gcoll_vb_qp_t;

/* A slot message waiting for a credit, a staging slot and send-queue room. */
typedef struct gcoll_vb_txop {
    struct gcoll_vb_txop *next;
    gcoll_vb_hdr_t hdr;
    gcoll_treq_t *req; /* DATA: completes on the send completion; RTS: owner */
} gcoll_vb_txop_t;

/* A rendezvous in progress, on either side. */
enum { GCOLL_VB_RDV_WAIT_CTS = 1, GCOLL_VB_RDV_WRITING, GCOLL_VB_RDV_POSTED, GCOLL_VB_RDV_RECV };
typedef struct gcoll_vb_rdv {
    struct gcoll_vb_rdv *next; /* in the peer's write queue */
    uint32_t id;
    int state;
    gcoll_treq_t *req;
    gcoll_vb_reg_t *reg;
    size_t len, off; /* bytes to write, bytes posted */
    uint64_t raddr;
    uint32_t rkey, rid; /* remote buffer and the receiver's id for the FIN */
    int qp;             /* every chunk on one QP: RC order makes the FIN land last */
    int chunks_out;     /* posted, not completed */
} gcoll_vb_rdv_t;

/* An unexpected message's entry (gcoll_unexp_t) holds an eager payload (kind
 * GCOLL_VB_UNEXP_EAGER, data), or a rendezvous offer (GCOLL_VB_UNEXP_RTS, aux: the sender's
 * rendezvous id). */
enum { GCOLL_VB_UNEXP_EAGER = 0, GCOLL_VB_UNEXP_RTS = 1 };

typedef struct {
    uint8_t busy;
    gcoll_treq_t *req;
} gcoll_vb_stage_t;

typedef struct {
    gcoll_vb_qp_t *qps;
    unsigned rr;
    int fd;     /* side channel (TCP): QP exchange at connect, then abort notices and EOF */
    int closed; /* the peer left cleanly: buffered messages can still be received */
    gcoll_match_peer_t rx; /* posted receives, unexpected messages; failed: every operation
                            * with this peer fails with rx.status */
    /* remote ring */
    uint64_t ring_raddr;
    uint32_t ring_rkey;
    /* send side: credits = nslots - (tx_seq - tx_acked) */
    uint64_t tx_seq, tx_acked;
    gcoll_vb_stage_t *stage;
    gcoll_vb_txop_t *txq, *txq_tail;
    gcoll_vb_rdv_t **rdv_tx;
    uint32_t ntx;
    gcoll_vb_rdv_t *wq, *wq_tail; /* rendezvous sends with chunks to post */
    /* receive side */
    uint8_t *rx_done; /* slot processed but not yet returned (out-of-order QPs) */
    uint64_t rx_count, rx_head, owed;
    gcoll_vb_rdv_t **rdv_rx;
    uint32_t nrx;
} gcoll_vb_peer_t;

struct gcoll_transport {
    int rank, size;
    const gcoll_ibv_ops_t *ibv;
    gcoll_key_t key;
    int wake_fd;
    /* device */
    struct ibv_context *ctx;
    char dev_name[64];
    uint8_t port;
    struct ibv_port_attr port_attr;
    union ibv_gid gid;
    int gid_index;
    int roce;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    /* settings */
    int nqp;
    uint32_t nslots;
    size_t slot_size, eager_max, chunk_max;
    int sq_depth, rq_depth;
    int mtu_cfg; /* 0 auto, else enum ibv_mtu */
    int timeout, retry_cnt;
    /* eager rings: peer p's slots at p * nslots * slot_size */
    uint8_t *rx_mem, *tx_mem;
    struct ibv_mr *rx_mr, *tx_mr;
    gcoll_vb_regcache_t reg;
    gcoll_vb_peer_t *peers;
    gcoll_match_t match;
    /* side channel */
    int listen_fd, epfd;
    char ip[64];
    int lport;
    char errmsg[512];
    /* A peer's abort notice travels on the side channel and can overtake RDMA data it
     * posted earlier: pending operations fail only after VB_ABORT_GRACE_MS without a
     * completion, so whatever was in flight still lands. */
    gcoll_status_t abort_status;
    uint64_t abort_quiet_since;
    int abort_final;
    /* counters the unit tests read */
    uint64_t n_credit_msgs, n_chunks, n_stalls;
};

/* verbs.c */
void gcoll_vb_set_error(gcoll_transport_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void gcoll_vb_complete(gcoll_treq_t *req, gcoll_status_t st);
/* The completion hook of t->match. */
void gcoll_vb_match_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st);
void gcoll_vb_peer_fail(gcoll_transport_t *t, int peer, gcoll_status_t st);
/* gcoll status for a work completion status, and its enum name ("IBV_WC_RETRY_EXC_ERR"). */
gcoll_status_t gcoll_vb_wc_status(enum ibv_wc_status s);
const char *gcoll_vb_wc_name(enum ibv_wc_status s);

/* verbs_setup.c */
gcoll_status_t gcoll_vb_probe(char *why, size_t whylen);
gcoll_status_t gcoll_vb_create(const gcoll_transport_params_t *params, gcoll_transport_t **t_p);
gcoll_status_t gcoll_vb_address(gcoll_transport_t *t, void *buf, size_t *len_p);
gcoll_status_t gcoll_vb_connect(gcoll_transport_t *t, const void *const *blobs, const size_t *lens,
                                uint64_t deadline_ms);
void gcoll_vb_destroy(gcoll_transport_t *t);
/* Parses GCOLL_IB_HCA ("mlx5_0:1,^mlx4"): whether device name / port is selected. */
int gcoll_vb_hca_match(const char *spec, const char *dev, int port);

/* verbs_p2p.c: helpers shared with verbs_cq.c */
void gcoll_vb_proto_error(gcoll_transport_t *t, int peer, const char *why);
/* A rendezvous record under the lowest free id of a table; NULL when out of memory. */
gcoll_vb_rdv_t *gcoll_vb_rdv_new(gcoll_vb_rdv_t ***tab, uint32_t *n);
void gcoll_vb_rdv_free(gcoll_transport_t *t, gcoll_vb_rdv_t **tab, gcoll_vb_rdv_t *r);
gcoll_status_t gcoll_vb_queue_msg(gcoll_vb_peer_t *p, const gcoll_vb_hdr_t *h, gcoll_treq_t *req);
void gcoll_vb_queue_nack(gcoll_transport_t *t, int peer, uint32_t sid, gcoll_status_t st);
void gcoll_vb_push_all(gcoll_transport_t *t);
/* verbs_cq.c: arrivals, also used by isend (to oneself) and irecv (a waiting offer) */
void gcoll_vb_deliver_data(gcoll_transport_t *t, int peer, uint64_t tag, uint32_t sig,
                           const uint8_t *data, size_t len);
void gcoll_vb_rdv_recv_start(gcoll_transport_t *t, int peer, gcoll_treq_t *req, size_t len,
                             uint32_t sid);

/* verbs_p2p.c */
gcoll_status_t gcoll_vb_isend(gcoll_transport_t *t, gcoll_treq_t *req);
gcoll_status_t gcoll_vb_irecv(gcoll_transport_t *t, gcoll_treq_t *req);
void gcoll_vb_cancel(gcoll_transport_t *t, gcoll_treq_t *req);
gcoll_status_t gcoll_vb_peek(gcoll_transport_t *t, const uint64_t *tags, int *peer_p);
/* Posts what a peer's credits and send queues allow. */
void gcoll_vb_push(gcoll_transport_t *t, int peer);
/* verbs_cq.c */
gcoll_status_t gcoll_vb_progress(gcoll_transport_t *t, int timeout_ms);
void gcoll_vb_abort(gcoll_transport_t *t, gcoll_status_t status, const char *reason);
/* Polls the completion queue until empty; returns completions handled. */
int gcoll_vb_drain(gcoll_transport_t *t);
/* Frees a peer's send queues and rendezvous; with st < 0 their requests are completed
 * with st first (destroy passes GCOLL_OK: requests may be gone by then). The receive side
 * is rx's (gcoll_match_fail, gcoll_match_peer_fini). */
void gcoll_vb_peer_release(gcoll_transport_t *t, gcoll_vb_peer_t *p, gcoll_status_t st);

#endif /* GCOLL_VERBS_H */
