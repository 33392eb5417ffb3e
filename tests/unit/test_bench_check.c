/* test_bench_check.c: gcoll-bench's -c reference (tools/bench/check.c) against values worked
 * out by hand below: wrapping unsigned sums and averages, truncating signed averages, bool's
 * logical ops, products, an fp8 sum's bit pattern, and AVG's one-rounding tolerance; and a
 * single wrong element is counted. Inputs: rank r's element i is ((7i + 3r) mod 9) - 4
 * (fp8: mod 3 - 1; PROD: 1, -1, 2, -2 by that value mod 4; bool: its low bit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

static bench_opts_t opts(gcoll_dtype_t d, gcoll_op_t op)
{
    bench_opts_t o = {.coll = BENCH_ALLREDUCE, .dtype = d, .op = op};
    return o;
}

/* 3 ranks, elements 0..2: inputs r0 = {-4, 3, 1}, r1 = {-1, -3, 4}, r2 = {2, 0, -2} */
static void test_int8_uint8(void **state)
{
    (void)state;
    bench_opts_t o = opts(GCOLL_INT8, GCOLL_SUM);
    int8_t s8[3] = {-3, 0, 3};
    assert_int_equal(bench_wrong(&o, s8, 3, 3, -1, 0), 0);
    s8[1] = 1;
    assert_int_equal(bench_wrong(&o, s8, 3, 3, -1, 0), 1);
    o.op = GCOLL_AVG; /* -3/3, 0/3, 3/3 */
    int8_t a8[3] = {-1, 0, 1};
    assert_int_equal(bench_wrong(&o, a8, 3, 3, -1, 0), 0);
    o.op = GCOLL_MIN;
    int8_t m8[3] = {-4, -3, -2};
    assert_int_equal(bench_wrong(&o, m8, 3, 3, -1, 0), 0);
    o = opts(GCOLL_UINT8, GCOLL_SUM); /* -3 wraps to 253 */
    uint8_t su[3] = {253, 0, 3};
    assert_int_equal(bench_wrong(&o, su, 3, 3, -1, 0), 0);
    o.op = GCOLL_AVG; /* the wrapped sum divided: 253 / 3 = 84 */
    uint8_t au[3] = {84, 0, 1};
    assert_int_equal(bench_wrong(&o, au, 3, 3, -1, 0), 0);
    o.op = GCOLL_MIN; /* 252, 255, 2 -> 2; 3, 253, 0 -> 0; 1, 4, 254 -> 1 */
    uint8_t mu[3] = {2, 0, 1};
    assert_int_equal(bench_wrong(&o, mu, 3, 3, -1, 0), 0);
    o.op = GCOLL_BXOR; /* 252^255^2 = 1; 3^253^0 = 254; 1^4^254 = 251 */
    uint8_t xu[3] = {1, 254, 251};
    assert_int_equal(bench_wrong(&o, xu, 3, 3, -1, 0), 0);
}

static void test_bool_prod(void **state)
{
    (void)state;
    /* low bits: element 0 of ranks 0..2: 0, 1, 0; element 1: 1, 1, 0 */
    bench_opts_t o = opts(GCOLL_BOOL, GCOLL_SUM);
    uint8_t or_[2] = {1, 1}, and_[2] = {0, 0}, xor_[2] = {1, 0};
    assert_int_equal(bench_wrong(&o, or_, 2, 3, -1, 0), 0);
    o.op = GCOLL_PROD;
    assert_int_equal(bench_wrong(&o, and_, 2, 3, -1, 0), 0);
    o.op = GCOLL_BXOR;
    assert_int_equal(bench_wrong(&o, xor_, 2, 3, -1, 0), 0);
    assert_int_equal(bench_wrong(&o, or_, 2, 3, -1, 0), 1);
    /* PROD inputs of element 0: values 0, 3, 6 mod 4 = 0, 3, 2 -> 1, -2, 2 */
    o = opts(GCOLL_INT32, GCOLL_PROD);
    int32_t p = -4;
    assert_int_equal(bench_wrong(&o, &p, 1, 3, -1, 0), 0);
}

static void test_floats(void **state)
{
    (void)state;
    /* fp8 inputs of element 0: 0, 3, 6 mod 3 - 1 = -1 on every rank; -3 in E4M3 is
     * sign 1, exponent 1 + 7, mantissa .100: 0xc4 */
    bench_opts_t o = opts(GCOLL_FLOAT8_E4M3, GCOLL_SUM);
    uint8_t e = 0xc4;
    assert_int_equal(bench_wrong(&o, &e, 1, 3, -1, 0), 0);
    e = 0xc5;
    assert_int_equal(bench_wrong(&o, &e, 1, 3, -1, 0), 1);
    /* float16 AVG of element 2 (1, 4, -2): 1.0 = 0x3c00; one ulp off passes, two do not */
    o = opts(GCOLL_FLOAT16, GCOLL_AVG);
    uint16_t h[3] = {0, 0, 0x3c00};
    assert_int_equal(bench_wrong(&o, h + 2, 1, 3, -1, 2), 0);
    h[2] = 0x3c01;
    assert_int_equal(bench_wrong(&o, h + 2, 1, 3, -1, 2), 0);
    h[2] = 0x3c02;
    assert_int_equal(bench_wrong(&o, h + 2, 1, 3, -1, 2), 1);
    /* float32 SUM is bit-exact: 1 + 4 - 2 */
    o = opts(GCOLL_FLOAT32, GCOLL_SUM);
    float f = 3.0f;
    assert_int_equal(bench_wrong(&o, &f, 1, 3, -1, 2), 0);
    f = 3.0000002f;
    assert_int_equal(bench_wrong(&o, &f, 1, 3, -1, 2), 1);
}

static void test_fill_and_moves(void **state)
{
    (void)state;
    bench_opts_t o = opts(GCOLL_INT16, GCOLL_SUM);
    int16_t b[4];
    bench_fill(&o, b, 4, 1, 0); /* rank 1: (3, 10, 17, 24) mod 9 - 4 */
    assert_int_equal(b[0], -1);
    assert_int_equal(b[1], -3);
    assert_int_equal(b[2], 4);
    assert_int_equal(b[3], 2);
    /* a moved block: rank 1's elements 0..3 from rank 1, not from rank 2 */
    assert_int_equal(bench_wrong(&o, b, 4, 3, 1, 0), 0);
    assert_int_equal(bench_wrong(&o, b, 4, 3, 2, 0), 4);
    assert_int_equal(bench_wrong(&o, b + 1, 3, 3, 1, 1), 0);
}

static void test_names_and_factors(void **state)
{
    (void)state;
    gcoll_dtype_t d;
    gcoll_op_t op;
    bench_coll_t c;
    assert_int_equal(bench_parse_dtype("half", &d), 0);
    assert_int_equal(d, GCOLL_FLOAT16);
    assert_int_equal(bench_parse_dtype("float8_e5m2", &d), 0);
    assert_int_equal(d, GCOLL_FLOAT8_E5M2);
    assert_int_equal(bench_parse_dtype("float128", &d), -1);
    assert_int_equal(bench_parse_op("bxor", &op), 0);
    assert_int_equal(op, GCOLL_BXOR);
    assert_int_equal(bench_parse_op("mulsum", &op), -1);
    assert_int_equal(bench_parse_coll("reduce_scatter", &c), 0);
    assert_int_equal(c, BENCH_REDUCE_SCATTER);
    assert_non_null(bench_op_refused(GCOLL_FLOAT32, GCOLL_BAND));
    assert_non_null(bench_op_refused(GCOLL_BOOL, GCOLL_AVG));
    assert_null(bench_op_refused(GCOLL_INT8, GCOLL_BXOR));
    /* nccl-tests' doc/PERFORMANCE.md on 4 ranks */
    assert_true(bench_bus_factor(BENCH_ALLREDUCE, 4) == 1.5);
    assert_true(bench_bus_factor(BENCH_ALLGATHER, 4) == 0.75);
    assert_true(bench_bus_factor(BENCH_REDUCE_SCATTER, 4) == 0.75);
    assert_true(bench_bus_factor(BENCH_ALLTOALL, 4) == 0.75);
    assert_true(bench_bus_factor(BENCH_BROADCAST, 4) == 1.0);
    assert_true(bench_bus_factor(BENCH_SENDRECV, 4) == 1.0);
    assert_true(bench_bus_factor(BENCH_REDUCE, 4) == 1.0);
    assert_true(bench_bus_factor(BENCH_GATHER, 4) == 0.75);
    assert_true(bench_bus_factor(BENCH_SCATTER, 4) == 0.75);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_uint8),
        cmocka_unit_test(test_bool_prod),
        cmocka_unit_test(test_floats),
        cmocka_unit_test(test_fill_and_moves),
        cmocka_unit_test(test_names_and_factors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
