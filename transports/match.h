/* match.h: the receive side every transport shares: the check a message meets at its
 * receive, the receives posted per peer, the messages that came before their receive
 * (unexpected), and a peer's failure. Internal to transports/. */
#ifndef GCOLL_MATCH_H
#define GCOLL_MATCH_H

#include <stddef.h>
#include <stdint.h>

#include "transports/transport.h"

/* The check every transport makes when a message meets its receive: the same signature,
 * and the same length (at most the posted one with GCOLL_TREQ_ANYLEN). On a difference,
 * GCOLL_ERR_MISMATCH with the reason in why. */
gcoll_status_t gcoll_treq_match(const gcoll_treq_t *req, int peer, size_t len, uint32_t sig,
                                char *why, size_t whylen);

/* Requests in posting order, oldest first: append; take the oldest with a tag; remove a
 * given one (returns 1 if it was there). */
void gcoll_treq_list_push(gcoll_treq_t **head, gcoll_treq_t **tail, gcoll_treq_t *req);
gcoll_treq_t *gcoll_treq_list_take(gcoll_treq_t **head, gcoll_treq_t **tail, uint64_t tag);
int gcoll_treq_list_remove(gcoll_treq_t **head, gcoll_treq_t **tail, gcoll_treq_t *req);

/* A message that arrived before its receive was posted. */
typedef struct gcoll_unexp {
    struct gcoll_unexp *next, *prev; /* the peer's store, in arrival order */
    struct gcoll_unexp *hnext;       /* its bucket of the store's index by tag */
    uint64_t tag;
    uint32_t sig;
    size_t len;    /* the message's length */
    uint8_t *data; /* storage of `bytes` bytes (allocated with the entry), or NULL */
    size_t bytes;  /* storage allocated with the entry */
    size_t held;   /* bytes of payload held here or by the transport: counted against the bound */
    int whole;     /* the whole payload is here: it outlives its sender's failure */
    /* the transport's: what the entry stands for and holds (UCX's descriptor of the data,
     * TCP's assembly of a message still arriving, a verbs rendezvous id) */
    int kind;
    void *priv;
    uint64_t aux;
    uint64_t arrival; /* the instance's count of kept messages when it came: earlier is less */
} gcoll_unexp_t;

enum { GCOLL_UNEXP_WHOLE = 1 };

/* What a transport's instance shares with its peers' stores. */
typedef struct gcoll_match {
    char *errmsg; /* the transport's last_error: the first failure written is kept */
    size_t errlen;
    const char *prefix; /* put before "cannot buffer..." ("verbs: "), or "" */
    /* GCOLL_UNEXPECTED_BYTES: the payload all peers' unexpected messages may hold together
     * (one transport instance per communicator); 0: what memory allows */
    size_t unexp_max;
    size_t unexp_held; /* what they hold now */
    uint64_t arrivals; /* messages kept so far (the next one's arrival stamp) */
    /* Completes a request (the transport counts completions its own way). */
    void (*complete)(void *ctx, gcoll_treq_t *req, gcoll_status_t st);
    /* Optional: lets go of what the transport holds in an entry (before it is freed). */
    void (*release)(void *ctx, gcoll_unexp_t *u);
    void *ctx;
} gcoll_match_t;

/* One peer's receive side. */
typedef struct {
    gcoll_match_t *m;
    int rank;
    int failed; /* every receive from this peer fails with status */
    gcoll_status_t status;
    gcoll_treq_t *posted, *posted_tail; /* receives not yet matched, oldest first */
    size_t nwant;                       /* ... of them not GCOLL_TREQ_STANDING */
    gcoll_unexp_t *unexp, *unexp_tail;  /* unexpected messages, oldest first */
    size_t unexp_bytes;
    /* The store indexed by tag once it holds more than a few messages: a rank that runs
     * ahead (the senders of back-to-back small rooted calls) leaves thousands here, and
     * every new message's lookup of its tag walked them all (TCP, 4 ranks, reduce of 8 B
     * 30,000 times: 78% of the CPU in that walk). NULL: walk the list. */
    gcoll_unexp_t **index;
    size_t index_n; /* buckets, a power of two */
    size_t nunexp;  /* messages in the store */
} gcoll_match_peer_t;

void gcoll_match_peer_init(gcoll_match_peer_t *mp, gcoll_match_t *m, int rank);
/* Forgets the posted receives (the caller's) and frees the unexpected messages. */
void gcoll_match_peer_fini(gcoll_match_peer_t *mp);

/* A message (tag, len, sig) arrived: unlinks and checks the oldest receive posted for its
 * tag. Returns it when the message lands there (*st_p GCOLL_OK). NULL with *st_p GCOLL_OK:
 * no receive, the message is unexpected. NULL with an error in *st_p: the receive refused
 * it, has completed with that status (reason in the error), and the message is dropped. */
gcoll_treq_t *gcoll_match_arrived(gcoll_match_peer_t *mp, uint64_t tag, size_t len, uint32_t sig,
                                  gcoll_status_t *st_p);
/* Keeps an unexpected message: an entry with `bytes` bytes of storage, copied from data
 * when data is not NULL; flags GCOLL_UNEXP_WHOLE says its payload is all here. The payload
 * held (bytes, or len for a whole message the transport keeps, as UCX's descriptors) counts
 * against unexp_max; an offer whose payload stays with its sender (a rendezvous) counts
 * nothing: the sender waits. NULL when the bound or memory does not allow it: the error
 * names the peer and the caller fails the peer with GCOLL_ERR_NOMEM. */
gcoll_unexp_t *gcoll_match_keep(gcoll_match_peer_t *mp, uint64_t tag, uint32_t sig, size_t len,
                                size_t bytes, const void *data, unsigned flags);
/* The oldest unexpected message with this tag, left in the store; NULL if none. */
gcoll_unexp_t *gcoll_match_find(gcoll_match_peer_t *mp, uint64_t tag);
/* A receive is posted: takes the oldest unexpected message with its tag out of the store
 * and checks it against req. NULL when there is none. With *st_p GCOLL_OK the caller
 * receives the message; otherwise req has completed with the mismatch. Either way the
 * entry is the caller's to free (gcoll_match_unexp_free), after answering its sender. */
gcoll_unexp_t *gcoll_match_claim(gcoll_match_peer_t *mp, gcoll_treq_t *req, gcoll_status_t *st_p);
void gcoll_match_unexp_free(gcoll_match_peer_t *mp, gcoll_unexp_t *u);
/* Copies a message of len bytes from src into req and completes it. */
void gcoll_match_land(gcoll_match_peer_t *mp, gcoll_treq_t *req, const void *src, size_t len);
/* Queues a receive no message claimed; from a failed peer it completes at once with the
 * peer's status. */
void gcoll_match_post(gcoll_match_peer_t *mp, gcoll_treq_t *req);
/* Whether a receive posted for this peer takes tag. */
int gcoll_match_posted_tag(const gcoll_match_peer_t *mp, uint64_t tag);
/* Withdraws a posted receive, completing it with GCOLL_ERR_ABORTED; 0 if it was not
 * posted (matched already, or not a receive from this peer). */
int gcoll_match_cancel(gcoll_match_peer_t *mp, gcoll_treq_t *req);
/* Completes every posted receive with st; the peer is not marked failed. */
void gcoll_match_fail_posted(gcoll_match_peer_t *mp, gcoll_status_t st);

/* A receive from any source (a transport's peek op): the first come, among the peers' next
 * messages, still unclaimed in their stores. Add every peer with the tag of its next message
 * (0: left out) and down, GCOLL_OK or the status its receives would get from the transport
 * (a peer that closed its connection, for one); the result is GCOLL_OK with the earliest
 * arrival's peer in *peer_p, or -1 when none came. When none came and a peer included is
 * down or failed, its status, with *peer_p naming it: a message from it can no longer come. */
typedef struct {
    int peer;         /* the earliest so far, or -1 */
    uint64_t arrival; /* its stamp */
    int down_peer;    /* the first peer included that is down or failed, or -1 */
    gcoll_status_t down_status;
} gcoll_match_peek_t;
void gcoll_match_peek_init(gcoll_match_peek_t *pk);
void gcoll_match_peek_add(gcoll_match_peek_t *pk, gcoll_match_peer_t *mp, uint64_t tag,
                          gcoll_status_t down);
gcoll_status_t gcoll_match_peek_result(const gcoll_match_peek_t *pk, int *peer_p);

enum { GCOLL_MATCH_DROP_ALL = 0, GCOLL_MATCH_KEEP_WHOLE = 1 };
/* Marks the peer failed with st (once: later calls do nothing): its posted receives
 * complete with st, later posts complete with st at once. Its unexpected messages are
 * dropped, but with GCOLL_MATCH_KEEP_WHOLE those whose payload is all here stay for the
 * receives still to come (an orderly close follows a peer's last message). */
void gcoll_match_fail(gcoll_match_peer_t *mp, gcoll_status_t st, int keep);

#endif /* GCOLL_MATCH_H */
