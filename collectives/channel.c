/* channel.c: the channel between collectives and a transport: tags, signatures, the
 * deadline and polling policy of waits, and the traffic counters. */
#include "collectives/channel.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/util.h"
#include "collectives/guard.h"

void gcoll_channel_setup(gcoll_channel_t *ch, int64_t timeout_ms, uint64_t spin_ns,
                         const volatile int *abort_flag, char *err, size_t errlen)
{
    gcoll_ticks_init();
    ch->timeout_ms = timeout_ms;
    ch->spin_ns = spin_ns;
    ch->abort_flag = abort_flag;
    ch->err = err;
    ch->errlen = errlen;
}

void gcoll_channel_set_error(gcoll_channel_t *ch, const char *fmt, ...)
{
    if (ch->err[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ch->err, ch->errlen, fmt, ap);
    va_end(ap);
}

const char *gcoll_channel_last_error(const gcoll_channel_t *ch)
{
    return ch->ops->last_error(ch->tp);
}

uint32_t gcoll_call_sig(int kind, size_t count, int dtype, int op, int root)
{
    /* word by word (a multiply and a shift each), not FNV's byte-serial multiplies over
     * 40 bytes: this runs on every call */
    uint64_t v[5] = {(uint64_t)kind, (uint64_t)count, (uint64_t)dtype, (uint64_t)op,
                     (uint64_t)(int64_t)root};
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 5; i++) {
        h = (h ^ v[i]) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    uint32_t s = (uint32_t)(h ^ (h >> 32));
    return s ? s : 1;
}

/* The signature a collective message carries: the call's, and once a rooted call ran, the
 * hash of theirs (guard.h). 0 stays 0: not checked. */
static uint32_t wire_sig(const gcoll_channel_t *ch, uint32_t sig)
{
    uint32_t s = sig ^ ch->hist;
    return !sig ? 0 : s ? s : 1;
}

gcoll_status_t gcoll_channel_isend(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint32_t sub,
                                   uint32_t sig, const void *buf, size_t len)
{
    sig = wire_sig(ch, sig);
    *r = (gcoll_treq_t){.peer = peer,
                        .tag = gcoll_channel_tag(ch, sub),
                        .sig = sig,
                        .buf = (void *)buf,
                        .len = len};
    ch->counters.bytes_sent += len;
    return ch->ops->isend(ch->tp, r);
}

gcoll_status_t gcoll_channel_irecv(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint32_t sub,
                                   uint32_t sig, void *buf, size_t len, unsigned flags)
{
    sig = wire_sig(ch, sig);
    *r = (gcoll_treq_t){.peer = peer,
                        .tag = gcoll_channel_tag(ch, sub),
                        .sig = sig,
                        .buf = buf,
                        .len = len,
                        .flags = flags};
    if (!(flags & GCOLL_TREQ_ANYLEN))
        ch->counters.bytes_received += len;
    return ch->ops->irecv(ch->tp, r);
}

gcoll_status_t gcoll_channel_isend_tag(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint64_t tag,
                                       uint32_t sig, const void *buf, size_t len)
{
    *r = (gcoll_treq_t){.peer = peer, .tag = tag, .sig = sig, .buf = (void *)buf, .len = len};
    ch->counters.bytes_sent += len;
    return ch->ops->isend(ch->tp, r);
}

gcoll_status_t gcoll_channel_irecv_tag(gcoll_channel_t *ch, gcoll_treq_t *r, int peer, uint64_t tag,
                                       uint32_t sig, void *buf, size_t len, unsigned flags)
{
    *r = (gcoll_treq_t){
        .peer = peer, .tag = tag, .sig = sig, .buf = buf, .len = len, .flags = flags};
    ch->counters.bytes_received += len;
    return ch->ops->irecv(ch->tp, r);
}

/* A receive of any length counts what arrived, once, when its completion is seen. */
static void count_anylen(gcoll_channel_t *ch, gcoll_treq_t *r)
{
    if ((r->flags & (GCOLL_TREQ_ANYLEN | GCOLL_TREQ_COUNTED)) == GCOLL_TREQ_ANYLEN &&
        r->status >= 0) {
        ch->counters.bytes_received += r->nbytes;
        r->flags |= GCOLL_TREQ_COUNTED;
    }
}

/* A wait polls the transport for up to GCOLL_SPIN_US (counted from the last completion or
 * wake-up) before it sleeps in it, yielding the CPU between polls after the first
 * SPIN_HOT_NS. A sleeping rank pays a wake-up on every message, most of a small
 * allreduce's time (docs/results/dense-allreduce.md). The yield is what makes polling pay on shared
 * cores too: a peer sharing the core runs at once instead of when the poller's time slice
 * ends (Open MPI's yield-when-idle); polling without it made small allreduces slower
 * there. Polling hot first, for about a shared-memory message's time, answers those
 * without a system call. */
#define SPIN_HOT_NS 500u
/* While polling hot, the clock is read every few rounds only: a clock read in a VM costs
 * about a shared-memory poll. The rounds without one count as wire time all the same (the
 * next read, or the completion, adds the whole interval). */
#define HOT_CLOCK_EVERY 4u

/* How long a wait polls before it starts yielding: at once when the awaited peer last ran
 * on this CPU (it needs the CPU to answer), up to SPIN_ELSEWHERE_NS when it runs on another
 * (yielding would only hand this CPU to a rank whose own peer may not be running either,
 * and ranks sharing cores then settle into phases where no partner ever runs at the same
 * time: every message a context switch), SPIN_HOT_NS when the transport cannot tell. The
 * bound keeps a rank whose peer waits for a third rank from holding a CPU that third rank
 * needs for long. */
#define SPIN_ELSEWHERE_NS 8000u

/* A wait for a large transfer, or any wait of an operation that tells its size (op_bytes:
 * the rooted calls, whose senders first wait for a word), polls about as long as those
 * bytes take at SPIN_BYTES_PER_NS (10 GB/s), at least GCOLL_SPIN_US and at most
 * SPIN_LARGE_MAX_NS: the peer is then most likely moving those bytes and answers soon, and
 * waking from a sleep costs more than the poll (2 ranks, 64 MiB sendrecv over shared
 * memory: 5-8% faster; scatter of 4 MiB over TCP: 6%). Only with a CPU per local rank
 * (spin_large) and unless the awaited peer last ran on this CPU: where ranks share CPUs the
 * poll takes time from another rank (4 ranks on 2 CPUs, 64 MiB gather: 7% slower). Once
 * the wait has slept (the peer was late, not busy), it polls GCOLL_SPIN_US after each wake,
 * so that an idle wait stays idle. */
#define SPIN_BYTES_PER_NS 10u
#define SPIN_LARGE_MAX_NS 10000000u

int gcoll_channel_peer_shares_cpu(const gcoll_channel_t *ch, int peer)
{
    return ch->ops->peer_shares_cpu ? ch->ops->peer_shares_cpu(ch->tp, peer) : -1;
}

size_t gcoll_channel_mesh_max(const gcoll_channel_t *ch)
{
    return ch->ops->mesh_max && ch->tp ? ch->ops->mesh_max(ch->tp) : 0;
}

int gcoll_channel_send_held(const gcoll_channel_t *ch, int peer, size_t len)
{
    return ch->ops->send_held && ch->tp ? ch->ops->send_held(ch->tp, peer, len) : 0;
}

static uint64_t hot_ns(const gcoll_channel_t *ch, const gcoll_treq_t *waiting)
{
    if (!waiting)
        return SPIN_HOT_NS;
    switch (gcoll_channel_peer_shares_cpu(ch, waiting->peer)) {
    case 1:
        return 0;
    case 0:
        return SPIN_ELSEWHERE_NS;
    default:
        return SPIN_HOT_NS;
    }
}

static uint64_t spin_budget(const gcoll_channel_t *ch, const gcoll_treq_t *waiting)
{
    if (!ch->spin_large || !ch->spin_ns || ch->wait_slept)
        return ch->spin_ns;
    size_t bytes = GCOLL_MAX(waiting ? waiting->len : 0, ch->op_bytes);
    if (bytes / SPIN_BYTES_PER_NS <= ch->spin_ns ||
        (waiting && gcoll_channel_peer_shares_cpu(ch, waiting->peer) == 1))
        return ch->spin_ns;
    return GCOLL_MIN(bytes / SPIN_BYTES_PER_NS, (size_t)SPIN_LARGE_MAX_NS);
}

static gcoll_status_t timed_out(gcoll_channel_t *ch, const gcoll_treq_t *waiting)
{
    if (waiting)
        gcoll_channel_set_error(ch,
                                "no progress for %lld ms (GCOLL_TIMEOUT_MS) while "
                                "waiting to %s rank %d",
                                (long long)ch->timeout_ms,
                                waiting->done ? "hear from" : "exchange data with", waiting->peer);
    else
        gcoll_channel_set_error(ch, "no progress for %lld ms (GCOLL_TIMEOUT_MS)",
                                (long long)ch->timeout_ms);
    return GCOLL_ERR_TIMEOUT;
}

gcoll_status_t gcoll_channel_poll(gcoll_channel_t *ch, const gcoll_treq_t *waiting)
{
    if (*ch->abort_flag) {
        gcoll_channel_set_error(ch, "gcoll_comm_abort was called");
        return GCOLL_ERR_ABORTED;
    }
    if (ch->deadline_stale && !ch->first_unclocked) {
        /* A wait's first round, after a completion or at the operation's start, reads no
         * clock: a message already there completes it (a small rooted call's root then
         * read none, where two reads were a third of an 8-byte call over shared memory,
         * 22 ns each here). Its time is not counted in ns_wire; the deadline starts with
         * the second round. */
        ch->first_unclocked = 1;
        return ch->ops->progress(ch->tp, 0);
    }
    if (ch->hot_skip) { /* polling hot: the clock every HOT_CLOCK_EVERY-th round */
        ch->hot_skip--;
        ch->hot_unclocked = 1;
        return ch->ops->progress(ch->tp, 0);
    }
    uint64_t t0 = gcoll_time_ns(); /* one clock read for the deadline and the polling */
    if (ch->deadline_stale) {      /* the first round, or a completion since the last one */
        ch->deadline_ms = t0 / 1000000u + (uint64_t)ch->timeout_ms;
        ch->deadline_stale = 0;
        if (!ch->wait_from_ns)
            ch->wait_from_ns = t0;
    }
    if (t0 / 1000000u >= ch->deadline_ms)
        return timed_out(ch, waiting);
    gcoll_status_t st;
    if (ch->guard) /* peers waiting in a rooted call: their probes */
        GCOLL_CHECK(gcoll_guard_check(ch));
    if (!ch->spin_from_ns)
        ch->spin_from_ns = t0;
    else /* polling: the rounds of one wait follow each other, so one read per round (what
          * the caller does between two rounds counts as wire time; the last round, which
          * saw the completion, does not) */
        ch->counters.ns_wire += t0 - ch->poll_prev_ns;
    ch->poll_prev_ns = t0;
    ch->hot_unclocked = 0;
    uint64_t spun = t0 - ch->spin_from_ns;
    if (spun < ch->spin_ns || spun < spin_budget(ch, waiting)) {
        st = ch->ops->progress(ch->tp, 0);
        /* not when this round completed what we wait for: the caller goes on (a yield
         * here handed the CPU away with the answer in hand: a context switch per round);
         * nor in the long poll, which runs only with a CPU per local rank: a yield there
         * helps no rank of ours and hands the CPU to any other process for its whole
         * slice (2 ranks beside 2 busy processes, 1 MiB sendrecv: 440-1120 us with the
         * yields, 84 without the long poll) */
        if (spun >= hot_ns(ch, waiting) && spun < ch->spin_ns && !(waiting && waiting->done))
            sched_yield();
        else
            ch->hot_skip = HOT_CLOCK_EVERY - 1;
    } else {
        st = ch->ops->progress(ch->tp, gcoll_ms_left(ch->deadline_ms, 100));
        ch->spin_from_ns = 0; /* woken: poll again before the next sleep */
        ch->wait_slept = 1;
        ch->counters.ns_wire += gcoll_time_ns() - t0;
    }
    return st;
}

gcoll_status_t gcoll_channel_peek(gcoll_channel_t *ch, const uint64_t *tags, int *peer_p)
{
    *peer_p = -1;
    if (!ch->ops->peek) {
        gcoll_channel_set_error(ch, "transport %s cannot receive from any source", ch->ops->name);
        return GCOLL_ERR_UNSUPPORTED;
    }
    return ch->ops->peek(ch->tp, tags, peer_p);
}

gcoll_status_t gcoll_channel_progress(gcoll_channel_t *ch, int timeout_ms)
{
    return ch->ops->progress(ch->tp, timeout_ms);
}

gcoll_status_t gcoll_channel_done(gcoll_channel_t *ch, gcoll_treq_t *r, int *done_p)
{
    *done_p = r->done;
    if (!r->done)
        return GCOLL_OK;
    count_anylen(ch, r);
    if (ch->hot_unclocked) { /* rounds since the last clock read count as wire time */
        ch->counters.ns_wire += gcoll_time_ns() - ch->poll_prev_ns;
        ch->hot_unclocked = 0;
    }
    ch->deadline_stale = 1;
    ch->first_unclocked = 0;
    ch->spin_from_ns = 0;
    ch->wait_slept = 0;
    ch->hot_skip = 0;
    return r->status < 0 ? r->status : GCOLL_OK;
}

gcoll_status_t gcoll_channel_waitall(gcoll_channel_t *ch, gcoll_treq_t *reqs, int n)
{
    int first = 0, done; /* requests before first are done */
    for (;;) {
        for (; first < n; first++) {
            GCOLL_CHECK(gcoll_channel_done(ch, &reqs[first], &done));
            if (!done)
                break;
        }
        if (first == n)
            return GCOLL_OK;
        GCOLL_CHECK(gcoll_channel_poll(ch, &reqs[first]));
    }
}

void gcoll_channel_cancel(gcoll_channel_t *ch, gcoll_treq_t *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (!reqs[i].done && reqs[i].status == GCOLL_INPROGRESS)
            ch->ops->cancel(ch->tp, &reqs[i]);
}
