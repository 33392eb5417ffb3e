/* check_dtypes.c: the integer, bool and fp8 dtypes and the bitwise ops through allreduce
 * and reduce-scatter (whatever algorithm GCOLL_ALGO or the cost model picks), the
 * byte-moving collectives on every dtype, and the op/dtype pairs that are refused.
 * Expected values are computed here from every rank's inputs with this file's own
 * arithmetic and fp8 decoder. Integer sums and products wrap modulo 2^bits, so they are
 * exact in any order of combination; fp8 inputs are small integers whose sums and
 * products every order gives exactly, and AVG rounds the exact mean once. */
#include "check.h"

static const gcoll_dtype_t new_dtypes[] = {
    GCOLL_BOOL,   GCOLL_INT8,  GCOLL_UINT8,  GCOLL_INT16,       GCOLL_INT32,
    GCOLL_UINT32, GCOLL_INT64, GCOLL_UINT64, GCOLL_FLOAT8_E4M3, GCOLL_FLOAT8_E5M2};
static const gcoll_op_t all_ops[] = {GCOLL_SUM,  GCOLL_AVG,  GCOLL_MIN, GCOLL_MAX,
                                     GCOLL_PROD, GCOLL_BAND, GCOLL_BOR, GCOLL_BXOR};

static int is_fp8(gcoll_dtype_t d)
{
    return d == GCOLL_FLOAT8_E4M3 || d == GCOLL_FLOAT8_E5M2;
}

/* Whether the library takes op on d (and so this file checks it). */
static int valid_pair(gcoll_dtype_t d, gcoll_op_t op)
{
    if (op == GCOLL_BAND || op == GCOLL_BOR || op == GCOLL_BXOR)
        return !is_fp8(d);
    return !(d == GCOLL_BOOL && op == GCOLL_AVG);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

/* fp8 value of a code, from the OFP8 definition. */
static double fp8_def(uint8_t c, int e4m3)
{
    int M = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    int e = (c >> M) & ((1 << (7 - M)) - 1), m = c & ((1 << M) - 1);
    double v;
    if (e4m3 && (c & 0x7f) == 0x7f)
        return NAN;
    if (!e4m3 && e == 31)
        v = m ? NAN : INFINITY;
    else
        v = e ? ldexp(1.0 + (double)m / (1 << M), e - bias) : ldexp((double)m / (1 << M), 1 - bias);
    return (c & 0x80) ? -v : v;
}

/* The same, tabulated once (the searches below run per element). */
static double fp8_value(uint8_t c, int e4m3)
{
    static double tab[2][256];
    static int done;
    if (!done) {
        for (int k = 0; k < 256; k++) {
            tab[0][k] = fp8_def((uint8_t)k, 0);
            tab[1][k] = fp8_def((uint8_t)k, 1);
        }
        done = 1;
    }
    return tab[e4m3 != 0][c];
}

/* Nearest finite code, ties to the even code (no overflow in this file's ranges). */
static uint8_t fp8_code(double x, int e4m3)
{
    int best = 0;
    double ax = fabs(x);
    for (int c = 1; c <= (e4m3 ? 0x7e : 0x7b); c++) {
        double dc = fabs(fp8_value((uint8_t)c, e4m3) - ax);
        double db = fabs(fp8_value((uint8_t)best, e4m3) - ax);
        if (dc < db || (dc == db && c % 2 == 0))
            best = c;
    }
    return (uint8_t)(best | (x < 0 ? 0x80 : 0));
}

/* Rank r's element i as 64 bits (sign-extended for signed integer types). Integers: random
 * bits; bool: 0 or a random non-zero byte; fp8: the code of a small integer. */
static uint64_t in_val(int r, size_t i, gcoll_dtype_t d, gcoll_op_t op)
{
    uint64_t h = mix(((uint64_t)r << 40) ^ (i * 0x100000001b3ull) ^ ((uint64_t)d << 56));
    if (d == GCOLL_BOOL)
        return h % 3 == 0 ? 0 : (h >> 8) % 255 + 1;
    if (is_fp8(d)) {
        static const int prod[4] = {-2, -1, 1, 2};
        int lim = d == GCOLL_FLOAT8_E4M3 ? 3 : 1; /* |sum| <= 15 (e4m3), <= 5 (e5m2): exact */
        int v = op == GCOLL_PROD ? prod[h & 3] : (int)(h % (2 * (uint64_t)lim + 1)) - lim;
        return fp8_code(v, d == GCOLL_FLOAT8_E4M3);
    }
    size_t bits = 8 * gcoll_dtype_size(d);
    if (bits == 64)
        return h;
    h &= (1ull << bits) - 1;
    int sgn = d == GCOLL_INT8 || d == GCOLL_INT16 || d == GCOLL_INT32;
    return sgn && (h >> (bits - 1)) ? h | ~((1ull << bits) - 1) : h;
}

static void put(void *buf, size_t i, gcoll_dtype_t d, uint64_t v)
{
    size_t esz = gcoll_dtype_size(d);
    for (size_t k = 0; k < esz; k++)
        ((uint8_t *)buf)[i * esz + k] = (uint8_t)(v >> (8 * k));
}

static uint64_t get(const void *buf, size_t i, gcoll_dtype_t d)
{
    size_t esz = gcoll_dtype_size(d);
    uint64_t v = 0;
    for (size_t k = 0; k < esz; k++)
        v |= (uint64_t)((const uint8_t *)buf)[i * esz + k] << (8 * k);
    return v;
}

/* The reduction over every rank of element i, as the bytes the result must hold. */
static uint64_t want_val(size_t i, gcoll_dtype_t d, gcoll_op_t op)
{
    size_t esz = gcoll_dtype_size(d);
    uint64_t mask = esz == 8 ? ~0ull : (1ull << (8 * esz)) - 1;
    if (is_fp8(d)) {
        int e4 = d == GCOLL_FLOAT8_E4M3;
        double acc = fp8_value((uint8_t)in_val(0, i, d, op), e4);
        for (int r = 1; r < size; r++) {
            double v = fp8_value((uint8_t)in_val(r, i, d, op), e4);
            acc = op == GCOLL_PROD  ? acc * v
                  : op == GCOLL_MIN ? (v < acc ? v : acc)
                  : op == GCOLL_MAX ? (v > acc ? v : acc)
                                    : acc + v;
        }
        return fp8_code(op == GCOLL_AVG ? acc / size : acc, e4);
    }
    if (d == GCOLL_BOOL && size == 1)
        return in_val(0, i, d, op); /* nothing combined: copied as it is */
    if (d == GCOLL_BOOL) {
        int acc = in_val(0, i, d, op) != 0;
        for (int r = 1; r < size; r++) {
            int v = in_val(r, i, d, op) != 0;
            acc = op == GCOLL_PROD || op == GCOLL_MIN || op == GCOLL_BAND ? acc && v
                  : op == GCOLL_BXOR                                      ? acc != v
                                                                          : acc || v;
        }
        return (uint64_t)acc;
    }
    int sgn = d == GCOLL_INT8 || d == GCOLL_INT16 || d == GCOLL_INT32 || d == GCOLL_INT64;
    uint64_t acc = in_val(0, i, d, op);
    for (int r = 1; r < size; r++) {
        uint64_t v = in_val(r, i, d, op);
        int less = sgn ? (int64_t)v < (int64_t)acc : v < acc;
        /* clang-format off */
        switch (op) {
        case GCOLL_SUM: case GCOLL_AVG: acc += v; break;
        case GCOLL_PROD: acc *= v; break;
        case GCOLL_MIN: acc = less ? v : acc; break;
        case GCOLL_MAX: acc = less ? acc : v; break;
        case GCOLL_BAND: acc &= v; break;
        case GCOLL_BOR: acc |= v; break;
        case GCOLL_BXOR: acc ^= v; break;
        }
        /* clang-format on */
    }
    if (op == GCOLL_AVG) { /* the wrapped sum, sign-extended, divided, truncated to zero */
        size_t bits = 8 * esz;
        acc &= mask;
        if (sgn && bits < 64 && (acc >> (bits - 1)))
            acc |= ~mask;
        acc = sgn ? (uint64_t)((int64_t)acc / size) : acc / (uint64_t)size;
    }
    return acc & mask;
}

static void check_reduction(size_t n, gcoll_dtype_t d, gcoll_op_t op, int inplace, int scatter)
{
    size_t esz = gcoll_dtype_size(d), total = scatter ? n * (size_t)size : n;
    uint8_t *in = malloc(total * esz + 1), *out = malloc(n * esz + 1);
    for (size_t i = 0; i < total; i++)
        put(in, i, d, in_val(rank, i, d, op));
    uint8_t *res = inplace ? (scatter ? in + (size_t)rank * n * esz : in) : out;
    gcoll_status_t st = scatter ? gcoll_reduce_scatter(comm, in, res, n, d, op)
                                : gcoll_allreduce(comm, in, res, n, d, op);
    checks++;
    if (st != GCOLL_OK) {
        FAIL("%s %s %s count %zu: %s (%s)", scatter ? "reduce_scatter" : "allreduce",
             gcoll_dtype_name(d), gcoll_op_name(op), n, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    } else {
        size_t base = scatter ? (size_t)rank * n : 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t got = get(res, i, d), want = want_val(base + i, d, op);
            if (got != want) {
                FAIL("%s %s %s count %zu inplace %d: [%zu] = %llx, want %llx",
                     scatter ? "reduce_scatter" : "allreduce", gcoll_dtype_name(d),
                     gcoll_op_name(op), n, inplace, i, (unsigned long long)got,
                     (unsigned long long)want);
                break;
            }
        }
    }
    free(in);
    free(out);
}

/* Byte-moving collectives on a dtype: every byte arrives where it should. */
static void check_moves(gcoll_dtype_t d, size_t n)
{
    size_t esz = gcoll_dtype_size(d), P = (size_t)size, nb = n * esz;
    uint8_t *a = malloc(P * nb + 1), *b = malloc(P * nb + 1);
    int root = size - 1;
    for (size_t k = 0; k < nb; k++)
        a[k] = (uint8_t)mix(k * 31 + (size_t)root);
    if (rank != root)
        memset(a, 0, nb);
    checks++;
    gcoll_status_t st = gcoll_broadcast(comm, a, n, d, root);
    for (size_t k = 0; st == GCOLL_OK && k < nb; k++)
        if (a[k] != (uint8_t)mix(k * 31 + (size_t)root)) {
            FAIL("broadcast %s: byte %zu differs", gcoll_dtype_name(d), k);
            break;
        }
    for (size_t k = 0; k < nb; k++)
        a[k] = (uint8_t)mix(k * 7 + (size_t)rank * 1000003);
    checks++;
    if (st == GCOLL_OK)
        st = gcoll_allgather(comm, a, b, n, d);
    for (size_t r = 0; st == GCOLL_OK && r < P; r++)
        for (size_t k = 0; k < nb; k++)
            if (b[r * nb + k] != (uint8_t)mix(k * 7 + r * 1000003)) {
                FAIL("allgather %s: rank %zu's byte %zu differs", gcoll_dtype_name(d), r, k);
                r = P;
                break;
            }
    for (size_t k = 0; k < P * nb; k++) /* block j goes to rank j */
        a[k] = (uint8_t)mix(k % nb + (k / nb) * 977 + (size_t)rank * 65537);
    checks++;
    if (st == GCOLL_OK)
        st = gcoll_alltoall(comm, a, b, n, d);
    for (size_t r = 0; st == GCOLL_OK && r < P; r++)
        for (size_t k = 0; k < nb; k++)
            if (b[r * nb + k] != (uint8_t)mix(k + (size_t)rank * 977 + r * 65537)) {
                FAIL("alltoall %s: block from rank %zu, byte %zu differs", gcoll_dtype_name(d), r,
                     k);
                r = P;
                break;
            }
    if (st != GCOLL_OK)
        FAIL("moving %s: %s (%s)", gcoll_dtype_name(d), gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    free(a);
    free(b);
}

/* Pairs that make no sense are refused locally with the reason; the communicator works on. */
static void check_refused(void)
{
    static const struct {
        gcoll_dtype_t d;
        gcoll_op_t op;
        const char *why;
    } bad[] = {{GCOLL_FLOAT32, GCOLL_BAND, "bitwise"},
               {GCOLL_FLOAT8_E4M3, GCOLL_BXOR, "bitwise"},
               {GCOLL_BFLOAT16, GCOLL_BOR, "bitwise"},
               {GCOLL_BOOL, GCOLL_AVG, "avg"}};
    float x[4] = {0};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        checks++;
        gcoll_status_t st = k % 2 ? gcoll_reduce_scatter(comm, x, x, 1, bad[k].d, bad[k].op)
                                  : gcoll_allreduce(comm, x, x, 1, bad[k].d, bad[k].op);
        if (st != GCOLL_ERR_INVALID || !strstr(gcoll_comm_last_error(comm), bad[k].why))
            FAIL("%s on %s gave %s (%s), want GCOLL_ERR_INVALID saying '%s'",
                 gcoll_op_name(bad[k].op), gcoll_dtype_name(bad[k].d), gcoll_status_string(st),
                 gcoll_comm_last_error(comm), bad[k].why);
    }
    checks++;
    if (gcoll_allreduce(comm, x, x, 1, (gcoll_dtype_t)99, GCOLL_SUM) != GCOLL_ERR_INVALID ||
        gcoll_allreduce(comm, x, x, 1, GCOLL_INT32, (gcoll_op_t)99) != GCOLL_ERR_INVALID)
        FAIL("an unknown dtype or op was not GCOLL_ERR_INVALID");
}

int run_dtypes(void)
{
    check_refused();
    const size_t counts[] = {0, 1, 7, 1001, 20011};
    size_t nd = sizeof(new_dtypes) / sizeof(new_dtypes[0]);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t d = 0; d < nd; d++)
            for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
                if (valid_pair(new_dtypes[d], all_ops[o]))
                    check_reduction(counts[c], new_dtypes[d], all_ops[o], (int)((c + o) % 2), 0);
    for (size_t d = 0; d < nd; d++)
        for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
            if (valid_pair(new_dtypes[d], all_ops[o]))
                check_reduction(d % 2 ? 3 : 1001, new_dtypes[d], all_ops[o], (int)(o % 2), 1);
    for (size_t d = 0; d < nd; d++)
        check_moves(new_dtypes[d], d % 2 ? 5 : 4099);
    return failures;
}
