/* guard.c: the rooted calls' mismatch detection without a message per call (guard.h says
 * how): the running hash of their signatures, and the probes of a rank that waits. */
#include "collectives/guard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"

/* Calls remembered. A probe about an older call cannot be judged and is let go: its
 * sender waited GCOLL_GUARD_PROBE_MS in it while this rank ran 64 calls past it, which
 * the sender's peers in that call allowed; its timeout still ends its wait. */
#define NOTES 64
#define SEQ_MASK 0x7fffffffu
/* Probes travel on one tag of their own: sequence bits all ones, a sub no collective uses.
 * (peer, tag) pairs stay unique: a rank sends its next probe only once the last is out. */
#define PROBE_TAG (((uint64_t)SEQ_MASK << 32) | 0xfffffff2u)

enum { RX_IDLE, RX_POSTED, RX_HELD, RX_GONE };

struct gcoll_guard {
    int P, me;
    gcoll_treq_t *rx, *tx;  /* per peer */
    gcoll_guard_note_t *in; /* per peer: the probes' receive buffers */
    uint8_t *rx_state;      /* per peer: RX_* */
    int tx_n;               /* sends of out posted by the last probe */
    gcoll_guard_note_t out;
    gcoll_guard_note_t notes[NOTES]; /* this rank's rooted calls, by seq % NOTES */
};

static const char *kind_name(int kind)
{
    switch (kind) {
    case GCOLL_KIND_REDUCE:
        return "gcoll_reduce";
    case GCOLL_KIND_GATHER:
        return "gcoll_gather";
    case GCOLL_KIND_SCATTER:
        return "gcoll_scatter";
    default:
        return "a rooted call";
    }
}

static gcoll_status_t post(gcoll_channel_t *ch, struct gcoll_guard *g, int p)
{
    gcoll_status_t st = gcoll_channel_irecv_tag(ch, &g->rx[p], p, PROBE_TAG, 0, &g->in[p],
                                                sizeof(g->in[p]), GCOLL_TREQ_STANDING);
    g->rx_state[p] = st == GCOLL_OK ? RX_POSTED : RX_GONE;
    return st;
}

static gcoll_status_t arm(const gcoll_coll_t *ctx)
{
    gcoll_channel_t *ch = ctx->ch;
    const size_t P = (size_t)ctx->size;
    struct gcoll_guard *g = calloc(1, sizeof(*g));
    if (g) {
        g->rx = calloc(2 * P, sizeof(*g->rx));
        g->in = calloc(P, sizeof(*g->in));
        g->rx_state = calloc(P, 1);
    }
    if (!g || !g->rx || !g->in || !g->rx_state) {
        if (g) {
            free(g->rx);
            free(g->in);
            free(g->rx_state);
            free(g);
        }
        gcoll_channel_set_error(ch, "no memory for the rooted calls' probes");
        return GCOLL_ERR_NOMEM;
    }
    g->tx = g->rx + P;
    g->P = ctx->size;
    g->me = ctx->rank;
    ch->guard = g;
    for (int p = 0; p < g->P; p++)
        if (p != g->me)
            GCOLL_CHECK(post(ch, g, p));
    return GCOLL_OK;
}

gcoll_status_t gcoll_guard_begin(const gcoll_coll_t *ctx, uint32_t seq, uint32_t sig, int kind,
                                 int root, uint64_t count)
{
    if (ctx->size == 1)
        return GCOLL_OK;
    if (!ctx->ch->guard)
        GCOLL_CHECK(arm(ctx));
    /* from the fields, not a copy of the caller's note: that was read back wider than it
     * was just written, a stalled store forward (5% of a blocking 8-byte reduce) */
    gcoll_guard_note_t *n = &ctx->ch->guard->notes[seq % NOTES];
    n->seq = seq;
    n->sig = sig;
    n->kind = kind;
    n->root = root;
    n->count = count;
    return GCOLL_OK;
}

void gcoll_guard_probe(gcoll_channel_t *ch, const gcoll_guard_note_t *note)
{
    struct gcoll_guard *g = ch->guard;
    if (!g)
        return;
    for (int i = 0; i < g->tx_n; i++) /* the last probe's sends still going out */
        if (!g->tx[i].done)
            return;
    g->out = *note;
    g->tx_n = 0;
    for (int p = 0; p < g->P; p++)
        if (p != g->me && gcoll_channel_isend_tag(ch, &g->tx[g->tx_n], p, PROBE_TAG, 0, &g->out,
                                                  sizeof(g->out)) == GCOLL_OK)
            g->tx_n++;
}

void gcoll_guard_end(gcoll_channel_t *ch, uint32_t sig)
{
    /* splitmix64's finaliser over (hash, sig): any change in any call changes it */
    uint64_t h = ((uint64_t)ch->hist << 32 | sig) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    ch->hist = (uint32_t)h ? (uint32_t)h : 1;
}

/* A probe from peer p: GCOLL_OK when it agrees with this rank's call or cannot be judged
 * yet (*held set: this rank has not reached that call), else the mismatch. */
static gcoll_status_t judge(gcoll_channel_t *ch, struct gcoll_guard *g, int p, int *held)
{
    const gcoll_guard_note_t *in = &g->in[p];
    uint32_t ahead = (in->seq - ch->seq) & SEQ_MASK;
    *held = 0;
    if (ahead && ahead < SEQ_MASK / 2) {
        *held = 1;
        return GCOLL_OK;
    }
    if (((ch->seq - in->seq) & SEQ_MASK) >= NOTES)
        return GCOLL_OK;
    const gcoll_guard_note_t *mine = &g->notes[in->seq % NOTES];
    int rooted = mine->seq == in->seq && mine->sig;
    if (rooted && mine->sig == in->sig)
        return GCOLL_OK;
    char here[160];
    if (rooted)
        snprintf(here, sizeof(here), "%s with root %d and count %llu", kind_name(mine->kind),
                 mine->root, (unsigned long long)mine->count);
    else
        snprintf(here, sizeof(here), "another collective");
    gcoll_channel_set_error(ch,
                            "rank %d waits in its call #%u, %s with root %d and count %llu; "
                            "this rank's call #%u is %s",
                            p, in->seq, kind_name(in->kind), in->root,
                            (unsigned long long)in->count, in->seq, here);
    return GCOLL_ERR_MISMATCH;
}

gcoll_status_t gcoll_guard_check(gcoll_channel_t *ch)
{
    struct gcoll_guard *g = ch->guard;
    for (int p = 0; p < g->P; p++) {
        int held;
        switch (g->rx_state[p]) {
        case RX_POSTED:
            if (!g->rx[p].done)
                break;
            if (g->rx[p].status < 0) { /* the peer is gone or aborted: its calls' business */
                g->rx_state[p] = RX_GONE;
                break;
            }
            g->rx_state[p] = RX_HELD;
            /* fall through */
        case RX_HELD:
            GCOLL_CHECK(judge(ch, g, p, &held));
            if (!held)
                (void)post(ch, g, p);
            break;
        default:
            break;
        }
    }
    return GCOLL_OK;
}

void gcoll_guard_retire(gcoll_channel_t *ch)
{
    struct gcoll_guard *g = ch->guard;
    for (int p = 0; g && p < g->P; p++)
        if (g->rx_state[p] == RX_POSTED) {
            if (!g->rx[p].done)
                gcoll_channel_cancel(ch, &g->rx[p], 1);
            g->rx_state[p] = RX_GONE;
        }
}

void gcoll_guard_free(gcoll_channel_t *ch)
{
    struct gcoll_guard *g = ch->guard;
    if (!g)
        return;
    free(g->rx);
    free(g->in);
    free(g->rx_state);
    free(g);
    ch->guard = NULL;
}
