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
