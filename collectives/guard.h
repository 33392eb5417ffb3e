/* guard.h: how ranks that called reduce, gather or scatter differently (another root,
 * count or kind) fail with GCOLL_ERR_MISMATCH instead of hanging or returning wrong data,
 * without a message of its own per call.
 *
 * Every message of a rooted call carries the call's signature (kind, count, dtype, op,
 * root), checked by its receiver. Two cases escape that check, and each has its remedy:
 * - Nobody waits: every rank takes itself for a sender (two ranks each naming the other
 *   as root of a gather), so each returns and no message is ever checked. The signatures
 *   of the rooted calls a channel ran are folded into a running hash, and the hash into the
 *   signature of every later collective message (gcoll_channel_isend/irecv): the ranks'
 *   next collective then fails with GCOLL_ERR_MISMATCH wherever two of them disagree.
 * - Somebody waits for a message nobody sends (two ranks each naming itself as root): a
 *   rooted call still waiting after GCOLL_GUARD_PROBE_MS sends its signature to every other
 *   rank once (a probe). Each rank keeps a receive posted for probes (from its first rooted
 *   call on) and compares every probe with its own call of that sequence number, when it
 *   gets there: if they differ it fails with GCOLL_ERR_MISMATCH, and its abort ends the
 *   waits of the others with the same status.
 * The previous form sent an empty message around a ring with every rooted call: a message
 * time and two system calls per call, 2-5x Open MPI's latency at 8 bytes
 * (docs/results/rooted.md). */
#ifndef GCOLL_GUARD_H
#define GCOLL_GUARD_H

#include <stdint.h>

#include "collectives/channel.h"

struct gcoll_coll;

/* How long a rooted call waits before it probes its peers. Far above a message time, far
 * below any timeout; a legitimately late peer costs the waiting rank P-1 small sends. */
#define GCOLL_GUARD_PROBE_MS 50

/* What a rank called as its call number seq (the low 31 bits of the channel's seq). */
typedef struct {
    uint32_t seq, sig;
    int32_t kind, root;
    uint64_t count;
} gcoll_guard_note_t;

/* A rooted call starts: remembers it (for the probes of peers that wait) and makes sure
 * the probes' receives are posted. Never blocks. */
gcoll_status_t gcoll_guard_begin(const struct gcoll_coll *ctx, uint32_t seq, uint32_t sig, int kind,
                                 int root, uint64_t count);
/* The running rooted call has waited long: sends its note to every other rank (once per
 * call). Never blocks; a failed send is ignored (its peer may be gone). */
void gcoll_guard_probe(gcoll_channel_t *ch, const gcoll_guard_note_t *note);
/* A rooted call succeeded on this rank: its signature joins the running hash. */
void gcoll_guard_end(gcoll_channel_t *ch, uint32_t sig);
/* The channel's polls: looks at the probes that came. GCOLL_ERR_MISMATCH (with the reason
 * in the channel's error) when one differs from this rank's call. */
gcoll_status_t gcoll_guard_check(gcoll_channel_t *ch);
/* At the closing handshake (this rank's calls are over: no probe needs an answer here):
 * the probes' receives are withdrawn, so that a peer's close finds none pending. */
void gcoll_guard_retire(gcoll_channel_t *ch);
/* Frees the probes' state, after the transport is destroyed (its receives point there). */
void gcoll_guard_free(gcoll_channel_t *ch);

#endif /* GCOLL_GUARD_H */
