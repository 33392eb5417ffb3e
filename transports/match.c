/* match.c: what every transport checks when a message meets the receive it matched. */
#include <stdio.h>

#include "transport.h"

gcoll_status_t gcoll_treq_match(const gcoll_treq_t *req, int peer, size_t len, uint32_t sig,
                                char *why, size_t whylen)
{
    int len_ok = (req->flags & GCOLL_TREQ_ANYLEN) ? len <= req->len : len == req->len;
    if (len_ok && sig == req->sig)
        return GCOLL_OK;
    if (sig != req->sig)
        snprintf(why, whylen, "rank %d is in a different call: another collective, or another "
                 "count, dtype, op or root (signature %08x, here %08x)", peer, sig, req->sig);
    else
        snprintf(why, whylen, "rank %d sent %zu bytes where %s%zu were expected (counts differ)",
                 peer, len, (req->flags & GCOLL_TREQ_ANYLEN) ? "at most " : "", req->len);
    return GCOLL_ERR_MISMATCH;
}

/* Receives not yet matched, kept per peer in posting order (a singly linked list with a
 * tail pointer): every transport uses these three operations. */
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
