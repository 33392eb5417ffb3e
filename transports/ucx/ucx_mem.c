/* ucx_mem.c: the UCX transport's memory registration: ucp_mem_map behind a small cache
 * keyed by (address, length), invalidated by UCX's memory-event hooks (UCM) when the range
 * is unmapped, so a freed and reallocated buffer is never sent from a stale mapping.
 *
 * Limits (see docs/ucx.md): entries are found by exact (address, length) or, on the data
 * path, by containment; UCM reports munmap/mremap/brk shrink/madvise, so heap memory that
 * free() keeps mapped stays registered, which is correct (same pages). Without UCM events
 * (UCX_MEM_EVENTS=no, or a static binary) the cache keeps nothing unreferenced: a mapping
 * lives exactly as long as its handles. */
#include <stdlib.h>
#include <string.h>

#include <ucm/api/ucm.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

static void unmap_entry(gcoll_transport_t *t, ucx_reg_t *e)
{
    if (e->memh)
        ucp_mem_unmap(t->ctx, e->memh);
    memset(e, 0, sizeof(*e));
}

static int overlaps(const ucx_reg_t *e, const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)e->addr, b = (uintptr_t)addr;
    return e->memh && a < b + len && b < a + e->len;
}

/* Called by UCM from whichever thread unmaps memory, possibly inside free(): only flags
 * entries (under a recursive lock, as the hook can fire inside our own critical section). */
static void on_unmap(ucm_event_type_t type, ucm_event_t *event, void *arg)
{
    gcoll_transport_t *t = arg;
    (void)type;
    pthread_mutex_lock(&t->reg_lock);
    for (int i = 0; i < GCOLL_UCX_RCACHE_SIZE; i++)
        if (overlaps(&t->reg[i], event->vm_unmapped.address, event->vm_unmapped.size))
            t->reg[i].stale = 1;
    pthread_mutex_unlock(&t->reg_lock);
}

gcoll_status_t gcoll_ucx_reg_init(gcoll_transport_t *t)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(&t->reg_lock, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0)
        return GCOLL_ERR_NOMEM;
    t->reg_hooked = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 1000, on_unmap, t) == UCS_OK;
    if (!t->reg_hooked)
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: no UCM memory events: registrations are not cached");
    return GCOLL_OK;
}

void gcoll_ucx_reg_fini(gcoll_transport_t *t)
{
    if (t->reg_hooked)
        ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, on_unmap, t);
    t->reg_hooked = 0;
    if (!t->ctx)
        return;
    pthread_mutex_lock(&t->reg_lock);
    for (int i = 0; i < GCOLL_UCX_RCACHE_SIZE; i++)
        unmap_entry(t, &t->reg[i]);
    pthread_mutex_unlock(&t->reg_lock);
}

/* Unmaps stale entries nobody holds any more. Caller holds the lock. */
static void purge_stale(gcoll_transport_t *t)
{
    for (int i = 0; i < GCOLL_UCX_RCACHE_SIZE; i++)
        if (t->reg[i].memh && t->reg[i].stale && t->reg[i].refs == 0)
            unmap_entry(t, &t->reg[i]);
}

gcoll_status_t gcoll_ucx_mem_reg(gcoll_transport_t *t, void *buf, size_t len, void **handle_p)
{
    if (!buf || !len || !handle_p)
        return GCOLL_ERR_INVALID;
    gcoll_status_t st = GCOLL_OK;
    pthread_mutex_lock(&t->reg_lock);
    purge_stale(t);
    ucx_reg_t *e = NULL, *free_slot = NULL, *victim = NULL;
    for (int i = 0; i < GCOLL_UCX_RCACHE_SIZE; i++) {
        ucx_reg_t *r = &t->reg[i];
        if (!r->memh) {
            if (!free_slot)
                free_slot = r;
        } else if (r->addr == buf && r->len == len && !r->stale) {
            e = r;
            break;
        } else if (r->refs == 0 && (!victim || r->used < victim->used)) {
            victim = r; /* least recently used among the unreferenced */
        }
    }
    if (!e) {
        if (!free_slot && victim) {
            unmap_entry(t, victim);
            free_slot = victim;
        }
        if (!free_slot) {
            gcoll_ucx_set_error(t, "more than %d registrations in use at once",
                                GCOLL_UCX_RCACHE_SIZE);
            st = GCOLL_ERR_NOMEM;
            goto out;
        }
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = buf,
                                   .length = len};
        ucp_mem_h memh;
        ucs_status_t s = ucp_mem_map(t->ctx, &mp, &memh);
        if (s != UCS_OK) {
            gcoll_ucx_set_error(t, "ucp_mem_map of %zu bytes failed: %s", len,
                                ucs_status_string(s));
            st = gcoll_ucx_status(s);
            goto out;
        }
        e = free_slot;
        *e = (ucx_reg_t){.addr = buf, .len = len, .memh = memh};
    }
    e->refs++;
    __atomic_add_fetch(&t->reg_held, 1, __ATOMIC_RELEASE);
    e->used = ++t->reg_clock;
    *handle_p = e;
out:
    pthread_mutex_unlock(&t->reg_lock);
    return st;
}

void gcoll_ucx_mem_dereg(gcoll_transport_t *t, void *handle)
{
    ucx_reg_t *e = handle;
    if (!e)
        return;
    pthread_mutex_lock(&t->reg_lock);
    if (e >= t->reg && e < t->reg + GCOLL_UCX_RCACHE_SIZE && e->memh && e->refs > 0) {
        /* Kept for the next registration of the same buffer unless it cannot be trusted. */
        __atomic_sub_fetch(&t->reg_held, 1, __ATOMIC_RELEASE);
        if (--e->refs == 0 && (e->stale || !t->reg_hooked))
            unmap_entry(t, e);
    }
    pthread_mutex_unlock(&t->reg_lock);
}

ucp_mem_h gcoll_ucx_reg_lookup(gcoll_transport_t *t, const void *buf, size_t len)
{
    ucp_mem_h memh = NULL;
    uintptr_t b = (uintptr_t)buf;
    if (__atomic_load_n(&t->reg_held, __ATOMIC_ACQUIRE) == 0)
        return NULL; /* nothing registered: every message but those of gcoll_mem_reg users */
    pthread_mutex_lock(&t->reg_lock);
    for (int i = 0; i < GCOLL_UCX_RCACHE_SIZE && !memh; i++) {
        ucx_reg_t *e = &t->reg[i];
        /* Only while someone holds the registration: an unreferenced entry may describe
         * memory that was freed and reused in a way UCM does not see. */
        if (e->memh && !e->stale && e->refs > 0 && b >= (uintptr_t)e->addr &&
            b + len <= (uintptr_t)e->addr + e->len)
            memh = e->memh;
    }
    pthread_mutex_unlock(&t->reg_lock);
    return memh;
}
