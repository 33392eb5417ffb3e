/* verbs_reg.c: registration cache of user buffers for rendezvous (an LRU list looked up
 * by address range, in the manner of UCX's rcache without its memory hooks). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "transports/verbs/verbs.h"

void gcoll_vb_reg_init(gcoll_vb_regcache_t *c, const gcoll_ibv_ops_t *ibv, struct ibv_pd *pd,
                       int access, long max)
{
    memset(c, 0, sizeof(*c));
    c->ibv = ibv;
    c->pd = pd;
    c->access = access;
    c->max = max;
}

static void unlink_entry(gcoll_vb_regcache_t *c, gcoll_vb_reg_t *r)
{
    if (!r->in_cache)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->tail = r->prev;
    r->prev = r->next = NULL;
    r->in_cache = 0;
    if (!r->user)
        c->count--;
}

static void push_front(gcoll_vb_regcache_t *c, gcoll_vb_reg_t *r)
{
    r->prev = NULL;
    r->next = c->head;
    if (c->head)
        c->head->prev = r;
    else
        c->tail = r;
    c->head = r;
    r->in_cache = 1;
    if (!r->user)
        c->count++;
}

static void free_entry(gcoll_vb_regcache_t *c, gcoll_vb_reg_t *r)
{
    if (r->mr && c->ibv->dereg_mr(r->mr) != 0)
        GCOLL_WARN("verbs: ibv_dereg_mr: %s", strerror(errno));
    free(r);
}

/* Drops least recently used idle entries until at most keep cached ones remain. */
static void evict(gcoll_vb_regcache_t *c, long keep)
{
    gcoll_vb_reg_t *r = c->tail;
    while (r && c->count > keep) {
        gcoll_vb_reg_t *prev = r->prev;
        if (!r->user && r->refs == 0) {
            unlink_entry(c, r);
            free_entry(c, r);
            c->evictions++;
        }
        r = prev;
    }
}

gcoll_status_t gcoll_vb_reg_acquire(gcoll_vb_regcache_t *c, const void *addr, size_t len, int user,
                                    gcoll_vb_reg_t **reg_p, char *err, size_t errlen)
{
    uintptr_t a = (uintptr_t)addr, e;
    if (len == 0 || __builtin_add_overflow(a, len, &e)) {
        snprintf(err, errlen, "cannot register %zu bytes at %p", len, addr);
        return GCOLL_ERR_INVALID;
    }
    if (!user) {
        for (gcoll_vb_reg_t *r = c->head; r; r = r->next) {
            if (r->start <= a && e <= r->end) {
                unlink_entry(c, r);
                push_front(c, r);
                r->refs++;
                c->hits++;
                *reg_p = r;
                return GCOLL_OK;
            }
        }
        c->misses++;
    }
    /* Whole pages: neighbouring buffers on the same pages then share the entry. */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = a & ~(pg - 1), end = e > UINTPTR_MAX - pg ? e : (e + pg - 1) & ~(pg - 1);
    gcoll_vb_reg_t *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return GCOLL_ERR_NOMEM;
    }
    r->start = start;
    r->end = end;
    r->user = user;
    r->refs = 1;
    for (int attempt = 0; attempt < 2 && !r->mr; attempt++) {
        r->mr = c->ibv->reg_mr(c->pd, (void *)start, end - start, c->access);
        if (!r->mr && attempt == 0 && (errno == ENOMEM || errno == EAGAIN))
            evict(c, 0); /* pinned-memory limit: give back what the cache holds, retry */
    }
    if (!r->mr) {
        int e2 = errno;
        snprintf(err, errlen, "ibv_reg_mr of %zu bytes failed: %s%s", (size_t)(end - start),
                 strerror(e2), e2 == ENOMEM ? " (check ulimit -l, the locked-memory limit)" : "");
        free(r);
        return GCOLL_ERR_TRANSPORT;
    }
    c->registrations++;
    if (user || c->max > 0) {
        push_front(c, r);
        evict(c, c->max);
    }
    *reg_p = r;
    return GCOLL_OK;
}

void gcoll_vb_reg_release(gcoll_vb_regcache_t *c, gcoll_vb_reg_t *r)
{
    if (!r || --r->refs > 0)
        return;
    if (!r->in_cache)
        free_entry(c, r); /* uncached, or invalidated while in use */
    else
        evict(c, c->max);
}

void gcoll_vb_reg_invalidate(gcoll_vb_regcache_t *c, const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr, e = a + len;
    gcoll_vb_reg_t *r = c->head;
    while (r) {
        gcoll_vb_reg_t *next = r->next;
        if (r->start < e && a < r->end) {
            unlink_entry(c, r);
            if (r->refs == 0)
                free_entry(c, r);
        }
        r = next;
    }
}

void gcoll_vb_reg_destroy(gcoll_vb_regcache_t *c)
{
    while (c->head) {
        gcoll_vb_reg_t *r = c->head;
        unlink_entry(c, r);
        free_entry(c, r);
    }
}
