/* test_reduce.c: reduction kernels for every dtype and op against an independent
 * computation in double, on the dispatched (AVX2/F16C) and the portable paths; fp16 and
 * bf16 conversion corner cases. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/half.h"
#include "collectives/reduce.h"

static const gcoll_dtype_t dtypes[] = {GCOLL_FLOAT32, GCOLL_FLOAT16, GCOLL_BFLOAT16,
                                       GCOLL_FLOAT64, GCOLL_INT32,   GCOLL_INT64};
static const gcoll_op_t ops[] = {GCOLL_SUM, GCOLL_AVG, GCOLL_MIN, GCOLL_MAX, GCOLL_PROD};

static void put(void *b, size_t i, gcoll_dtype_t d, double v)
{
    /* clang-format off */
    switch (d) {
    case GCOLL_FLOAT32: ((float *)b)[i] = (float)v; break;
    case GCOLL_FLOAT64: ((double *)b)[i] = v; break;
    case GCOLL_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
    case GCOLL_INT64: ((int64_t *)b)[i] = (int64_t)v; break;
    case GCOLL_FLOAT16: ((uint16_t *)b)[i] = gcoll_f32_to_f16((float)v); break;
    case GCOLL_BFLOAT16: ((uint16_t *)b)[i] = gcoll_f32_to_bf16((float)v); break;
    }
    /* clang-format on */
}

static double get(const void *b, size_t i, gcoll_dtype_t d)
{
    /* clang-format off */
    switch (d) {
    case GCOLL_FLOAT32: return ((const float *)b)[i];
    case GCOLL_FLOAT64: return ((const double *)b)[i];
    case GCOLL_INT32: return ((const int32_t *)b)[i];
    case GCOLL_INT64: return (double)((const int64_t *)b)[i];
    case GCOLL_FLOAT16: return gcoll_f16_to_f32(((const uint16_t *)b)[i]);
    case GCOLL_BFLOAT16: return gcoll_bf16_to_f32(((const uint16_t *)b)[i]);
    }
    /* clang-format on */
    return NAN;
}

static void check_all(int scalar)
{
    int old = gcoll_reduce_force_scalar(scalar);
    enum { N = 1037 }; /* not a multiple of any vector width */
    uint8_t a[N * 8], b[N * 8];
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            for (size_t i = 0; i < N; i++) {
                /* small integers: every result is exact in every dtype */
                put(a, i, dtypes[d], (double)((int)(i * 7 % 23) - 11));
                put(b, i, dtypes[d], (double)((int)(i * 13 % 9) - 4));
            }
            gcoll_reduce(a, b, N, dtypes[d], ops[o]);
            for (size_t i = 0; i < N; i++) {
                double x = (double)((int)(i * 7 % 23) - 11), y = (double)((int)(i * 13 % 9) - 4);
                double want = ops[o] == GCOLL_PROD  ? x * y
                              : ops[o] == GCOLL_MIN ? fmin(x, y)
                              : ops[o] == GCOLL_MAX ? fmax(x, y)
                                                    : x + y;
                if (get(a, i, dtypes[d]) != want)
                    fail_msg("%s %s scalar=%d at %zu: got %g want %g", gcoll_dtype_name(dtypes[d]),
                             gcoll_op_name(ops[o]), scalar, i, get(a, i, dtypes[d]), want);
            }
        }
    }
    gcoll_reduce_force_scalar(old);
}

static void test_kernels_dispatched(void **state)
{
    (void)state;
    check_all(0);
}

static void test_kernels_scalar(void **state)
{
    (void)state;
    check_all(1);
}

/* gcoll_reduce_rev(dst, src) leaves in dst exactly what gcoll_reduce(copy of src, dst)
 * gives, bit for bit, on both kernel paths: non-integer values (rounding), NaN operands
 * (MIN/MAX keep the first operand's NaN) and every dtype and op. */
static void test_reduce_rev(void **state)
{
    (void)state;
    enum { N = 1037 };
    static uint8_t d1[N * 8], s1[N * 8], d2[N * 8], s2[N * 8];
    for (int scalar = 0; scalar < 2; scalar++) {
        int old = gcoll_reduce_force_scalar(scalar);
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
            size_t esz = gcoll_dtype_size(dtypes[d]);
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
                for (size_t i = 0; i < N; i++) {
                    double x = sin((double)i * 0.7) * 37.0, y = cos((double)i * 1.3) * 11.0;
                    int fp = dtypes[d] != GCOLL_INT32 && dtypes[d] != GCOLL_INT64;
                    put(d1, i, dtypes[d], fp && i % 97 == 5 ? NAN : x);
                    put(s1, i, dtypes[d], fp && i % 89 == 7 ? NAN : y);
                }
                memcpy(d2, s1, N * esz); /* reference: reduce(copy of src, dst) */
                memcpy(s2, d1, N * esz);
                gcoll_reduce_rev(d1, s1, N, dtypes[d], ops[o]);
                gcoll_reduce(d2, s2, N, dtypes[d], ops[o]);
                if (memcmp(d1, d2, N * esz) != 0)
                    fail_msg("reduce_rev %s %s scalar=%d differs from reduce with the operands "
                             "swapped",
                             gcoll_dtype_name(dtypes[d]), gcoll_op_name(ops[o]), scalar);
            }
        }
        gcoll_reduce_force_scalar(old);
    }
}

/* Non-integer fp16 sums: both paths round the fp32 sum to nearest even, identically. */
static void test_f16_rounding_paths_agree(void **state)
{
    (void)state;
    enum { N = 4099 };
    uint16_t a[N], b[N], a2[N];
    for (int i = 0; i < N; i++) {
        a[i] = a2[i] = gcoll_f32_to_f16(sinf((float)i) * 100.0f);
        b[i] = gcoll_f32_to_f16(cosf((float)i * 0.7f) * 3.0f);
    }
    gcoll_reduce(a, b, N, GCOLL_FLOAT16, GCOLL_SUM);
    int old = gcoll_reduce_force_scalar(1);
    gcoll_reduce(a2, b, N, GCOLL_FLOAT16, GCOLL_SUM);
    gcoll_reduce_force_scalar(old);
    assert_memory_equal(a, a2, sizeof(a));
}

static void test_avg_finish(void **state)
{
    (void)state;
    float f[3] = {3, 6, -9};
    int32_t n[3] = {7, -7, 8};
    uint16_t h[1] = {gcoll_f32_to_f16(3.0f)};
    gcoll_reduce_finish(f, 3, GCOLL_FLOAT32, GCOLL_AVG, 3);
    gcoll_reduce_finish(n, 3, GCOLL_INT32, GCOLL_AVG, 2);
    gcoll_reduce_finish(h, 1, GCOLL_FLOAT16, GCOLL_AVG, 2);
    assert_true(f[0] == 1 && f[1] == 2 && f[2] == -3);
    assert_true(n[0] == 3 && n[1] == -3 && n[2] == 4); /* truncation toward zero */
    assert_true(gcoll_f16_to_f32(h[0]) == 1.5f);
    gcoll_reduce_finish(f, 3, GCOLL_FLOAT32, GCOLL_SUM, 3); /* not AVG: untouched */
    assert_true(f[0] == 1);
}

static void test_half_conversions(void **state)
{
    (void)state;
    struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65520.0f, 0x7c00}, /* rounds up to inf */
        {65519.0f, 0x7bff},
        {1e9f, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {5.960464477539063e-8f, 0x0001},  /* smallest subnormal */
        {2.9802322387695312e-8f, 0x0000}, /* half of it: ties to even (0) */
        {8.940696716308594e-8f, 0x0002},  /* 1.5 ulp: ties to even (2) */
        {6.103515625e-5f, 0x0400},        /* smallest normal */
        {1.00048828125f, 0x3c00},         /* 1 + 2^-11: tie, to even */
        {1.00146484375f, 0x3c02},         /* 1 + 3*2^-11: tie, to even */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (gcoll_f32_to_f16(cases[i].f) != cases[i].h)
            fail_msg("f16(%g) = %04x, want %04x", cases[i].f, gcoll_f32_to_f16(cases[i].f),
                     cases[i].h);
    }
    assert_true(isnan(gcoll_f16_to_f32(gcoll_f32_to_f16(NAN))));
    /* every finite half round-trips through float exactly */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        assert_int_equal(gcoll_f32_to_f16(gcoll_f16_to_f32((uint16_t)h)), h);
    }
    assert_int_equal(gcoll_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(gcoll_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
    assert_int_equal(gcoll_f32_to_bf16(1.01171875f), 0x3f82); /* tie to even, up */
    assert_true(isnan(gcoll_bf16_to_f32(gcoll_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80)
            continue;
        assert_int_equal(gcoll_f32_to_bf16(gcoll_bf16_to_f32((uint16_t)h)), h);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_dispatched),       cmocka_unit_test(test_kernels_scalar),
        cmocka_unit_test(test_f16_rounding_paths_agree), cmocka_unit_test(test_avg_finish),
        cmocka_unit_test(test_half_conversions),         cmocka_unit_test(test_reduce_rev),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
