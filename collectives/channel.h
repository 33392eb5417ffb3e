/* channel.h: the channel between collectives and a transport, the only way a collective
 * reaches one. It owns the transport instance and its ops, the running operation's
 * sequence number (the high half of every tag), the call signatures, the deadline and the
 * polling policy of waits, and the traffic counters. Internal; used by the running
 * operation only (one thread at a time). */
#ifndef GCOLL_CHANNEL_H
#define GCOLL_CHANNEL_H

#include <stdint.h>

#include "gcoll.h"
#include "transports/transport.h"
#include "base/ticks.h"
#include "base/util.h"

typedef struct gcoll_channel {
    const gcoll_transport_ops_t *ops;
    gcoll_transport_t *tp;
    uint32_t seq;          /* of the running operation: tags are (seq << 32) | sub */
    uint64_t wait_from_ns; /* when it first polled (0: not yet) */
    int64_t timeout_ms;    /* GCOLL_TIMEOUT_MS: the silence a wait tolerates */
    uint64_t deadline_ms;
    int deadline_stale;        /* a request completed: the next poll moves the deadline out */
    uint64_t spin_ns;          /* blocking waits poll this long before sleeping (GCOLL_SPIN_US) */
    uint64_t spin_from_ns;     /* start of the current polling, 0: none */
    int wait_slept;            /* the current wait slept: it polls GCOLL_SPIN_US only */
    int spin_large;            /* a CPU per local rank: large waits may poll longer */
    size_t op_bytes;           /* the running operation's size, where it tells (0: not) */
    uint64_t poll_prev_ns;     /* clock at the last polling round */
    unsigned hot_skip;         /* polling rounds left before the next clock read */
    int hot_unclocked;         /* rounds ran since the last clock read */
    int first_unclocked;       /* the wait's first round ran, without reading the clock */
    gcoll_counters_t counters; /* but ns_total: */
    uint64_t ticks_total;      /* the operations' time in gcoll_ticks (base/ticks.h) */
    /* set by a running operation that fails before it sent or consumed anything: its
     * owner may then take the failure as the caller's alone (see comm.h) */
    int op_local;
    /* the owner's: its abort flag, and where a failure is described (first message wins) */
    const volatile int *abort_flag;
    char *err;
    size_t errlen;
    /* the rooted calls' mismatch detection (guard.h): the running hash of their
     * signatures, folded into every later collective message's, and the probes' state
     * (NULL until the first rooted call) */
    uint32_t hist;
    struct gcoll_guard *guard;
} gcoll_channel_t;

/* Settles the policy (timeout, spin) and where aborts and errors come from; ops and tp are
 * set by the owner once it has chosen and created the transport. */
void gcoll_channel_setup(gcoll_channel_t *ch, int64_t timeout_ms, uint64_t spin_ns,
                         const volatile int *abort_flag, char *err, size_t errlen);
/* An operation starts (its sequence number, no polling state; the deadline is set by its
 * first wait, which reads the clock anyway: an operation that never waits reads it only
 * for its time, in gcoll_ticks); ends (its time since t0_ticks counted, and whether it
 * succeeded); is undone before it sent or consumed anything (its sequence number goes
 * back, for the caller's next call to pair with the peers' calls still waiting for this
 * one). Inline: they run on every call. */
static inline void gcoll_channel_begin(gcoll_channel_t *ch)
{
    ch->seq++;
    ch->wait_from_ns = 0;
    ch->deadline_stale = 1;
    ch->first_unclocked = 0;
    ch->spin_from_ns = 0; /* an operation that failed mid-wait left it set */
    ch->wait_slept = 0;
    ch->op_bytes = 0;
    ch->hot_skip = 0;
    ch->op_local = 0;
}
static inline void gcoll_channel_end(gcoll_channel_t *ch, uint64_t t0_ticks, int ok)
{
    ch->ticks_total += gcoll_ticks() - t0_ticks;
    if (ok)
        ch->counters.ops++;
}
static inline void gcoll_channel_undo(gcoll_channel_t *ch)
{
    ch->seq--;
}

/* Records why the running operation failed (first message wins). */
void gcoll_channel_set_error(gcoll_channel_t *ch, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Tag of message `sub` within the running operation. The top bit is point-to-point's
 * (GCOLL_P2P_TAG): the collectives' sequence numbers wrap at 2^31. */
#define GCOLL_P2P_TAG (1ull << 63)
static inline uint64_t gcoll_channel_tag(const gcoll_channel_t *ch, uint32_t sub)
{
    return ((uint64_t)(ch->seq & 0x7fffffffu) << 32) | sub;
}

/* 32-bit signature of a collective call, compared by the receiving side of every message
 * so that ranks calling different collectives or counts fail with GCOLL_ERR_MISMATCH. */
uint32_t gcoll_call_sig(int kind, size_t count, int dtype, int op, int root);

/* Whether the peer last ran on the caller's CPU: 1, 0 (another CPU), -1 (unknown: the
 * transport cannot tell). */
int gcoll_channel_peer_shares_cpu(const gcoll_channel_t *ch, int peer);

/* The transport's mesh_max: the largest message every rank sends every other through
 * shared memory without a handshake, the same on every rank; 0: none. */
size_t gcoll_channel_mesh_max(const gcoll_channel_t *ch);

/* Whether a send of len bytes to peer that arrives early is held there without its data
 * (transport.h's send_held): it may go before the receiver says it is ready. */
int gcoll_channel_send_held(const gcoll_channel_t *ch, int peer, size_t len);

gcoll_status_t gcoll_channel_isend(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint32_t sub,
                                   uint32_t sig, const void *buf, size_t len);
gcoll_status_t gcoll_channel_irecv(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint32_t sub,
                                   uint32_t sig, void *buf, size_t len, unsigned flags);
/* The same with the whole tag given (point-to-point: GCOLL_P2P_TAG | its own count). */
gcoll_status_t gcoll_channel_isend_tag(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint64_t tag,
                                       uint32_t sig, const void *buf, size_t len);
gcoll_status_t gcoll_channel_irecv_tag(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint64_t tag,
                                       uint32_t sig, void *buf, size_t len, unsigned flags);
/* Receive from any source: of the messages tagged tags[peer] from each peer (0: left out)
 * that came and no receive took yet, the first come (*peer_p, -1 when none); an included
 * peer's failure once none came (transport.h's peek). GCOLL_ERR_UNSUPPORTED when the
 * transport cannot tell. Never blocks. */
gcoll_status_t gcoll_channel_peek(gcoll_channel_t *ch, const uint64_t *tags, int *peer_p);
/* One round of progress: a poll while the wait is young (GCOLL_SPIN_US), else a sleep of
 * up to the deadline until something happens. Returns GCOLL_ERR_TIMEOUT past the deadline
 * (naming `waiting` if not NULL), GCOLL_ERR_ABORTED once the owner is aborted. Call
 * gcoll_channel_done after each round to fold completions in. */
gcoll_status_t gcoll_channel_poll(gcoll_channel_t *ch, const gcoll_treq_t *waiting);
/* Moves the transport along, waiting at most timeout_ms, outside the deadline and polling
 * policy: for work that interleaves its own computation with the network (the caller
 * counts the time). */
gcoll_status_t gcoll_channel_progress(gcoll_channel_t *ch, int timeout_ms);
/* Whether r completed; a failed completion returns its status (< 0). Every completion
 * pushes the deadline out (from the next poll): the timeout measures silence, not
 * duration. */
gcoll_status_t gcoll_channel_done(gcoll_channel_t *ch, gcoll_treq_t *r, int *done_p);
/* Waits for all of reqs[0..n). */
gcoll_status_t gcoll_channel_waitall(gcoll_channel_t *ch, gcoll_treq_t *reqs, int n);
/* Withdraws every incomplete request of reqs[0..n) before their memory goes away. */
void gcoll_channel_cancel(gcoll_channel_t *ch, gcoll_treq_t *reqs, int n);
/* Detail of the transport's last failure, "" if none. */
const char *gcoll_channel_last_error(const gcoll_channel_t *ch);

#endif /* GCOLL_CHANNEL_H */
