/* reduce.c: reduction kernels. Plain loops that gcc vectorizes at -O3, cloned for AVX2 with
 * runtime dispatch (target_clones); fp16 uses F16C conversions where the CPU has them. */
#include "collectives/reduce.h"

#include <stdint.h>
#include <string.h>

#include "base/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GCOLL_X86 1
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

static int force_scalar;

int gcoll_reduce_force_scalar(int on)
{
    int old = force_scalar;
    force_scalar = on;
    return old;
}

#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MIN(a, b) ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) ? (b) : (a))

/* One kernel per (type, op, operand order): the loop body is a single expression so it
 * vectorizes. The _rev kernels compute s op d (see gcoll_reduce_rev). */
#define DEFINE_KERNEL(name, T, OP)                                                                 \
    CLONES static void name(T *restrict d, const T *restrict s, size_t n)                          \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = OP(d[i], s[i]);                                                                 \
    }                                                                                              \
    CLONES static void name##_rev(T *restrict d, const T *restrict s, size_t n)                    \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = OP(s[i], d[i]);                                                                 \
    }

/* clang-format off */
#define DEFINE_TYPE(suffix, T)                                                            \
    DEFINE_KERNEL(sum_##suffix, T, OP_SUM)                                                \
    DEFINE_KERNEL(prod_##suffix, T, OP_PROD)                                              \
    DEFINE_KERNEL(min_##suffix, T, OP_MIN)                                                \
    DEFINE_KERNEL(max_##suffix, T, OP_MAX)                                                \
    static void reduce_##suffix(T *d, const T *s, size_t n, gcoll_op_t op, int rev)       \
    {                                                                                     \
        switch (op) {                                                                     \
        case GCOLL_SUM:                                                                   \
        case GCOLL_AVG: (rev ? sum_##suffix##_rev : sum_##suffix)(d, s, n); break;        \
        case GCOLL_PROD: (rev ? prod_##suffix##_rev : prod_##suffix)(d, s, n); break;     \
        case GCOLL_MIN: (rev ? min_##suffix##_rev : min_##suffix)(d, s, n); break;        \
        case GCOLL_MAX: (rev ? max_##suffix##_rev : max_##suffix)(d, s, n); break;        \
        default: break;                                                                   \
        }                                                                                 \
    }

/* clang-format on */
DEFINE_TYPE(f32, float)
DEFINE_TYPE(f64, double)

/* Integers: SUM and PROD in the unsigned type U (at least as wide as unsigned int, so no
 * promotion to a signed int can overflow) wrap modulo 2^bits as the type does; MIN and MAX
 * compare in T. Every op is commutative, so one kernel serves both operand orders. */
#define DEFINE_IKERNEL(name, T, EXPR)                                                              \
    CLONES static void name(T *restrict d, const T *restrict s, size_t n)                          \
    {                                                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a = d[i], b = s[i];                                                                  \
            d[i] = (T)(EXPR);                                                                      \
        }                                                                                          \
    }
/* clang-format off */
#define DEFINE_INT(sfx, T, U)                                                              \
    DEFINE_IKERNEL(sum_##sfx, T, (U)a + (U)b)                                              \
    DEFINE_IKERNEL(prod_##sfx, T, (U)a * (U)b)                                             \
    DEFINE_IKERNEL(min_##sfx, T, OP_MIN(a, b))                                             \
    DEFINE_IKERNEL(max_##sfx, T, OP_MAX(a, b))                                             \
    DEFINE_IKERNEL(band_##sfx, T, a & b)                                                   \
    DEFINE_IKERNEL(bor_##sfx, T, a | b)                                                    \
    DEFINE_IKERNEL(bxor_##sfx, T, a ^ b)                                                   \
    static void reduce_##sfx(T *d, const T *s, size_t n, gcoll_op_t op)                    \
    {                                                                                      \
        switch (op) {                                                                      \
        case GCOLL_SUM:                                                                    \
        case GCOLL_AVG: sum_##sfx(d, s, n); break;                                         \
        case GCOLL_PROD: prod_##sfx(d, s, n); break;                                       \
        case GCOLL_MIN: min_##sfx(d, s, n); break;                                         \
        case GCOLL_MAX: max_##sfx(d, s, n); break;                                         \
        case GCOLL_BAND: band_##sfx(d, s, n); break;                                       \
        case GCOLL_BOR: bor_##sfx(d, s, n); break;                                         \
        case GCOLL_BXOR: bxor_##sfx(d, s, n); break;                                       \
        }                                                                                  \
    }
/* clang-format on */
DEFINE_INT(i8, int8_t, uint32_t)
DEFINE_INT(u8, uint8_t, uint32_t)
DEFINE_INT(i16, int16_t, uint32_t)
DEFINE_INT(i32, int32_t, uint32_t)
DEFINE_INT(u32, uint32_t, uint32_t)
DEFINE_INT(i64, int64_t, uint64_t)
DEFINE_INT(u64, uint64_t, uint64_t)

/* bool: any non-zero byte is true, results are 0 or 1. SUM/MAX/BOR are or, PROD/MIN/BAND
 * and, as PyTorch maps them. */
DEFINE_IKERNEL(or_bool, uint8_t, (a | b) != 0)
DEFINE_IKERNEL(and_bool, uint8_t, (a != 0) & (b != 0))
DEFINE_IKERNEL(xor_bool, uint8_t, (a != 0) ^ (b != 0))

static void reduce_bool(uint8_t *d, const uint8_t *s, size_t n, gcoll_op_t op)
{
    /* clang-format off */
    switch (op) {
    case GCOLL_PROD: case GCOLL_MIN: case GCOLL_BAND: and_bool(d, s, n); break;
    case GCOLL_BXOR: xor_bool(d, s, n); break;
    default: or_bool(d, s, n); break;
    }
    /* clang-format on */
}

static inline float apply_f32(float a, float b, gcoll_op_t op)
{
    /* clang-format off */
    switch (op) {
    case GCOLL_SUM:
    case GCOLL_AVG: return a + b;
    case GCOLL_PROD: return a * b;
    case GCOLL_MIN: return OP_MIN(a, b);
    case GCOLL_MAX: return OP_MAX(a, b);
    default: return a; /* bitwise ops are refused for floats (gcoll_reduce_check) */
    }
    /* clang-format on */
}

/* Branch-free bf16 rounding so the loop vectorizes; NaN stays NaN. */
static inline uint16_t bf16_round(float f)
{
    uint32_t u = gcoll_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

#define DEFINE_BF16(name, OP)                                                                      \
    CLONES static void name(uint16_t *restrict d, const uint16_t *restrict s, size_t n)            \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = bf16_round(OP(gcoll_bf16_to_f32(d[i]), gcoll_bf16_to_f32(s[i])));               \
    }                                                                                              \
    CLONES static void name##_rev(uint16_t *restrict d, const uint16_t *restrict s, size_t n)      \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = bf16_round(OP(gcoll_bf16_to_f32(s[i]), gcoll_bf16_to_f32(d[i])));               \
    }
DEFINE_BF16(sum_bf16, OP_SUM)
DEFINE_BF16(prod_bf16, OP_PROD)
DEFINE_BF16(min_bf16, OP_MIN)
DEFINE_BF16(max_bf16, OP_MAX)

static void reduce_bf16(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op, int rev)
{
    /* clang-format off */
    switch (op) {
    case GCOLL_SUM:
    case GCOLL_AVG: (rev ? sum_bf16_rev : sum_bf16)(d, s, n); break;
    case GCOLL_PROD: (rev ? prod_bf16_rev : prod_bf16)(d, s, n); break;
    case GCOLL_MIN: (rev ? min_bf16_rev : min_bf16)(d, s, n); break;
    case GCOLL_MAX: (rev ? max_bf16_rev : max_bf16)(d, s, n); break;
    default: break;
    }
    /* clang-format on */
}

/* fp8 decoding tables (exact, from half.h's decoders), filled before main: a load from a
 * 1 KiB table is cheaper than the branch-free decode in the loop. */
static float tab_e4m3[256], tab_e5m2[256];
__attribute__((constructor)) static void fp8_tables(void)
{
    for (int c = 0; c < 256; c++) {
        tab_e4m3[c] = gcoll_e4m3_to_f32((uint8_t)c);
        tab_e5m2[c] = gcoll_e5m2_to_f32((uint8_t)c);
    }
}

/* fp8: both operands decoded to fp32 (exact), combined, rounded to nearest even once. */
#define DEFINE_FP8(name, FMT, OP)                                                                  \
    CLONES static void name(uint8_t *restrict d, const uint8_t *restrict s, size_t n)              \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = gcoll_f32_to_##FMT(OP(tab_##FMT[d[i]], tab_##FMT[s[i]]));                       \
    }                                                                                              \
    CLONES static void name##_rev(uint8_t *restrict d, const uint8_t *restrict s, size_t n)        \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = gcoll_f32_to_##FMT(OP(tab_##FMT[s[i]], tab_##FMT[d[i]]));                       \
    }
/* clang-format off */
#define DEFINE_FP8_TYPE(FMT)                                                                \
    DEFINE_FP8(sum_##FMT, FMT, OP_SUM)                                                      \
    DEFINE_FP8(prod_##FMT, FMT, OP_PROD)                                                    \
    DEFINE_FP8(min_##FMT, FMT, OP_MIN)                                                      \
    DEFINE_FP8(max_##FMT, FMT, OP_MAX)                                                      \
    static void reduce_##FMT(uint8_t *d, const uint8_t *s, size_t n, gcoll_op_t op, int rev) \
    {                                                                                       \
        switch (op) {                                                                       \
        case GCOLL_PROD: (rev ? prod_##FMT##_rev : prod_##FMT)(d, s, n); break;             \
        case GCOLL_MIN: (rev ? min_##FMT##_rev : min_##FMT)(d, s, n); break;                \
        case GCOLL_MAX: (rev ? max_##FMT##_rev : max_##FMT)(d, s, n); break;                \
        default: (rev ? sum_##FMT##_rev : sum_##FMT)(d, s, n); break;                       \
        }                                                                                   \
    }
/* clang-format on */
DEFINE_FP8_TYPE(e4m3)
DEFINE_FP8_TYPE(e5m2)

static void reduce_f16_scalar(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op, int rev)
{
    for (size_t i = 0; i < n; i++) {
        float x = gcoll_f16_to_f32(d[i]), y = gcoll_f16_to_f32(s[i]);
        d[i] = gcoll_f32_to_f16(rev ? apply_f32(y, x, op) : apply_f32(x, y, op));
    }
}

#ifdef GCOLL_X86
__attribute__((target("avx2,f16c"))) static void reduce_f16_f16c(uint16_t *d, const uint16_t *s,
                                                                 size_t n, gcoll_op_t op, int rev)
{
    size_t i = 0;
    const uint16_t *first = rev ? s : d, *second = rev ? d : s;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(first + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(second + i)));
        __m256 r;
        /* clang-format off */
        switch (op) {
        case GCOLL_PROD: r = _mm256_mul_ps(a, b); break;
        case GCOLL_MIN: r = _mm256_min_ps(b, a); break;
        case GCOLL_MAX: r = _mm256_max_ps(b, a); break;
        default: r = _mm256_add_ps(a, b); break;
        }
        /* clang-format on */
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    reduce_f16_scalar(d + i, s + i, n - i, op, rev);
}
#endif

static void reduce_f16(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op, int rev)
{
#ifdef GCOLL_X86
    if (!force_scalar && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        reduce_f16_f16c(d, s, n, op, rev);
        return;
    }
#endif
    reduce_f16_scalar(d, s, n, op, rev);
}

/* Integers in the portable path: loaded as 64 bits (sign-extended for signed types),
 * combined modulo 2^64 and truncated on store, which is the type's wrapping result. */
static int is_signed_int(gcoll_dtype_t d)
{
    return d == GCOLL_INT8 || d == GCOLL_INT16 || d == GCOLL_INT32 || d == GCOLL_INT64;
}

static uint64_t load_int(const void *p, size_t i, gcoll_dtype_t d)
{
    /* clang-format off */
    switch (d) {
    case GCOLL_INT8: return (uint64_t)(int64_t)((const int8_t *)p)[i];
    case GCOLL_INT16: return (uint64_t)(int64_t)((const int16_t *)p)[i];
    case GCOLL_INT32: return (uint64_t)(int64_t)((const int32_t *)p)[i];
    case GCOLL_INT64: return (uint64_t)((const int64_t *)p)[i];
    case GCOLL_UINT32: return ((const uint32_t *)p)[i];
    case GCOLL_UINT64: return ((const uint64_t *)p)[i];
    default: return ((const uint8_t *)p)[i]; /* uint8, bool */
    }
    /* clang-format on */
}

static void store_int(void *p, size_t i, gcoll_dtype_t d, uint64_t v)
{
    size_t esz = gcoll_dtype_size(d);
    uint8_t *b = (uint8_t *)p + i * esz;
    for (size_t k = 0; k < esz; k++) /* little-endian truncation, no signed conversion */
        b[k] = (uint8_t)(v >> (8 * k));
}

static uint64_t apply_int(uint64_t a, uint64_t b, gcoll_op_t op, gcoll_dtype_t d)
{
    if (d == GCOLL_BOOL) {
        int x = a != 0, y = b != 0;
        /* clang-format off */
        switch (op) {
        case GCOLL_PROD: case GCOLL_MIN: case GCOLL_BAND: return (uint64_t)(x & y);
        case GCOLL_BXOR: return (uint64_t)(x ^ y);
        default: return (uint64_t)(x | y);
        }
        /* clang-format on */
    }
    int lt = is_signed_int(d) ? (int64_t)b < (int64_t)a : b < a;
    /* clang-format off */
    switch (op) {
    case GCOLL_PROD: return a * b;
    case GCOLL_MIN: return lt ? b : a;
    case GCOLL_MAX: return lt ? a : b;
    case GCOLL_BAND: return a & b;
    case GCOLL_BOR: return a | b;
    case GCOLL_BXOR: return a ^ b;
    default: return a + b;
    }
    /* clang-format on */
}

/* Portable reference used when force_scalar is set (tests compare both paths). Element
 * by element, so the reversed order just swaps the two values read. */
static void reduce_scalar(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op,
                          int rev)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case GCOLL_FLOAT32: {
            float a = ((float *)dst)[i], b = ((const float *)src)[i];
            ((float *)dst)[i] = rev ? apply_f32(b, a, op) : apply_f32(a, b, op);
            break;
        }
        case GCOLL_FLOAT64: {
            double a = ((double *)dst)[i], b = ((const double *)src)[i];
            if (rev) {
                double t = a;
                a = b;
                b = t;
            }
            ((double *)dst)[i] = op == GCOLL_PROD  ? a * b
                                 : op == GCOLL_MIN ? OP_MIN(a, b)
                                 : op == GCOLL_MAX ? OP_MAX(a, b)
                                                   : a + b;
            break;
        }
        case GCOLL_FLOAT16:
            reduce_f16_scalar((uint16_t *)dst + i, (const uint16_t *)src + i, 1, op, rev);
            break;
        case GCOLL_BFLOAT16: {
            uint16_t *d = (uint16_t *)dst + i;
            float a = gcoll_bf16_to_f32(*d), b = gcoll_bf16_to_f32(((const uint16_t *)src)[i]);
            *d = gcoll_f32_to_bf16(rev ? apply_f32(b, a, op) : apply_f32(a, b, op));
            break;
        }
        case GCOLL_FLOAT8_E4M3: {
            uint8_t *d = (uint8_t *)dst + i;
            float a = gcoll_e4m3_to_f32(*d), b = gcoll_e4m3_to_f32(((const uint8_t *)src)[i]);
            *d = gcoll_f32_to_e4m3(rev ? apply_f32(b, a, op) : apply_f32(a, b, op));
            break;
        }
        case GCOLL_FLOAT8_E5M2: {
            uint8_t *d = (uint8_t *)dst + i;
            float a = gcoll_e5m2_to_f32(*d), b = gcoll_e5m2_to_f32(((const uint8_t *)src)[i]);
            *d = gcoll_f32_to_e5m2(rev ? apply_f32(b, a, op) : apply_f32(a, b, op));
            break;
        }
        default: /* integers and bool: every op commutes */
            store_int(dst, i, dtype,
                      apply_int(load_int(dst, i, dtype), load_int(src, i, dtype), op, dtype));
            break;
        }
    }
}

static void reduce_any(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op,
                       int rev)
{
    if (force_scalar) {
        reduce_scalar(dst, src, n, dtype, op, rev);
        return;
    }
    /* clang-format off */
    switch (dtype) {
    case GCOLL_FLOAT32: reduce_f32(dst, src, n, op, rev); break;
    case GCOLL_FLOAT64: reduce_f64(dst, src, n, op, rev); break;
    case GCOLL_FLOAT16: reduce_f16(dst, src, n, op, rev); break;
    case GCOLL_BFLOAT16: reduce_bf16(dst, src, n, op, rev); break;
    case GCOLL_FLOAT8_E4M3: reduce_e4m3(dst, src, n, op, rev); break;
    case GCOLL_FLOAT8_E5M2: reduce_e5m2(dst, src, n, op, rev); break;
    case GCOLL_INT32: reduce_i32(dst, src, n, op); break;
    case GCOLL_INT64: reduce_i64(dst, src, n, op); break;
    case GCOLL_BOOL: reduce_bool(dst, src, n, op); break;
    case GCOLL_INT8: reduce_i8(dst, src, n, op); break;
    case GCOLL_UINT8: reduce_u8(dst, src, n, op); break;
    case GCOLL_INT16: reduce_i16(dst, src, n, op); break;
    case GCOLL_UINT32: reduce_u32(dst, src, n, op); break;
    case GCOLL_UINT64: reduce_u64(dst, src, n, op); break;
    }
    /* clang-format on */
}

void gcoll_reduce_local(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    reduce_any(dst, src, n, dtype, op, 0);
}

void gcoll_reduce_rev(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    reduce_any(dst, src, n, dtype, op, 1);
}

static int is_float(gcoll_dtype_t d)
{
    return d == GCOLL_FLOAT32 || d == GCOLL_FLOAT16 || d == GCOLL_BFLOAT16 || d == GCOLL_FLOAT64 ||
           d == GCOLL_FLOAT8_E4M3 || d == GCOLL_FLOAT8_E5M2;
}

const char *gcoll_reduce_check(gcoll_dtype_t dtype, gcoll_op_t op)
{
    if (op == GCOLL_BAND || op == GCOLL_BOR || op == GCOLL_BXOR)
        return is_float(dtype) ? "bitwise ops (band, bor, bxor) take integer or bool dtypes only"
                               : NULL;
    if (op == GCOLL_AVG && dtype == GCOLL_BOOL)
        return "avg is not defined for bool";
    return NULL;
}

void gcoll_reduce_finish(void *buf, size_t n, gcoll_dtype_t dtype, gcoll_op_t op, int nranks)
{
    if (op != GCOLL_AVG || nranks == 1)
        return;
    for (size_t i = 0; i < n; i++) {
        /* clang-format off */
        switch (dtype) {
        case GCOLL_FLOAT32: ((float *)buf)[i] /= (float)nranks; break;
        case GCOLL_FLOAT64: ((double *)buf)[i] /= (double)nranks; break;
        case GCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)(((int8_t *)buf)[i] / nranks); break;
        case GCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / nranks); break;
        case GCOLL_INT16: ((int16_t *)buf)[i] = (int16_t)(((int16_t *)buf)[i] / nranks); break;
        case GCOLL_INT32: ((int32_t *)buf)[i] /= nranks; break;
        case GCOLL_UINT32: ((uint32_t *)buf)[i] /= (uint32_t)nranks; break;
        case GCOLL_INT64: ((int64_t *)buf)[i] /= nranks; break;
        case GCOLL_UINT64: ((uint64_t *)buf)[i] /= (uint64_t)nranks; break;
        case GCOLL_BOOL: break; /* refused by gcoll_reduce_check */
        case GCOLL_FLOAT16: {
            uint16_t *h = (uint16_t *)buf + i;
            *h = gcoll_f32_to_f16(gcoll_f16_to_f32(*h) / (float)nranks);
            break;
        }
        case GCOLL_BFLOAT16: {
            uint16_t *h = (uint16_t *)buf + i;
            *h = gcoll_f32_to_bf16(gcoll_bf16_to_f32(*h) / (float)nranks);
            break;
        }
        case GCOLL_FLOAT8_E4M3: {
            uint8_t *h = (uint8_t *)buf + i;
            *h = gcoll_f32_to_e4m3(gcoll_e4m3_to_f32(*h) / (float)nranks);
            break;
        }
        case GCOLL_FLOAT8_E5M2: {
            uint8_t *h = (uint8_t *)buf + i;
            *h = gcoll_f32_to_e5m2(gcoll_e5m2_to_f32(*h) / (float)nranks);
            break;
        }
        }
        /* clang-format on */
    }
}
