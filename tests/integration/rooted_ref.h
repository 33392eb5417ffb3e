/* rooted_ref.h: rooted_check's number formats (IEEE 754 binary16, bfloat16, OFP8 decoded and
 * rounded from their definitions, not through gcoll's code) and its dtype helpers: the
 * inputs each rank makes and how elements are loaded and stored. Included by rooted_check.c
 * only (its functions are static). */
#ifndef ROOTED_REF_H
#define ROOTED_REF_H

/* ---- small float formats, from their definitions (IEEE 754 binary16, bfloat16, OFP8) ---- */

typedef struct {
    int ebits, mbits, bias, fn; /* fn: E4M3's "finite only" (S.1111.111 is NaN) */
} fmt_t;
static const fmt_t F16 = {5, 10, 15, 0}, BF16 = {8, 7, 127, 0}, E4M3 = {4, 3, 7, 1},
                   E5M2 = {5, 2, 15, 0};

static double fmt_dec(fmt_t f, uint64_t bits)
{
    uint64_t e = (bits >> f.mbits) & ((1u << f.ebits) - 1), m = bits & ((1u << f.mbits) - 1);
    int neg = (bits >> (f.ebits + f.mbits)) & 1;
    double v;
    if (f.fn && e == (1u << f.ebits) - 1 && m == (1u << f.mbits) - 1)
        v = NAN;
    else if (!f.fn && e == (1u << f.ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - f.bias - f.mbits);
    else
        v = ldexp((double)(m + (1u << f.mbits)), (int)e - f.bias - f.mbits);
    return neg ? -v : v;
}

/* x rounded to the format's precision, to nearest even (no overflow in this file's ranges) */
static double fmt_round(fmt_t f, double x)
{
    if (x == 0 || isnan(x))
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int lsb = (e - 1 < 1 - f.bias ? 1 - f.bias : e - 1) - f.mbits;
    return ldexp(nearbyint(ldexp(x, -lsb)), lsb);
}

/* Code of x, which the format represents exactly. */
static uint64_t fmt_enc(fmt_t f, double x)
{
    uint64_t sign = signbit(x) ? (uint64_t)1 << (f.ebits + f.mbits) : 0;
    double a = fabs(x);
    if (a == 0)
        return sign;
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < 1 - f.bias)
        return sign | (uint64_t)ldexp(a, f.bias - 1 + f.mbits);
    uint64_t m = (uint64_t)ldexp(a, f.mbits - e) - ((uint64_t)1 << f.mbits);
    return sign | ((uint64_t)(e + f.bias) << f.mbits) | m;
}

/* ---- dtypes ------------------------------------------------------------------------------- */

static const gcoll_dtype_t all_dtypes[] = {
    GCOLL_FLOAT32, GCOLL_FLOAT16, GCOLL_BFLOAT16,    GCOLL_FLOAT64,    GCOLL_INT32,
    GCOLL_INT64,   GCOLL_BOOL,    GCOLL_INT8,        GCOLL_UINT8,      GCOLL_INT16,
    GCOLL_UINT32,  GCOLL_UINT64,  GCOLL_FLOAT8_E4M3, GCOLL_FLOAT8_E5M2};
#define NDT (sizeof(all_dtypes) / sizeof(all_dtypes[0]))
static const gcoll_op_t all_ops[] = {GCOLL_SUM,  GCOLL_AVG,  GCOLL_MIN, GCOLL_MAX,
                                     GCOLL_PROD, GCOLL_BAND, GCOLL_BOR, GCOLL_BXOR};
static const char *const op_names[] = {"sum", "avg", "min", "max", "prod", "band", "bor", "bxor"};

static int is_float(gcoll_dtype_t d)
{
    return d == GCOLL_FLOAT32 || d == GCOLL_FLOAT64 || d == GCOLL_FLOAT16 || d == GCOLL_BFLOAT16 ||
           d == GCOLL_FLOAT8_E4M3 || d == GCOLL_FLOAT8_E5M2;
}

static int is_signed(gcoll_dtype_t d)
{
    return d == GCOLL_INT8 || d == GCOLL_INT16 || d == GCOLL_INT32 || d == GCOLL_INT64;
}

static int valid_pair(gcoll_dtype_t d, gcoll_op_t op)
{
    if (op == GCOLL_BAND || op == GCOLL_BOR || op == GCOLL_BXOR)
        return !is_float(d);
    return !(d == GCOLL_BOOL && op == GCOLL_AVG);
}

static const fmt_t *small_fmt(gcoll_dtype_t d)
{
    switch (d) {
    case GCOLL_FLOAT16:
        return &F16;
    case GCOLL_BFLOAT16:
        return &BF16;
    case GCOLL_FLOAT8_E4M3:
        return &E4M3;
    case GCOLL_FLOAT8_E5M2:
        return &E5M2;
    default:
        return NULL;
    }
}

/* Significant bits of a float dtype. */
static int precision(gcoll_dtype_t d)
{
    if (d == GCOLL_FLOAT32)
        return 24;
    if (d == GCOLL_FLOAT64)
        return 53;
    return small_fmt(d)->mbits + 1;
}

/* A value rounded to the dtype, as the library rounds after each operation. */
static double round_to(gcoll_dtype_t d, double x)
{
    if (d == GCOLL_FLOAT32)
        return (double)(float)x;
    if (d == GCOLL_FLOAT64)
        return x;
    return fmt_round(*small_fmt(d), x);
}

/* Float input of rank r at element i of call `call`: a signed multiple of 2^-q with few
 * significant bits (see the top comment); for PROD, magnitudes in [0.5, 2). */
static double float_input(gcoll_dtype_t d, gcoll_op_t op, int r, size_t i, uint64_t call)
{
    uint64_t h = hash4(call, (uint64_t)r, i, 7);
    double sign = (h >> 63) ? -1.0 : 1.0;
    const fmt_t *f = small_fmt(d);
    if (f && f->mbits <= 3) { /* fp8: any code of exponent -3..1 (PROD: -1..0) */
        int e = (op == GCOLL_PROD ? -1 : -3) + (int)((h >> 8) % (op == GCOLL_PROD ? 2 : 5));
        uint64_t m = (h >> 16) % (1u << f->mbits);
        return sign * ldexp(1.0 + (double)m / (1 << f->mbits), e);
    }
    int bits = precision(d) - 1; /* significant bits of the input */
    bits = d == GCOLL_FLOAT64 ? 40 : bits > 20 ? 20 : bits;
    if (op == GCOLL_PROD) { /* [0.5, 2): m / 2^bits with m in [2^(bits-1), 2^(bits+1)) */
        uint64_t m = ((uint64_t)1 << (bits - 1)) + (h >> 8) % (((uint64_t)3 << (bits - 1)));
        return sign * ldexp((double)m, -bits);
    }
    /* |x| < 4, m / 2^(bits-2) with m < 2^bits */
    uint64_t m = (h >> 8) % ((uint64_t)1 << bits);
    return sign * ldexp((double)m, 2 - bits);
}

/* Raw bits of element i of a buffer. */
static uint64_t load(const void *buf, gcoll_dtype_t d, size_t i)
{
    size_t esz = gcoll_dtype_size(d);
    uint64_t v = 0;
    memcpy(&v, (const uint8_t *)buf + i * esz, esz); /* little-endian */
    return v;
}

static void store(void *buf, gcoll_dtype_t d, size_t i, uint64_t v)
{
    memcpy((uint8_t *)buf + i * gcoll_dtype_size(d), &v, gcoll_dtype_size(d));
}

static uint64_t float_bits(gcoll_dtype_t d, double x)
{
    if (d == GCOLL_FLOAT32) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        return u;
    }
    if (d == GCOLL_FLOAT64) {
        uint64_t u;
        memcpy(&u, &x, 8);
        return u;
    }
    return fmt_enc(*small_fmt(d), x);
}

static double float_value(gcoll_dtype_t d, uint64_t bits)
{
    if (d == GCOLL_FLOAT32) {
        float f;
        uint32_t u = (uint32_t)bits;
        memcpy(&f, &u, 4);
        return f;
    }
    if (d == GCOLL_FLOAT64) {
        double x;
        memcpy(&x, &bits, 8);
        return x;
    }
    return fmt_dec(*small_fmt(d), bits);
}

/* Raw input bits of rank r, element i. */
static uint64_t input(gcoll_dtype_t d, gcoll_op_t op, int r, size_t i, uint64_t call)
{
    if (is_float(d))
        return float_bits(d, float_input(d, op, r, i, call));
    uint64_t h = hash4(call, (uint64_t)r, i, 11);
    if (d == GCOLL_BOOL)
        return h & 1;
    size_t esz = gcoll_dtype_size(d);
    return esz == 8 ? h : h & ((1ull << (8 * esz)) - 1);
}

#endif /* ROOTED_REF_H */
