/* reduce.c: reduction kernels. Plain loops that gcc vectorizes at -O3, cloned for AVX2 with
 * runtime dispatch (target_clones); fp16 uses F16C conversions where the CPU has them. */
#include "reduce.h"

#include <stdint.h>
#include <string.h>

#include "half.h"

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

/* One kernel per (type, op): the loop body is a single expression so it vectorizes. */
#define DEFINE_KERNEL(name, T, OP)                                                        \
    CLONES static void name(T *restrict d, const T *restrict s, size_t n)                 \
    {                                                                                     \
        for (size_t i = 0; i < n; i++)                                                    \
            d[i] = OP(d[i], s[i]);                                                        \
    }

#define DEFINE_TYPE(suffix, T)                                                            \
    DEFINE_KERNEL(sum_##suffix, T, OP_SUM)                                                \
    DEFINE_KERNEL(prod_##suffix, T, OP_PROD)                                              \
    DEFINE_KERNEL(min_##suffix, T, OP_MIN)                                                \
    DEFINE_KERNEL(max_##suffix, T, OP_MAX)                                                \
    static void reduce_##suffix(T *d, const T *s, size_t n, gcoll_op_t op)                \
    {                                                                                     \
        switch (op) {                                                                     \
        case GCOLL_SUM:                                                                   \
        case GCOLL_AVG: sum_##suffix(d, s, n); break;                                     \
        case GCOLL_PROD: prod_##suffix(d, s, n); break;                                   \
        case GCOLL_MIN: min_##suffix(d, s, n); break;                                     \
        case GCOLL_MAX: max_##suffix(d, s, n); break;                                     \
        }                                                                                 \
    }

DEFINE_TYPE(f32, float)
DEFINE_TYPE(f64, double)
DEFINE_TYPE(i32, int32_t)
DEFINE_TYPE(i64, int64_t)

static inline float apply_f32(float a, float b, gcoll_op_t op)
{
    switch (op) {
    case GCOLL_SUM:
    case GCOLL_AVG: return a + b;
    case GCOLL_PROD: return a * b;
    case GCOLL_MIN: return OP_MIN(a, b);
    case GCOLL_MAX: return OP_MAX(a, b);
    }
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

#define DEFINE_BF16(name, OP)                                                             \
    CLONES static void name(uint16_t *restrict d, const uint16_t *restrict s, size_t n)   \
    {                                                                                     \
        for (size_t i = 0; i < n; i++)                                                    \
            d[i] = bf16_round(OP(gcoll_bf16_to_f32(d[i]), gcoll_bf16_to_f32(s[i])));      \
    }
DEFINE_BF16(sum_bf16, OP_SUM)
DEFINE_BF16(prod_bf16, OP_PROD)
DEFINE_BF16(min_bf16, OP_MIN)
DEFINE_BF16(max_bf16, OP_MAX)

static void reduce_bf16(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op)
{
    switch (op) {
    case GCOLL_SUM:
    case GCOLL_AVG: sum_bf16(d, s, n); break;
    case GCOLL_PROD: prod_bf16(d, s, n); break;
    case GCOLL_MIN: min_bf16(d, s, n); break;
    case GCOLL_MAX: max_bf16(d, s, n); break;
    }
}

static void reduce_f16_scalar(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op)
{
    for (size_t i = 0; i < n; i++)
        d[i] = gcoll_f32_to_f16(apply_f32(gcoll_f16_to_f32(d[i]), gcoll_f16_to_f32(s[i]), op));
}

#ifdef GCOLL_X86
__attribute__((target("avx2,f16c"))) static void reduce_f16_f16c(uint16_t *d, const uint16_t *s,
                                                                  size_t n, gcoll_op_t op)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        __m256 r;
        switch (op) {
        case GCOLL_PROD: r = _mm256_mul_ps(a, b); break;
        case GCOLL_MIN: r = _mm256_min_ps(b, a); break;
        case GCOLL_MAX: r = _mm256_max_ps(b, a); break;
        default: r = _mm256_add_ps(a, b); break;
        }
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    reduce_f16_scalar(d + i, s + i, n - i, op);
}
#endif

static void reduce_f16(uint16_t *d, const uint16_t *s, size_t n, gcoll_op_t op)
{
#ifdef GCOLL_X86
    if (!force_scalar && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        reduce_f16_f16c(d, s, n, op);
        return;
    }
#endif
    reduce_f16_scalar(d, s, n, op);
}

/* Portable reference used when force_scalar is set (tests compare both paths). */
static void reduce_scalar(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case GCOLL_FLOAT32: ((float *)dst)[i] = apply_f32(((float *)dst)[i], ((const float *)src)[i], op); break;
        case GCOLL_FLOAT64: {
            double a = ((double *)dst)[i], b = ((const double *)src)[i];
            ((double *)dst)[i] = op == GCOLL_PROD ? a * b : op == GCOLL_MIN ? OP_MIN(a, b)
                                 : op == GCOLL_MAX ? OP_MAX(a, b) : a + b;
            break;
        }
        case GCOLL_INT32: {
            int32_t a = ((int32_t *)dst)[i], b = ((const int32_t *)src)[i];
            ((int32_t *)dst)[i] = op == GCOLL_PROD ? (int32_t)((uint32_t)a * (uint32_t)b)
                                  : op == GCOLL_MIN ? OP_MIN(a, b) : op == GCOLL_MAX ? OP_MAX(a, b)
                                  : (int32_t)((uint32_t)a + (uint32_t)b);
            break;
        }
        case GCOLL_INT64: {
            int64_t a = ((int64_t *)dst)[i], b = ((const int64_t *)src)[i];
            ((int64_t *)dst)[i] = op == GCOLL_PROD ? (int64_t)((uint64_t)a * (uint64_t)b)
                                  : op == GCOLL_MIN ? OP_MIN(a, b) : op == GCOLL_MAX ? OP_MAX(a, b)
                                  : (int64_t)((uint64_t)a + (uint64_t)b);
            break;
        }
        case GCOLL_FLOAT16: reduce_f16_scalar((uint16_t *)dst + i, (const uint16_t *)src + i, 1, op); break;
        case GCOLL_BFLOAT16: {
            uint16_t *d = (uint16_t *)dst + i;
            *d = gcoll_f32_to_bf16(apply_f32(gcoll_bf16_to_f32(*d), gcoll_bf16_to_f32(((const uint16_t *)src)[i]), op));
            break;
        }
        }
    }
}

void gcoll_reduce(void *dst, const void *src, size_t n, gcoll_dtype_t dtype, gcoll_op_t op)
{
    if (force_scalar) {
        reduce_scalar(dst, src, n, dtype, op);
        return;
    }
    switch (dtype) {
    case GCOLL_FLOAT32: reduce_f32(dst, src, n, op); break;
    case GCOLL_FLOAT64: reduce_f64(dst, src, n, op); break;
    case GCOLL_INT32: reduce_i32(dst, src, n, op); break;
    case GCOLL_INT64: reduce_i64(dst, src, n, op); break;
    case GCOLL_FLOAT16: reduce_f16(dst, src, n, op); break;
    case GCOLL_BFLOAT16: reduce_bf16(dst, src, n, op); break;
    }
}

void gcoll_reduce_finish(void *buf, size_t n, gcoll_dtype_t dtype, gcoll_op_t op, int nranks)
{
    if (op != GCOLL_AVG || nranks == 1)
        return;
    for (size_t i = 0; i < n; i++) {
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
        case GCOLL_BFLOAT16: {
            uint16_t *h = (uint16_t *)buf + i;
            *h = gcoll_f32_to_bf16(gcoll_bf16_to_f32(*h) / (float)nranks);
            break;
        }
        }
    }
}
