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
        }                                                                                 \
    }

/* clang-format on */
DEFINE_TYPE(f32, float)
DEFINE_TYPE(f64, double)
DEFINE_TYPE(i32, int32_t)
DEFINE_TYPE(i64, int64_t)

static inline float apply_f32(float a, float b, gcoll_op_t op)
{
    /* clang-format off */
    switch (op) {
    case GCOLL_SUM:
    case GCOLL_AVG: return a + b;
    case GCOLL_PROD: return a * b;
    case GCOLL_MIN: return OP_MIN(a, b);
    case GCOLL_MAX: return OP_MAX(a, b);
    }
    /* clang-format on */
    return a;
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
    }
    /* clang-format on */
}

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

/* Portable reference used when force_scalar is set (tests compare both paths). Element
 * by element, so the reversed order just swaps the two values read. */
static void reduce_scalar(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op,
                          int rev)
{
#define LOAD2(T)                                                                                   \
    T a = ((T *)dst)[i], b = ((const T *)src)[i];                                                  \
    if (rev) {                                                                                     \
        T t_ = a;                                                                                  \
        a = b;                                                                                     \
        b = t_;                                                                                    \
    }
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case GCOLL_FLOAT32: {
            LOAD2(float)
            ((float *)dst)[i] = apply_f32(a, b, op);
            break;
        }
        case GCOLL_FLOAT64: {
            LOAD2(double)
            ((double *)dst)[i] = op == GCOLL_PROD  ? a * b
                                 : op == GCOLL_MIN ? OP_MIN(a, b)
                                 : op == GCOLL_MAX ? OP_MAX(a, b)
                                                   : a + b;
            break;
        }
        case GCOLL_INT32: {
            LOAD2(int32_t)
            ((int32_t *)dst)[i] = op == GCOLL_PROD  ? (int32_t)((uint32_t)a * (uint32_t)b)
                                  : op == GCOLL_MIN ? OP_MIN(a, b)
                                  : op == GCOLL_MAX ? OP_MAX(a, b)
                                                    : (int32_t)((uint32_t)a + (uint32_t)b);
            break;
        }
        case GCOLL_INT64: {
            LOAD2(int64_t)
            ((int64_t *)dst)[i] = op == GCOLL_PROD  ? (int64_t)((uint64_t)a * (uint64_t)b)
                                  : op == GCOLL_MIN ? OP_MIN(a, b)
                                  : op == GCOLL_MAX ? OP_MAX(a, b)
                                                    : (int64_t)((uint64_t)a + (uint64_t)b);
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
        }
    }
#undef LOAD2
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
    case GCOLL_INT32: reduce_i32(dst, src, n, op, rev); break;
    case GCOLL_INT64: reduce_i64(dst, src, n, op, rev); break;
    case GCOLL_FLOAT16: reduce_f16(dst, src, n, op, rev); break;
    case GCOLL_BFLOAT16: reduce_bf16(dst, src, n, op, rev); break;
    }
    /* clang-format on */
}

void gcoll_reduce(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    reduce_any(dst, src, n, dtype, op, 0);
}

void gcoll_reduce_rev(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    reduce_any(dst, src, n, dtype, op, 1);
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
        case GCOLL_INT32: ((int32_t *)buf)[i] /= nranks; break;
        case GCOLL_INT64: ((int64_t *)buf)[i] /= nranks; break;
        case GCOLL_FLOAT16: {
            uint16_t *h = (uint16_t *)buf + i;
            *h = gcoll_f32_to_f16(gcoll_f16_to_f32(*h) / (float)nranks);
            break;
        }
        /* clang-format on */
        case GCOLL_BFLOAT16: {
            uint16_t *h = (uint16_t *)buf + i;
            *h = gcoll_f32_to_bf16(gcoll_bf16_to_f32(*h) / (float)nranks);
            break;
        }
        }
    }
}
