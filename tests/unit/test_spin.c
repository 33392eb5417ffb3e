/* test_spin.c: how long a blocking wait (the channel's poll) polls before it sleeps, against
 * a fake transport that never completes anything and records when it is first asked to
 * sleep (progress with a timeout). A wait for 64 MiB from a peer on another CPU polls about
 * as long as the transfer takes at 10 GB/s (6.7 ms), and so does a small wait in an
 * operation of 64 MiB; the same wait with the peer on this CPU or with more local ranks
 * than CPUs, a small wait, and a wait that has already slept poll GCOLL_SPIN_US (50 us)
 * only.
 * Lower bounds are exact (the clock); upper bounds leave a 3 ms margin for a loaded or
 * instrumented run, far below the 6.7 ms they separate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "collectives/channel.h"
#include "base/util.h"

static int shares_cpu;
static uint64_t slept_at_ns; /* first progress call with a timeout, 0: none yet */

static gcoll_status_t fake_progress(gcoll_transport_t *t, int timeout_ms)
{
    (void)t;
    if (timeout_ms > 0 && !slept_at_ns)
        slept_at_ns = gcoll_time_ns();
    return GCOLL_OK; /* woken at once: nothing arrived */
}

static int fake_shares_cpu(gcoll_transport_t *t, int peer)
{
    (void)t;
    (void)peer;
    return shares_cpu;
}

static const gcoll_transport_ops_t fake_ops = {
    .name = "fake", .progress = fake_progress, .peer_shares_cpu = fake_shares_cpu};

/* Polls a wait for len bytes from rank 1 until it first sleeps; returns the ns it polled. */
static uint64_t polled_ns(gcoll_channel_t *ch, size_t len)
{
    gcoll_treq_t req = {.peer = 1, .len = len};
    slept_at_ns = 0;
    uint64_t t0 = gcoll_time_ns();
    while (!slept_at_ns)
        assert_int_equal(gcoll_channel_poll(ch, &req), GCOLL_OK);
    return slept_at_ns - t0;
}

/* Polled GCOLL_SPIN_US, not the long poll (see the margin above). */
static void assert_spin_us(uint64_t polled)
{
    assert_true(polled >= 50000u);
    assert_true(polled < 3000000u);
}

static const volatile int no_abort;
static char err[256];

/* A channel as a communicator with a CPU per local rank sets it up (GCOLL_SPIN_US 50 us). */
static int setup(void **state)
{
    static gcoll_channel_t ch;
    memset(&ch, 0, sizeof(ch));
    gcoll_channel_setup(&ch, 60000, 50000, &no_abort, err, sizeof(err));
    ch.ops = &fake_ops;
    ch.spin_large = 1;
    gcoll_channel_begin(&ch);
    *state = &ch;
    return 0;
}

static void test_large_elsewhere(void **state)
{
    gcoll_channel_t *ch = *state;
    shares_cpu = 0;
    const size_t len = (size_t)64 << 20;
    uint64_t first = polled_ns(ch, len);
    assert_true(first >= len / 10); /* 6.7 ms */
    assert_true(first < len / 10 + 3000000u);
    /* the same wait, woken with nothing done: GCOLL_SPIN_US only from now on */
    assert_spin_us(polled_ns(ch, len));
    /* a completion starts a new wait: the long poll again */
    gcoll_treq_t done = {.peer = 1, .len = len, .done = 1};
    int d = 0;
    assert_int_equal(gcoll_channel_done(ch, &done, &d), GCOLL_OK);
    assert_int_equal(d, 1);
    assert_true(polled_ns(ch, len) >= len / 10);
}

static void test_large_same_cpu(void **state)
{
    gcoll_channel_t *ch = *state;
    shares_cpu = 1; /* the peer needs this CPU to answer: polling longer would delay it */
    assert_spin_us(polled_ns(ch, (size_t)64 << 20));
    shares_cpu = 0; /* another CPU, but more local ranks than CPUs */
    ch->spin_large = 0;
    gcoll_channel_begin(ch);
    assert_spin_us(polled_ns(ch, (size_t)64 << 20));
}

/* Where the transport cannot tell where the peer runs (TCP), a CPU per local rank is
 * enough; a small wait (a rooted call's "ready" word) in an operation that tells its size
 * polls as long as the operation's bytes take. */
static void test_unknown_and_op_bytes(void **state)
{
    gcoll_channel_t *ch = *state;
    shares_cpu = -1;
    const size_t len = (size_t)64 << 20;
    assert_true(polled_ns(ch, len) >= len / 10);
    gcoll_channel_begin(ch);
    assert_spin_us(polled_ns(ch, 0));
    gcoll_channel_begin(ch);
    ch->op_bytes = len;
    assert_true(polled_ns(ch, 0) >= len / 10);
}

static void test_small(void **state)
{
    gcoll_channel_t *ch = *state;
    shares_cpu = 0;
    assert_spin_us(polled_ns(ch, 256 << 10)); /* 26 us at 10 GB/s: below GCOLL_SPIN_US */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_large_elsewhere, setup),
        cmocka_unit_test_setup(test_large_same_cpu, setup),
        cmocka_unit_test_setup(test_unknown_and_op_bytes, setup),
        cmocka_unit_test_setup(test_small, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
