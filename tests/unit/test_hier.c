/* test_hier.c: the host layout from synthetic host-name lists (contiguous, interleaved,
 * uneven), and the GCOLL_HIER decision and its cost estimate: the settings that force it,
 * the layouts where a hierarchy is pointless, and auto's crossover with the size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hier/hier.h"

static void layout(const char *const *names, int n, int rank, gcoll_hier_t *h)
{
    assert_int_equal(gcoll_hier_layout_from(h, names, n, rank), GCOLL_OK);
}

static void test_layout_contiguous(void **state)
{
    (void)state;
    const char *names[] = {"a", "a", "b", "b"};
    gcoll_hier_t h;
    layout(names, 4, 3, &h);
    assert_int_equal(h.nhosts, 2);
    assert_int_equal(h.host, 1);
    assert_int_equal(h.local_rank, 1);
    assert_int_equal(h.local_size, 2);
    assert_int_equal(h.uniform, 1);
    assert_int_equal(h.max_local, 2);
    assert_int_equal(h.ring_cross, 1); /* 1 -> 2 leaves a, 3 -> 0 leaves b */
    assert_string_equal(h.name, "b");
    free(h.host_of);
}

static void test_layout_interleaved(void **state)
{
    (void)state;
    const char *names[] = {"x", "y", "x", "y", "x", "y"};
    gcoll_hier_t h;
    layout(names, 6, 4, &h);
    assert_int_equal(h.nhosts, 2);
    assert_int_equal(h.host, 0);
    assert_int_equal(h.local_rank, 2);
    assert_int_equal(h.local_size, 3);
    assert_int_equal(h.ring_cross, 3); /* every edge of the ring changes host */
    free(h.host_of);
}

static void test_layout_uneven(void **state)
{
    (void)state;
    const char *names[] = {"n1", "n1", "n1", "n2", "n3", "n3"};
    gcoll_hier_t h;
    layout(names, 6, 5, &h);
    assert_int_equal(h.nhosts, 3);
    assert_int_equal(h.host, 2);
    assert_int_equal(h.local_rank, 1);
    assert_int_equal(h.local_size, 2);
    assert_int_equal(h.uniform, 0);
    assert_int_equal(h.max_local, 3);
    assert_int_equal(h.host_of[3], 1);
    free(h.host_of);
}

static gcoll_hier_model_t model(int size, int nhosts, int max_local, int uniform)
{
    gcoll_hier_model_t m;
    gcoll_hier_model_defaults(&m, 0);
    m.size = size;
    m.nhosts = nhosts;
    m.max_local = max_local;
    m.uniform = uniform;
    m.ring_cross = 1;
    return m;
}

static void test_decide_forced_and_pointless(void **state)
{
    (void)state;
    char why[256];
    gcoll_hier_model_t m = model(4, 2, 2, 1);
    assert_int_equal(gcoll_hier_decide(1, &m, 1 << 30, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "GCOLL_HIER=0"));
    assert_int_equal(gcoll_hier_decide(2, &m, 4, why, sizeof(why)), 1);
    gcoll_hier_model_t one = model(4, 1, 4, 1);
    assert_int_equal(gcoll_hier_decide(2, &one, 1 << 30, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "one host"));
    gcoll_hier_model_t each = model(4, 4, 1, 1);
    assert_int_equal(gcoll_hier_decide(2, &each, 1 << 30, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "one rank"));
    assert_int_equal(gcoll_hier_decide(0, &m, 1 << 20, NULL, 0), 1); /* why may be NULL */
}

/* Auto: flat for latency-bound sizes, hierarchical for large ones, and the estimates follow
 * the wire: a flat ring's busiest host link carries 2(P-1)/P of the bytes, the leaders' or
 * rails' 2(H-1)/H. */
static void test_decide_auto_crossover(void **state)
{
    (void)state;
    gcoll_hier_model_t m = model(4, 2, 2, 1);
    assert_int_equal(gcoll_hier_decide(0, &m, 8, NULL, 0), 0);
    assert_int_equal(gcoll_hier_decide(0, &m, 100u << 20, NULL, 0), 1);
    m.bw_inter = 1.25e8; /* 1 Gbit/s: the wire dominates both */
    m.bw_intra = 1e15;
    m.alpha_inter = m.alpha_intra = m.alpha_op = 0;
    double f, h;
    gcoll_hier_estimate(&m, 100000000, &f, &h);
    assert_float_equal(f, 1.5 * 0.8, 1e-9);
    assert_float_equal(h, 1.0 * 0.8, 1e-9);
    /* an interleaved layout doubles the flat ring's load on each host link */
    m.ring_cross = 2;
    gcoll_hier_estimate(&m, 100000000, &f, &h);
    assert_float_equal(f, 2 * 1.5 * 0.8, 1e-9);
}

/* A sparse codec's small wire leaves the dense steps inside the host to decide: with a
 * slow enough inside, flat wins. */
static void test_decide_compressed(void **state)
{
    (void)state;
    gcoll_hier_model_t m = model(4, 2, 2, 1);
    m.wire_ratio = 0.02;
    m.encode_s_per_byte = 0.25e-9;
    m.sparse_result = 1;
    assert_int_equal(gcoll_hier_decide(0, &m, 100000000, NULL, 0), 1);
    m.bw_intra = 1e8;
    assert_int_equal(gcoll_hier_decide(0, &m, 100000000, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_contiguous),
        cmocka_unit_test(test_layout_interleaved),
        cmocka_unit_test(test_layout_uneven),
        cmocka_unit_test(test_decide_forced_and_pointless),
        cmocka_unit_test(test_decide_auto_crossover),
        cmocka_unit_test(test_decide_compressed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
