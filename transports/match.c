/* match.c: the receive side the transports share: matching a message against its receive,
 * the posted receives and unexpected messages of each peer, and a peer's failure. */
#include "transports/match.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"

gcoll_status_t gcoll_treq_match(const gcoll_treq_t *req, int peer, size_t len, uint32_t sig,
                                char *why, size_t whylen)
{
    int len_ok = (req->flags & GCOLL_TREQ_ANYLEN) ? len <= req->len : len == req->len;
    if (len_ok && sig == req->sig)
        return GCOLL_OK;
    if (sig != req->sig)
        snprintf(why, whylen,
                 "rank %d is in a different call: another collective, or another "
                 "count, dtype, op or root, in this call or in an earlier reduce, gather or "
                 "scatter (signature %08x, here %08x)",
                 peer, sig, req->sig);
    else
        snprintf(why, whylen, "rank %d sent %zu bytes where %s%zu were expected (counts differ)",
                 peer, len, (req->flags & GCOLL_TREQ_ANYLEN) ? "at most " : "", req->len);
    return GCOLL_ERR_MISMATCH;
}

void gcoll_treq_list_push(gcoll_treq_t **head, gcoll_treq_t **tail, gcoll_treq_t *req)
{
    req->next = NULL;
    if (*tail)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

/* Unlinks the first request that matches (tag, or req itself when req is not NULL). */
static gcoll_treq_t *unlink_first(gcoll_treq_t **head, gcoll_treq_t **tail, uint64_t tag,
                                  const gcoll_treq_t *req)
{
    gcoll_treq_t *prev = NULL;
    for (gcoll_treq_t **pp = head; *pp; prev = *pp, pp = &(*pp)->next) {
        if (req ? *pp != req : (*pp)->tag != tag)
            continue;
        gcoll_treq_t *found = *pp;
        *pp = found->next;
        if (*tail == found)
            *tail = prev;
        return found;
    }
    return NULL;
}

gcoll_treq_t *gcoll_treq_list_take(gcoll_treq_t **head, gcoll_treq_t **tail, uint64_t tag)
{
    return unlink_first(head, tail, tag, NULL);
}

int gcoll_treq_list_remove(gcoll_treq_t **head, gcoll_treq_t **tail, gcoll_treq_t *req)
{
    return unlink_first(head, tail, 0, req) != NULL;
}

/* ---------------------------------------------------------------------------------- */
/* A peer's receive side                                                                */

/* Records the first failure worth reporting in the transport's error; later ones are
 * left to the log, as every transport does. */
static void set_error(gcoll_match_t *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(gcoll_match_t *m, const char *fmt, ...)
{
    if (!m->errmsg || m->errlen == 0 || m->errmsg[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->errmsg, m->errlen, fmt, ap);
    va_end(ap);
}

static void complete(gcoll_match_peer_t *mp, gcoll_treq_t *req, gcoll_status_t st)
{
    mp->m->complete(mp->m->ctx, req, st);
}

static gcoll_status_t check(gcoll_match_peer_t *mp, const gcoll_treq_t *req, size_t len,
                            uint32_t sig)
{
    char why[256];
    gcoll_status_t st = gcoll_treq_match(req, mp->rank, len, sig, why, sizeof(why));
    if (st != GCOLL_OK)
        set_error(mp->m, "%s", why);
    return st;
}

void gcoll_match_peer_init(gcoll_match_peer_t *mp, gcoll_match_t *m, int rank)
{
    memset(mp, 0, sizeof(*mp));
    mp->m = m;
    mp->rank = rank;
}

void gcoll_match_peer_fini(gcoll_match_peer_t *mp)
{
    mp->posted = mp->posted_tail = NULL;
    mp->nwant = 0;
    while (mp->unexp) {
        gcoll_unexp_t *u = mp->unexp;
        mp->unexp = u->next;
        gcoll_match_unexp_free(mp, u);
    }
    mp->unexp_tail = NULL;
    free(mp->index);
    mp->index = NULL;
    mp->index_n = mp->nunexp = 0;
}

/* ---- the store's index by tag ---------------------------------------------------------- */

#define INDEX_FROM 16 /* messages held before the store is indexed */

static size_t bucket_of(const gcoll_match_peer_t *mp, uint64_t tag)
{
    return (size_t)((tag * 0x9e3779b97f4a7c15ull) >> 32) & (mp->index_n - 1);
}

/* Rebuilds the index with at least twice as many buckets as messages held; with no memory
 * for it the store goes on unindexed (slower, not wrong). */
static void index_grow(gcoll_match_peer_t *mp)
{
    size_t n = 64;
    while (n < 2 * mp->nunexp)
        n *= 2;
    gcoll_unexp_t **b = calloc(n, sizeof(*b));
    free(mp->index);
    mp->index = b;
    mp->index_n = 0;
    if (!b)
        return;
    mp->index_n = n;
    for (gcoll_unexp_t *u = mp->unexp; u; u = u->next) {
        size_t h = bucket_of(mp, u->tag);
        u->hnext = b[h];
        b[h] = u;
    }
}

static void index_remove(gcoll_match_peer_t *mp, gcoll_unexp_t *u)
{
    if (!mp->index)
        return;
    for (gcoll_unexp_t **pp = &mp->index[bucket_of(mp, u->tag)]; *pp; pp = &(*pp)->hnext)
        if (*pp == u) {
            *pp = u->hnext;
            break;
        }
    u->hnext = NULL;
}

gcoll_treq_t *gcoll_match_arrived(gcoll_match_peer_t *mp, uint64_t tag, size_t len, uint32_t sig,
                                  gcoll_status_t *st_p)
{
    *st_p = GCOLL_OK;
    gcoll_treq_t *req = gcoll_treq_list_take(&mp->posted, &mp->posted_tail, tag);
    if (!req)
        return NULL;
    mp->nwant -= !(req->flags & GCOLL_TREQ_STANDING);
    gcoll_status_t st = check(mp, req, len, sig);
    if (st == GCOLL_OK)
        return req;
    complete(mp, req, st);
    *st_p = st;
    return NULL;
}

gcoll_unexp_t *gcoll_match_keep(gcoll_match_peer_t *mp, uint64_t tag, uint32_t sig, size_t len,
                                size_t bytes, const void *data, unsigned flags)
{
    gcoll_match_t *m = mp->m;
    /* The storage follows the entry in one allocation (a 16-byte aligned offset). */
    size_t head = (sizeof(gcoll_unexp_t) + 15) & ~(size_t)15;
    size_t held = bytes ? bytes : (flags & GCOLL_UNEXP_WHOLE) ? len : 0;
    int room = m->unexp_max == 0 || held <= m->unexp_max - GCOLL_MIN(m->unexp_held, m->unexp_max);
    if (!room) {
        set_error(m,
                  "%srank %d sent a message of %zu bytes that no receive awaits while %zu bytes "
                  "of such messages are held: GCOLL_UNEXPECTED_BYTES=%zu would be passed (the "
                  "ranks are in different calls, or rank %d runs ahead by more than the bound)",
                  m->prefix ? m->prefix : "", mp->rank, len, m->unexp_held, m->unexp_max, mp->rank);
        GCOLL_WARN("%srank %d sent %zu bytes no receive awaits past GCOLL_UNEXPECTED_BYTES=%zu: "
                   "giving rank %d up",
                   m->prefix ? m->prefix : "", mp->rank, len, m->unexp_max, mp->rank);
        return NULL;
    }
    gcoll_unexp_t *u = bytes <= SIZE_MAX - head ? malloc(head + bytes) : NULL;
    if (!u) {
        set_error(m, "%scannot buffer an unexpected message of %zu bytes from rank %d",
                  m->prefix ? m->prefix : "", len, mp->rank);
        return NULL;
    }
    memset(u, 0, sizeof(*u));
    u->data = bytes ? (uint8_t *)u + head : NULL;
    if (data && bytes)
        memcpy(u->data, data, bytes);
    u->tag = tag;
    u->sig = sig;
    u->len = len;
    u->bytes = bytes;
    u->held = held;
    u->whole = (flags & GCOLL_UNEXP_WHOLE) != 0;
    u->arrival = m->arrivals++;
    mp->unexp_bytes += bytes;
    m->unexp_held += held;
    u->prev = mp->unexp_tail;
    if (mp->unexp_tail)
        mp->unexp_tail->next = u;
    else
        mp->unexp = u;
    mp->unexp_tail = u;
    mp->nunexp++;
    if (mp->index && mp->nunexp <= 2 * mp->index_n) {
        size_t h = bucket_of(mp, tag);
        u->hnext = mp->index[h];
        mp->index[h] = u;
    } else if (mp->nunexp > INDEX_FROM) {
        index_grow(mp); /* rebuilt from the list: u included */
    }
    return u;
}

gcoll_unexp_t *gcoll_match_find(gcoll_match_peer_t *mp, uint64_t tag)
{
    if (!mp->index) {
        for (gcoll_unexp_t *u = mp->unexp; u; u = u->next)
            if (u->tag == tag)
                return u;
        return NULL;
    }
    /* a bucket holds its messages newest first: the oldest with the tag is the last seen */
    gcoll_unexp_t *oldest = NULL;
    for (gcoll_unexp_t *u = mp->index[bucket_of(mp, tag)]; u; u = u->hnext)
        if (u->tag == tag)
            oldest = u;
    return oldest;
}

/* Takes u out of the store. */
static void unexp_unlink(gcoll_match_peer_t *mp, gcoll_unexp_t *u)
{
    index_remove(mp, u);
    if (u->prev)
        u->prev->next = u->next;
    else
        mp->unexp = u->next;
    if (u->next)
        u->next->prev = u->prev;
    else
        mp->unexp_tail = u->prev;
    u->next = u->prev = NULL;
    mp->nunexp--;
}

gcoll_unexp_t *gcoll_match_claim(gcoll_match_peer_t *mp, gcoll_treq_t *req, gcoll_status_t *st_p)
{
    *st_p = GCOLL_OK;
    gcoll_unexp_t *u = gcoll_match_find(mp, req->tag);
    if (!u)
        return NULL;
    unexp_unlink(mp, u);
    *st_p = check(mp, req, u->len, u->sig);
    if (*st_p != GCOLL_OK)
        complete(mp, req, *st_p);
    return u;
}

/* Frees an entry out of the store (claimed, or being dropped). */
void gcoll_match_unexp_free(gcoll_match_peer_t *mp, gcoll_unexp_t *u)
{
    if (!u)
        return;
    if (mp->m->release)
        mp->m->release(mp->m->ctx, u);
    mp->unexp_bytes -= GCOLL_MIN(u->bytes, mp->unexp_bytes);
    mp->m->unexp_held -= GCOLL_MIN(u->held, mp->m->unexp_held);
    free(u);
}

void gcoll_match_land(gcoll_match_peer_t *mp, gcoll_treq_t *req, const void *src, size_t len)
{
    if (len)
        memcpy(req->buf, src, len);
    req->nbytes = len;
    complete(mp, req, GCOLL_OK);
}

void gcoll_match_post(gcoll_match_peer_t *mp, gcoll_treq_t *req)
{
    if (mp->failed) {
        complete(mp, req, mp->status);
        return;
    }
    gcoll_treq_list_push(&mp->posted, &mp->posted_tail, req);
    mp->nwant += !(req->flags & GCOLL_TREQ_STANDING);
}

int gcoll_match_posted_tag(const gcoll_match_peer_t *mp, uint64_t tag)
{
    for (const gcoll_treq_t *r = mp->posted; r; r = r->next)
        if (r->tag == tag)
            return 1;
    return 0;
}

int gcoll_match_cancel(gcoll_match_peer_t *mp, gcoll_treq_t *req)
{
    if (!gcoll_treq_list_remove(&mp->posted, &mp->posted_tail, req))
        return 0;
    mp->nwant -= !(req->flags & GCOLL_TREQ_STANDING);
    complete(mp, req, GCOLL_ERR_ABORTED);
    return 1;
}

void gcoll_match_fail_posted(gcoll_match_peer_t *mp, gcoll_status_t st)
{
    gcoll_treq_t *r = mp->posted;
    mp->posted = mp->posted_tail = NULL;
    mp->nwant = 0;
    while (r) {
        gcoll_treq_t *next = r->next;
        complete(mp, r, st);
        r = next;
    }
}

void gcoll_match_fail(gcoll_match_peer_t *mp, gcoll_status_t st, int keep)
{
    if (mp->failed)
        return;
    mp->failed = 1;
    mp->status = st;
    gcoll_match_fail_posted(mp, st);
    for (gcoll_unexp_t *u = mp->unexp, *next; u; u = next) {
        next = u->next;
        if (keep == GCOLL_MATCH_KEEP_WHOLE && u->whole)
            continue;
        unexp_unlink(mp, u);
        gcoll_match_unexp_free(mp, u);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Receive from any source                                                              */

void gcoll_match_peek_init(gcoll_match_peek_t *pk)
{
    *pk = (gcoll_match_peek_t){.peer = -1, .down_peer = -1, .down_status = GCOLL_OK};
}

void gcoll_match_peek_add(gcoll_match_peek_t *pk, gcoll_match_peer_t *mp, uint64_t tag,
                          gcoll_status_t down)
{
    if (!tag)
        return;
    /* a failed peer's whole messages stay in its store (GCOLL_MATCH_KEEP_WHOLE): they count */
    gcoll_unexp_t *u = gcoll_match_find(mp, tag);
    if (u && (pk->peer < 0 || u->arrival < pk->arrival)) {
        pk->peer = mp->rank;
        pk->arrival = u->arrival;
    }
    if (!u && pk->down_peer < 0 && (mp->failed || down != GCOLL_OK)) {
        pk->down_peer = mp->rank;
        pk->down_status = mp->failed ? mp->status : down;
    }
}

gcoll_status_t gcoll_match_peek_result(const gcoll_match_peek_t *pk, int *peer_p)
{
    if (pk->peer >= 0 || pk->down_peer < 0) {
        *peer_p = pk->peer;
        return GCOLL_OK;
    }
    *peer_p = pk->down_peer;
    return pk->down_status;
}
