/* flood_util.h: the bounded unexpected-message store under a flood (issue 33, item 3).
 * Rank 0 sends 2 GiB in messages to rank 1, which posts no receive; rank 1's store is
 * bounded by GCOLL_UNEXPECTED_BYTES (cfg->unexpected_bytes). Both ranks are transport
 * instances of this process: the sender sends from one buffer allocated and touched
 * before the measure, without copying it, so the growth of the process's resident size
 * is the receiver's store plus the transports' bookkeeping. */
#ifndef GCOLL_FLOOD_UTIL_H
#define GCOLL_FLOOD_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "transports/transport.h"

#define FLOOD_TOTAL ((size_t)2 << 30) /* 2 GiB offered */
#define FLOOD_WINDOW 16               /* sends in flight at a time */

typedef struct {
    size_t sent;                /* bytes of the sends that completed successfully */
    size_t rss_max;             /* most the resident size grew over the start, bytes */
    int failed;                 /* a send failed (the receiver gave the sender up) */
    gcoll_status_t recv_status; /* what a receive from rank 0 gets afterwards */
} flood_result_t;

static size_t flood_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (size_t)rss * 4096u;
}

/* Floods t1 from t0 with messages of msg bytes until 2 GiB went, a send failed, or secs
 * passed (a sender held back by flow control). */
static flood_result_t flood(const gcoll_transport_ops_t *ops, gcoll_transport_t *t0,
                            gcoll_transport_t *t1, size_t msg, int secs)
{
    flood_result_t res = {0};
    uint8_t *buf = malloc(msg);
    gcoll_treq_t *reqs = calloc(FLOOD_WINDOW, sizeof(*reqs));
    if (!buf || !reqs)
        abort();
    memset(buf, 0x3c, msg);
    size_t base = flood_rss(), posted = 0;
    uint64_t tag = 1000, deadline = gcoll_time_ms() + (uint64_t)secs * 1000u;
    int busy = 0;
    for (int i = 0; i < FLOOD_WINDOW; i++)
        reqs[i].done = 1;
    for (unsigned long it = 0; gcoll_time_ms() < deadline; it++) {
        busy = 0;
        for (int i = 0; i < FLOOD_WINDOW; i++) {
            gcoll_treq_t *r = &reqs[i];
            if (!r->done) {
                busy = 1;
                continue;
            }
            if (r->buf && r->status == GCOLL_OK)
                res.sent += r->len;
            else if (r->buf)
                res.failed = 1;
            r->buf = NULL;
            if (res.failed || posted >= FLOOD_TOTAL)
                continue;
            *r = (gcoll_treq_t){.peer = 1, .tag = tag++, .sig = 7, .buf = buf, .len = msg};
            posted += msg;
            busy = 1;
            if (ops->isend(t0, r) != GCOLL_OK)
                res.failed = 1;
        }
        if (!busy)
            break;
        ops->progress(t0, 0);
        ops->progress(t1, 0);
        if ((it & 63) == 0) {
            size_t now = flood_rss();
            if (now > base && now - base > res.rss_max)
                res.rss_max = now - base;
        }
    }
    size_t now = flood_rss();
    if (now > base && now - base > res.rss_max)
        res.rss_max = now - base;
    /* withdraw what flow control held back before the buffer goes */
    for (int i = 0; i < FLOOD_WINDOW; i++)
        if (!reqs[i].done && reqs[i].buf)
            ops->cancel(t0, &reqs[i]);
    uint8_t one[16];
    gcoll_treq_t r = {.peer = 0, .tag = 999999, .sig = 7, .buf = one, .len = sizeof(one)};
    ops->irecv(t1, &r);
    for (int i = 0; i < 2000 && !r.done; i++) {
        ops->progress(t1, 1);
        ops->progress(t0, 0);
    }
    if (!r.done)
        ops->cancel(t1, &r);
    res.recv_status = r.done ? r.status : GCOLL_INPROGRESS;
    free(buf);
    free(reqs);
    return res;
}

#endif /* GCOLL_FLOOD_UTIL_H */
