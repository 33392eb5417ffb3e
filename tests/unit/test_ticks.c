/* test_ticks.c: the clock that times calls (lib/base/ticks.c) against CLOCK_MONOTONIC, and
 * the ns_total counter it feeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "base/ticks.h"
#include "gcoll.h"
#include "root_test_util.h"

/* An interval of about 50 ms read with both clocks: the same length to within 2%. The
 * calibration spans 200 us with reads good to tens of ns (1e-4), and the reads here add
 * under 1 us to 50 ms; 2% leaves room for a VM that preempts between paired reads. */
static void test_interval(void **state)
{
    (void)state;
    gcoll_ticks_init();
    for (int rep = 0; rep < 3; rep++) {
        uint64_t n0 = gcoll_time_ns(), k0 = gcoll_ticks();
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50000000};
        nanosleep(&ts, NULL);
        uint64_t k1 = gcoll_ticks(), n1 = gcoll_time_ns();
        double ns = (double)(n1 - n0), by_ticks = (double)gcoll_ticks_to_ns(k1 - k0);
        assert_true(ns >= 5e7);
        assert_true(by_ticks > ns * 0.98 && by_ticks < ns * 1.02);
    }
}

/* Never goes backwards on one thread. */
static void test_monotone(void **state)
{
    (void)state;
    gcoll_ticks_init();
    uint64_t prev = gcoll_ticks();
    for (int i = 0; i < 1000000; i++) {
        uint64_t now = gcoll_ticks();
        assert_true(now >= prev);
        prev = now;
    }
}

/* The counter of a communicator's time in calls: 200 blocking allreduces of 4 MiB out of
 * place on one rank (a copy each) add up to no more than the wall time around them, and
 * to most of it. */
static void test_ns_total(void **state)
{
    (void)state;
    char root_addr[64];
    test_pick_root(root_addr, sizeof(root_addr));
    gcoll_comm_t *comm = NULL;
    assert_int_equal(gcoll_comm_init_rank(1, 0, root_addr, &comm), GCOLL_OK);
    static float src[1 << 20], dst[1 << 20];
    gcoll_counters_t c0, c1;
    assert_int_equal(gcoll_comm_counters(comm, &c0), GCOLL_OK);
    uint64_t n0 = gcoll_time_ns();
    for (int i = 0; i < 200; i++)
        assert_int_equal(gcoll_allreduce(comm, src, dst, 1 << 20, GCOLL_FLOAT32, GCOLL_SUM),
                         GCOLL_OK);
    uint64_t wall = gcoll_time_ns() - n0;
    assert_int_equal(gcoll_comm_counters(comm, &c1), GCOLL_OK);
    uint64_t in_calls = c1.ns_total - c0.ns_total;
    assert_int_equal(c1.ops - c0.ops, 200);
    /* inside the wall time (2% for the calibration), and most of it: the loop does nothing
     * else but the calls */
    assert_true((double)in_calls <= (double)wall * 1.02);
    assert_true(in_calls > wall / 2);
    gcoll_comm_destroy(comm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interval),
        cmocka_unit_test(test_monotone),
        cmocka_unit_test(test_ns_total),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
