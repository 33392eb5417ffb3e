/* check.c: gcoll-bench's inputs and the independent reference its -c checks against.
 *
 * Inputs are small integers chosen per dtype and op so that every partial result any
 * algorithm forms is exact in the dtype: then the reduction order does not matter and a
 * result is right only when it is bit-equal to the reference, computed here element by
 * element in 64-bit integers (wrapping as the dtype does) or in double. The one exception
 * is AVG of a float type, whose division may be done as a multiplication by 1/n: it is
 * compared within one rounding of the dtype. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/half.h"
#include "bench.h"

typedef enum { K_SIGNED, K_UNSIGNED, K_FLOAT, K_BOOL } kind_t;

static kind_t kind(gcoll_dtype_t d)
{
    switch (d) {
    case GCOLL_INT8:
    case GCOLL_INT16:
    case GCOLL_INT32:
    case GCOLL_INT64:
        return K_SIGNED;
    case GCOLL_UINT8:
    case GCOLL_UINT32:
    case GCOLL_UINT64:
        return K_UNSIGNED;
    case GCOLL_BOOL:
        return K_BOOL;
    default:
        return K_FLOAT;
    }
}

/* Relative spacing of the dtype's floats (one rounding is at most half of it). */
static double eps(gcoll_dtype_t d)
{
    switch (d) {
    case GCOLL_FLOAT16:
        return 0x1p-10;
    case GCOLL_BFLOAT16:
        return 0x1p-7;
    case GCOLL_FLOAT64:
        return 0x1p-52;
    case GCOLL_FLOAT8_E4M3:
        return 0x1p-3;
    case GCOLL_FLOAT8_E5M2:
        return 0x1p-2;
    default:
        return 0x1p-23;
    }
}

/* Rank r's element i. fp8 takes -1, 0, 1 (sums of up to 8 ranks stay exact in E5M2's two
 * mantissa bits); PROD takes +-1 and +-2 (products are powers of two); bool half true. */
static int input(const bench_opts_t *o, int r, size_t i)
{
    int k = (int)((i * 7 + (size_t)r * 3) % 9);
    if (o->dtype == GCOLL_BOOL)
        return k & 1;
    if (o->dtype == GCOLL_FLOAT8_E4M3 || o->dtype == GCOLL_FLOAT8_E5M2)
        return k % 3 - 1;
    if (o->op == GCOLL_PROD && bench_coll_reduces(o->coll)) {
        static const int pv[4] = {1, -1, 2, -2};
        return pv[k % 4];
    }
    return k - 4;
}

/* Stores an integer value (wrapping to the width) or a float value as the dtype does. */
static void put_int(void *b, size_t i, gcoll_dtype_t d, uint64_t v)
{
    switch (d) {
    case GCOLL_INT8:
    case GCOLL_UINT8:
    case GCOLL_BOOL:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case GCOLL_INT16:
        ((uint16_t *)b)[i] = (uint16_t)v;
        break;
    case GCOLL_INT32:
    case GCOLL_UINT32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    default:
        ((uint64_t *)b)[i] = v;
        break;
    }
}

static void put_float(void *b, size_t i, gcoll_dtype_t d, double v)
{
    switch (d) {
    case GCOLL_FLOAT64:
        ((double *)b)[i] = v;
        break;
    case GCOLL_FLOAT16:
        ((uint16_t *)b)[i] = gcoll_f32_to_f16((float)v);
        break;
    case GCOLL_BFLOAT16:
        ((uint16_t *)b)[i] = gcoll_f32_to_bf16((float)v);
        break;
    case GCOLL_FLOAT8_E4M3:
        ((uint8_t *)b)[i] = gcoll_f32_to_e4m3((float)v);
        break;
    case GCOLL_FLOAT8_E5M2:
        ((uint8_t *)b)[i] = gcoll_f32_to_e5m2((float)v);
        break;
    default:
        ((float *)b)[i] = (float)v;
        break;
    }
}

static double get_float(const void *b, size_t i, gcoll_dtype_t d)
{
    switch (d) {
    case GCOLL_FLOAT64:
        return ((const double *)b)[i];
    case GCOLL_FLOAT16:
        return gcoll_f16_to_f32(((const uint16_t *)b)[i]);
    case GCOLL_BFLOAT16:
        return gcoll_bf16_to_f32(((const uint16_t *)b)[i]);
    case GCOLL_FLOAT8_E4M3:
        return gcoll_e4m3_to_f32(((const uint8_t *)b)[i]);
    case GCOLL_FLOAT8_E5M2:
        return gcoll_e5m2_to_f32(((const uint8_t *)b)[i]);
    default:
        return ((const float *)b)[i];
    }
}

/* The dtype's value of an input as a 64-bit integer: sign-extended for the signed types,
 * zero-extended (so -3 is 253 in uint8) for the unsigned ones. */
static uint64_t as_int(gcoll_dtype_t d, int v)
{
    switch (d) {
    case GCOLL_INT8:
        return (uint64_t)(int64_t)(int8_t)v;
    case GCOLL_INT16:
        return (uint64_t)(int64_t)(int16_t)v;
    case GCOLL_UINT8:
        return (uint8_t)v;
    case GCOLL_UINT32:
        return (uint32_t)v;
    default:
        return (uint64_t)(int64_t)v;
    }
}

static void put_input(gcoll_dtype_t d, void *b, size_t i, int v)
{
    if (kind(d) == K_FLOAT)
        put_float(b, i, d, v);
    else
        put_int(b, i, d, as_int(d, v));
}

void bench_fill(const bench_opts_t *o, void *buf, size_t n, int r, size_t first)
{
    for (size_t i = 0; i < n; i++)
        put_input(o->dtype, buf, i, input(o, r, first + i));
}

/* Reference reduction of element i over the ranks into tmp[0]; *tol: allowed relative
 * error (0: bit equality). */
static void reference(const bench_opts_t *o, int nranks, size_t i, void *tmp, double *tol)
{
    const gcoll_dtype_t d = o->dtype;
    *tol = 0;
    if (kind(d) == K_FLOAT) {
        double acc = input(o, 0, i);
        for (int k = 1; k < nranks; k++) {
            double v = input(o, k, i);
            switch (o->op) {
            case GCOLL_PROD:
                acc *= v;
                break;
            case GCOLL_MIN:
                acc = v < acc ? v : acc;
                break;
            case GCOLL_MAX:
                acc = v > acc ? v : acc;
                break;
            default:
                acc += v;
                break;
            }
        }
        if (o->op == GCOLL_AVG) {
            acc /= nranks;
            *tol = eps(d);
        }
        put_float(tmp, 0, d, acc);
        return;
    }
    if (kind(d) == K_BOOL) {
        int acc = input(o, 0, i) != 0;
        for (int k = 1; k < nranks; k++) {
            int v = input(o, k, i) != 0;
            switch (o->op) {
            case GCOLL_PROD:
            case GCOLL_MIN:
            case GCOLL_BAND:
                acc = acc && v;
                break;
            case GCOLL_BXOR:
                acc ^= v;
                break;
            default:
                acc = acc || v;
                break; /* SUM, MAX, BOR: logical or */
            }
        }
        put_int(tmp, 0, d, (uint64_t)acc);
        return;
    }
    const int sign = kind(d) == K_SIGNED;
    const unsigned bits = (unsigned)gcoll_dtype_size(d) * 8;
    uint64_t acc = as_int(d, input(o, 0, i));
    for (int k = 1; k < nranks; k++) {
        uint64_t v = as_int(d, input(o, k, i));
        switch (o->op) {
        case GCOLL_PROD:
            acc *= v;
            break; /* wraps mod 2^64, so mod 2^bits too */
        case GCOLL_MIN:
            acc = (sign ? (int64_t)v < (int64_t)acc : v < acc) ? v : acc;
            break;
        case GCOLL_MAX:
            acc = (sign ? (int64_t)v > (int64_t)acc : v > acc) ? v : acc;
            break;
        case GCOLL_BAND:
            acc &= v;
            break;
        case GCOLL_BOR:
            acc |= v;
            break;
        case GCOLL_BXOR:
            acc ^= v;
            break;
        default:
            acc += v;
            break; /* SUM, AVG */
        }
    }
    if (o->op == GCOLL_AVG) {
        /* the sum wrapped to the width, then divided, truncating toward zero */
        uint64_t mask = bits == 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
        uint64_t w = acc & mask;
        if (sign) {
            int64_t s = bits == 64 ? (int64_t)w : (int64_t)(w << (64 - bits)) >> (64 - bits);
            acc = (uint64_t)(s / nranks);
        } else {
            acc = w / (uint64_t)nranks;
        }
    }
    put_int(tmp, 0, d, acc);
}

long bench_wrong(const bench_opts_t *o, const void *out, size_t n, int nranks, int from,
                 size_t first)
{
    const gcoll_dtype_t d = o->dtype;
    const size_t esz = gcoll_dtype_size(d);
    long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t want[8];
        double tol = 0;
        if (from >= 0)
            put_input(d, want, 0, input(o, from, first + i));
        else
            reference(o, nranks, first + i, want, &tol);
        const void *got = (const uint8_t *)out + i * esz;
        if (memcmp(got, want, esz) == 0)
            continue;
        if (tol > 0) {
            double g = get_float(out, i, d), w = get_float(want, 0, d);
            if (fabs(g - w) <= tol * fabs(w))
                continue;
        }
        wrong++;
    }
    return wrong;
}
