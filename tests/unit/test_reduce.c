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
    case GCOLL_FLOAT8_E4M3: ((uint8_t *)b)[i] = gcoll_f32_to_e4m3((float)v); break;
    case GCOLL_FLOAT8_E5M2: ((uint8_t *)b)[i] = gcoll_f32_to_e5m2((float)v); break;
    default: fail();
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
    case GCOLL_FLOAT8_E4M3: return gcoll_e4m3_to_f32(((const uint8_t *)b)[i]);
    case GCOLL_FLOAT8_E5M2: return gcoll_e5m2_to_f32(((const uint8_t *)b)[i]);
    default: fail();
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
            gcoll_reduce_local(a, b, N, dtypes[d], ops[o]);
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

static const gcoll_dtype_t rev_dtypes[] = {GCOLL_FLOAT32,     GCOLL_FLOAT16,    GCOLL_BFLOAT16,
                                           GCOLL_FLOAT64,     GCOLL_INT32,      GCOLL_INT64,
                                           GCOLL_FLOAT8_E4M3, GCOLL_FLOAT8_E5M2};

/* gcoll_reduce_rev(dst, src) leaves in dst exactly what gcoll_reduce_local(copy of src, dst)
 * gives, bit for bit, on both kernel paths: non-integer values (rounding), NaN operands
 * (MIN/MAX keep the first operand's NaN) and every dtype and op. */
static void test_reduce_rev(void **state)
{
    (void)state;
    enum { N = 1037 };
    static uint8_t d1[N * 8], s1[N * 8], d2[N * 8], s2[N * 8];
    for (int scalar = 0; scalar < 2; scalar++) {
        int old = gcoll_reduce_force_scalar(scalar);
        for (size_t d = 0; d < sizeof(rev_dtypes) / sizeof(rev_dtypes[0]); d++) {
            size_t esz = gcoll_dtype_size(rev_dtypes[d]);
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
                for (size_t i = 0; i < N; i++) {
                    double x = sin((double)i * 0.7) * 37.0, y = cos((double)i * 1.3) * 11.0;
                    int fp = rev_dtypes[d] != GCOLL_INT32 && rev_dtypes[d] != GCOLL_INT64;
                    put(d1, i, rev_dtypes[d], fp && i % 97 == 5 ? NAN : x);
                    put(s1, i, rev_dtypes[d], fp && i % 89 == 7 ? NAN : y);
                }
                memcpy(d2, s1, N * esz); /* reference: reduce(copy of src, dst) */
                memcpy(s2, d1, N * esz);
                gcoll_reduce_rev(d1, s1, N, rev_dtypes[d], ops[o]);
                gcoll_reduce_local(d2, s2, N, rev_dtypes[d], ops[o]);
                if (memcmp(d1, d2, N * esz) != 0)
                    fail_msg("reduce_rev %s %s scalar=%d differs from reduce with the operands "
                             "swapped",
                             gcoll_dtype_name(rev_dtypes[d]), gcoll_op_name(ops[o]), scalar);
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
    gcoll_reduce_local(a, b, N, GCOLL_FLOAT16, GCOLL_SUM);
    int old = gcoll_reduce_force_scalar(1);
    gcoll_reduce_local(a2, b, N, GCOLL_FLOAT16, GCOLL_SUM);
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

/* ---- dtypes beyond the first six: integers, bool, fp8 ---------------------------------- */

static const gcoll_op_t all_ops[] = {GCOLL_SUM,  GCOLL_AVG,  GCOLL_MIN, GCOLL_MAX,
                                     GCOLL_PROD, GCOLL_BAND, GCOLL_BOR, GCOLL_BXOR};

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Reference for one integer element, written per type with the C arithmetic of a wider
 * type and an explicit reduction modulo 2^bits (independent of the library's kernels). */
#define INT_REF(T, W)                                                                              \
    static T ref_##T(T x, T y, gcoll_op_t op)                                                      \
    {                                                                                              \
        W a = (W)x, b = (W)y;                                                                      \
        switch (op) {                                                                              \
        case GCOLL_SUM:                                                                            \
        case GCOLL_AVG:                                                                            \
            return (T)(a + b);                                                                     \
        case GCOLL_PROD:                                                                           \
            return (T)(a * b);                                                                     \
        case GCOLL_MIN:                                                                            \
            return x < y ? x : y;                                                                  \
        case GCOLL_MAX:                                                                            \
            return x > y ? x : y;                                                                  \
        case GCOLL_BAND:                                                                           \
            return (T)(x & y);                                                                     \
        case GCOLL_BOR:                                                                            \
            return (T)(x | y);                                                                     \
        case GCOLL_BXOR:                                                                           \
            return (T)(x ^ y);                                                                     \
        }                                                                                          \
        return 0;                                                                                  \
    }
INT_REF(int8_t, uint32_t)
INT_REF(uint8_t, uint32_t)
INT_REF(int16_t, uint32_t)
INT_REF(int32_t, uint64_t)
INT_REF(uint32_t, uint64_t)
INT_REF(int64_t, unsigned __int128)
INT_REF(uint64_t, unsigned __int128)

static uint8_t ref_bool(uint8_t x, uint8_t y, gcoll_op_t op)
{
    int a = x != 0, b = y != 0;
    if (op == GCOLL_PROD || op == GCOLL_MIN || op == GCOLL_BAND)
        return (uint8_t)(a && b);
    return (uint8_t)(op == GCOLL_BXOR ? a != b : a || b);
}

static void ref_int(void *r, const void *x, const void *y, size_t i, gcoll_dtype_t d, gcoll_op_t op)
{
#define REF(T) ((T *)r)[i] = ref_##T(((const T *)x)[i], ((const T *)y)[i], op)
    /* clang-format off */
    switch (d) {
    case GCOLL_INT8: REF(int8_t); break;
    case GCOLL_UINT8: REF(uint8_t); break;
    case GCOLL_INT16: REF(int16_t); break;
    case GCOLL_INT32: REF(int32_t); break;
    case GCOLL_UINT32: REF(uint32_t); break;
    case GCOLL_INT64: REF(int64_t); break;
    case GCOLL_UINT64: REF(uint64_t); break;
    case GCOLL_BOOL: ((uint8_t *)r)[i] = ref_bool(((const uint8_t *)x)[i], ((const uint8_t *)y)[i], op); break;
    default: fail();
    }
    /* clang-format on */
#undef REF
}

/* Random bit patterns (so sums and products wrap), every op, both kernel paths. */
static void test_int_types(void **state)
{
    (void)state;
    static const gcoll_dtype_t ints[] = {GCOLL_BOOL,  GCOLL_INT8,   GCOLL_UINT8, GCOLL_INT16,
                                         GCOLL_INT32, GCOLL_UINT32, GCOLL_INT64, GCOLL_UINT64};
    enum { N = 1037 };
    static uint8_t a[N * 8], b[N * 8], want[N * 8];
    uint64_t seed = 42;
    for (int scalar = 0; scalar < 2; scalar++) {
        int old = gcoll_reduce_force_scalar(scalar);
        for (size_t d = 0; d < sizeof(ints) / sizeof(ints[0]); d++) {
            size_t esz = gcoll_dtype_size(ints[d]);
            for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++) {
                if (gcoll_reduce_check(ints[d], all_ops[o]))
                    continue;
                for (size_t k = 0; k < N * esz; k++) {
                    a[k] = (uint8_t)lcg(&seed);
                    b[k] = (uint8_t)lcg(&seed);
                    if (ints[d] == GCOLL_BOOL) { /* many zeros; true is any non-zero byte */
                        a[k] = k % 3 == 0 ? 0 : a[k];
                        b[k] = k % 5 == 1 ? 0 : b[k];
                    }
                }
                for (size_t i = 0; i < N; i++)
                    ref_int(want, a, b, i, ints[d], all_ops[o]);
                gcoll_reduce_local(a, b, N, ints[d], all_ops[o]);
                if (memcmp(a, want, N * esz) != 0)
                    fail_msg("%s %s scalar=%d differs from the reference",
                             gcoll_dtype_name(ints[d]), gcoll_op_name(all_ops[o]), scalar);
            }
        }
        gcoll_reduce_force_scalar(old);
    }
    /* AVG: the wrapped sum divided, truncated toward zero */
    int8_t i8[2] = {-7, 100};
    uint8_t u8[1] = {255};
    uint64_t u64[1] = {UINT64_MAX};
    gcoll_reduce_finish(i8, 2, GCOLL_INT8, GCOLL_AVG, 2);
    gcoll_reduce_finish(u8, 1, GCOLL_UINT8, GCOLL_AVG, 2);
    gcoll_reduce_finish(u64, 1, GCOLL_UINT64, GCOLL_AVG, 3);
    assert_true(i8[0] == -3 && i8[1] == 50 && u8[0] == 127 && u64[0] == UINT64_MAX / 3);
}

/* fp8 decoding from the format's definition (OFP8 v1.0): value = (-1)^s * 2^(e-bias) *
 * (1 + m/2^M), subnormals 2^(1-bias) * m/2^M. */
static double fp8_value(uint8_t c, int e4m3)
{
    int M = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
    int s = c >> 7, e = (c >> M) & ((1 << (7 - M)) - 1), m = c & ((1 << M) - 1);
    double v;
    if (e4m3 && e == emax && m == (1 << M) - 1)
        return NAN;
    if (!e4m3 && e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m / (1 << M), 1 - bias);
    else
        v = ldexp(1.0 + (double)m / (1 << M), e - bias);
    return s ? -v : v;
}

/* Nearest code to r by search over every finite code, ties to the even code; beyond the
 * largest finite value by at least half an ulp: E4M3 NaN ("fn"), E5M2 infinity. */
static uint8_t fp8_nearest(double r, int e4m3)
{
    if (isnan(r))
        return 0x7f;
    uint8_t sign = signbit(r) ? 0x80 : 0;
    double x = fabs(r);
    if (e4m3 ? x > 464.0 : x >= 61440.0)
        return (uint8_t)(sign | (e4m3 ? 0x7f : 0x7c));
    int best = 0;
    for (int c = 1; c <= (e4m3 ? 0x7e : 0x7b); c++) {
        double dc = fabs(fp8_value((uint8_t)c, e4m3) - x),
               db = fabs(fp8_value((uint8_t)best, e4m3) - x);
        if (dc < db || (dc == db && c % 2 == 0))
            best = c;
    }
    return (uint8_t)(sign | best);
}

static int fp8_same(uint8_t got, uint8_t want, int e4m3)
{
    return got == want || (isnan(fp8_value(got, e4m3)) && isnan(fp8_value(want, e4m3)));
}

/* Every pair of codes (65536 elements) for every op, both formats and both kernel paths,
 * against the exact result (double holds every sum and product of two fp8 values exactly)
 * rounded once to the nearest code. MIN and MAX keep the first operand if one is NaN. */
static void test_fp8_kernels(void **state)
{
    (void)state;
    enum { N = 65536 };
    static uint8_t a[N], b[N], a0[N];
    for (int e4m3 = 0; e4m3 < 2; e4m3++) {
        gcoll_dtype_t dt = e4m3 ? GCOLL_FLOAT8_E4M3 : GCOLL_FLOAT8_E5M2;
        for (int scalar = 0; scalar < 2; scalar++) {
            int old = gcoll_reduce_force_scalar(scalar);
            for (size_t o = 0; o < 5; o++) {
                gcoll_op_t op = all_ops[o];
                for (int i = 0; i < N; i++) {
                    a[i] = a0[i] = (uint8_t)(i >> 8);
                    b[i] = (uint8_t)i;
                }
                gcoll_reduce_local(a, b, N, dt, op);
                for (int i = 0; i < N; i++) {
                    double x = fp8_value(a0[i], e4m3), y = fp8_value(b[i], e4m3);
                    double r = op == GCOLL_PROD  ? x * y
                               : op == GCOLL_MIN ? (y < x ? y : x)
                               : op == GCOLL_MAX ? (y > x ? y : x)
                                                 : x + y;
                    uint8_t want = (op == GCOLL_MIN || op == GCOLL_MAX) && isnan(x)
                                       ? a0[i]
                                       : fp8_nearest(r, e4m3);
                    if (!fp8_same(a[i], want, e4m3))
                        fail_msg("%s %s scalar=%d: %02x op %02x = %02x, want %02x",
                                 gcoll_dtype_name(dt), gcoll_op_name(op), scalar, a0[i], b[i], a[i],
                                 want);
                }
            }
            gcoll_reduce_force_scalar(old);
        }
        /* AVG's division: x / n in fp32 cannot land on a midpoint of fp8 for n = 3, 5 */
        for (int n = 3; n <= 5; n += 2) {
            for (int c = 0; c < 256; c++) {
                uint8_t v = (uint8_t)c;
                gcoll_reduce_finish(&v, 1, dt, GCOLL_AVG, n);
                if (!fp8_same(v, fp8_nearest(fp8_value((uint8_t)c, e4m3) / n, e4m3), e4m3))
                    fail_msg("%s avg of %02x over %d = %02x", gcoll_dtype_name(dt), c, n, v);
            }
        }
    }
}

static void test_fp8_conversions(void **state)
{
    (void)state;
    assert_int_equal(gcoll_f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(gcoll_f32_to_e4m3(464.0f), 0x7e); /* tie, to the even 448 */
    assert_int_equal(gcoll_f32_to_e4m3(464.5f), 0x7f); /* beyond: NaN, no infinity */
    assert_int_equal(gcoll_f32_to_e4m3(-INFINITY), 0xff);
    assert_int_equal(gcoll_f32_to_e4m3(0x1p-9f), 0x01);
    assert_int_equal(gcoll_f32_to_e4m3(0x1p-10f), 0x00); /* tie, to even 0 */
    assert_int_equal(gcoll_f32_to_e4m3(0x3p-10f), 0x02); /* tie, to even 2 */
    assert_int_equal(gcoll_f32_to_e4m3(-0x1p-6f), 0x88); /* smallest normal */
    assert_int_equal(gcoll_f32_to_e5m2(57344.0f), 0x7b);
    assert_int_equal(gcoll_f32_to_e5m2(61439.0f), 0x7b);
    assert_int_equal(gcoll_f32_to_e5m2(61440.0f), 0x7c); /* tie, to even: infinity */
    assert_int_equal(gcoll_f32_to_e5m2(-INFINITY), 0xfc);
    assert_int_equal(gcoll_f32_to_e5m2(0x1p-16f), 0x01);
    assert_int_equal(gcoll_f32_to_e5m2(0x1p-17f), 0x00);
    assert_true(isnan(gcoll_e5m2_to_f32(gcoll_f32_to_e5m2(NAN))));
    assert_true(isnan(gcoll_e4m3_to_f32(gcoll_f32_to_e4m3(-NAN))));
    for (int c = 0; c < 256; c++) { /* decoding is exact and every code round-trips */
        for (int e4m3 = 0; e4m3 < 2; e4m3++) {
            float f = e4m3 ? gcoll_e4m3_to_f32((uint8_t)c) : gcoll_e5m2_to_f32((uint8_t)c);
            double v = fp8_value((uint8_t)c, e4m3);
            if (isnan(v)) {
                assert_true(isnan(f));
                continue;
            }
            assert_true((double)f == v && !!signbit(f) == !!signbit(v));
            assert_int_equal(e4m3 ? gcoll_f32_to_e4m3(f) : gcoll_f32_to_e5m2(f), c);
        }
    }
    /* random floats over the whole range of both formats against the nearest-code search */
    uint64_t seed = 7;
    for (int k = 0; k < 20000; k++) {
        uint32_t u = (uint32_t)lcg(&seed);
        float f = ldexpf((float)(u & 0xffffff) / 16777216.0f, (int)((u >> 24) % 44) - 26);
        f = u >> 31 ? -f : f;
        assert_int_equal(gcoll_f32_to_e4m3(f), fp8_nearest(f, 1));
        assert_int_equal(gcoll_f32_to_e5m2(f), fp8_nearest(f, 0));
    }
}

static void test_op_dtype_pairs(void **state)
{
    (void)state;
    assert_non_null(gcoll_reduce_check(GCOLL_FLOAT32, GCOLL_BAND));
    assert_non_null(gcoll_reduce_check(GCOLL_FLOAT8_E4M3, GCOLL_BXOR));
    assert_non_null(gcoll_reduce_check(GCOLL_BFLOAT16, GCOLL_BOR));
    assert_non_null(gcoll_reduce_check(GCOLL_BOOL, GCOLL_AVG));
    assert_null(gcoll_reduce_check(GCOLL_BOOL, GCOLL_SUM));
    assert_null(gcoll_reduce_check(GCOLL_UINT8, GCOLL_BXOR));
    assert_null(gcoll_reduce_check(GCOLL_FLOAT8_E5M2, GCOLL_AVG));
    assert_string_equal(gcoll_dtype_name(GCOLL_FLOAT8_E4M3), "float8_e4m3");
    assert_string_equal(gcoll_op_name(GCOLL_BXOR), "bxor");
    assert_int_equal(gcoll_dtype_size(GCOLL_UINT64), 8);
    assert_int_equal(gcoll_dtype_size(GCOLL_BOOL), 1);
    /* the first values stay where they were (ABI) */
    assert_int_equal(GCOLL_INT64, 5);
    assert_int_equal(GCOLL_PROD, 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_dispatched),
        cmocka_unit_test(test_kernels_scalar),
        cmocka_unit_test(test_f16_rounding_paths_agree),
        cmocka_unit_test(test_avg_finish),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_reduce_rev),
        cmocka_unit_test(test_int_types),
        cmocka_unit_test(test_fp8_kernels),
        cmocka_unit_test(test_fp8_conversions),
        cmocka_unit_test(test_op_dtype_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
