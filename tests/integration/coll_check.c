/* coll_check: multi-rank correctness and failure checks of the public API, run under
 * gcoll-run by the integration scripts. Expected values are computed here, independently
 * of the library (own fp16/bf16 codecs, plain loops over every rank's inputs). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcoll.h"

/* a few hundred pairs per rank, or all of a small tensor */
#define GCOLL_SPARSE_N(count) ((count) < 300 ? (count) / 2 + 1 : 300)

static int rank, size, failures, checks;
static gcoll_comm_t *comm;

#define FAIL(...)                                                                         \
    do {                                                                                  \
        fprintf(stderr, "rank %d: FAIL: ", rank);                                         \
        fprintf(stderr, __VA_ARGS__);                                                     \
        fprintf(stderr, "\n");                                                            \
        failures++;                                                                       \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- independent 16-bit float codecs (exact for the small integers used here) ---- */

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static uint16_t int_to_half(int v)
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    int a = abs(v), e = 0;
    while ((a >> e) > 1)
        e++;
    /* a = 2^e * (1 + m/1024), exact for |v| <= 2048 */
    int m = (int)(((long)a << 10 >> e) - 1024);
    return (uint16_t)(sign | ((e + 15) << 10) | m);
}

static double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t int_to_bf16(int v)
{
    float f = (float)v; /* small integers are exact in bf16's 8-bit mantissa */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* ---- inputs and expected results -------------------------------------------------- */

static const gcoll_dtype_t dtypes[] = {GCOLL_FLOAT32, GCOLL_FLOAT16, GCOLL_BFLOAT16,
                                       GCOLL_FLOAT64, GCOLL_INT32,   GCOLL_INT64};
static const gcoll_op_t ops[] = {GCOLL_SUM, GCOLL_AVG, GCOLL_MIN, GCOLL_MAX, GCOLL_PROD};

/* Input of rank r at index i: small integers, so sums and products stay exact in every
 * dtype; PROD draws from {-2,-1,1,2} to keep |product| <= 2^size. */
static int input(int r, size_t i, gcoll_op_t op)
{
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(r * 40503u + 17u);
    h ^= h >> 13;
    if (op == GCOLL_PROD) {
        static const int v[4] = {-2, -1, 1, 2};
        return v[h & 3];
    }
    return (int)(h % 17) - 8;
}

static void store(void *buf, size_t i, gcoll_dtype_t dt, int v)
{
    switch (dt) {
    case GCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case GCOLL_FLOAT64: ((double *)buf)[i] = v; break;
    case GCOLL_INT32: ((int32_t *)buf)[i] = v; break;
    case GCOLL_INT64: ((int64_t *)buf)[i] = v; break;
    case GCOLL_FLOAT16: ((uint16_t *)buf)[i] = int_to_half(v); break;
    case GCOLL_BFLOAT16: ((uint16_t *)buf)[i] = int_to_bf16(v); break;
    }
}

static double load(const void *buf, size_t i, gcoll_dtype_t dt)
{
    switch (dt) {
    case GCOLL_FLOAT32: return ((const float *)buf)[i];
    case GCOLL_FLOAT64: return ((const double *)buf)[i];
    case GCOLL_INT32: return ((const int32_t *)buf)[i];
    case GCOLL_INT64: return (double)((const int64_t *)buf)[i];
    case GCOLL_FLOAT16: return half_to_double(((const uint16_t *)buf)[i]);
    case GCOLL_BFLOAT16: return bf16_to_double(((const uint16_t *)buf)[i]);
    }
    return NAN;
}

static double expected(size_t i, gcoll_dtype_t dt, gcoll_op_t op)
{
    long acc = input(0, i, op);
    for (int r = 1; r < size; r++) {
        long v = input(r, i, op);
        switch (op) {
        case GCOLL_SUM:
        case GCOLL_AVG: acc += v; break;
        case GCOLL_PROD: acc *= v; break;
        case GCOLL_MIN: acc = v < acc ? v : acc; break;
        case GCOLL_MAX: acc = v > acc ? v : acc; break;
        }
    }
    if (op != GCOLL_AVG)
        return (double)acc;
    if (dt == GCOLL_INT32 || dt == GCOLL_INT64)
        return (double)(acc / size); /* C division truncates toward zero */
    return (double)acc / size;
}

/* Tolerance: exact except AVG in floating point, which rounds once to the dtype. */
static double tolerance(gcoll_dtype_t dt, gcoll_op_t op, double want)
{
    if (op != GCOLL_AVG)
        return 0;
    double rel = dt == GCOLL_FLOAT16 ? 1.0 / 1024 : dt == GCOLL_BFLOAT16 ? 1.0 / 128
                 : dt == GCOLL_FLOAT32 ? 1.2e-7 : dt == GCOLL_FLOAT64 ? 1e-15 : 0;
    return fabs(want) * rel;
}

static void check_allreduce(size_t count, gcoll_dtype_t dt, gcoll_op_t op, int inplace)
{
    size_t esz = gcoll_dtype_size(dt);
    uint8_t *in = malloc(count * esz + 1), *out = malloc(count * esz + 1);
    for (size_t i = 0; i < count; i++) {
        store(in, i, dt, input(rank, i, op));
        store(out, i, dt, 99);
    }
    void *recv = inplace ? in : out;
    gcoll_status_t st = gcoll_allreduce(comm, in, recv, count, dt, op);
    checks++;
    if (st != GCOLL_OK) {
        FAIL("allreduce count=%zu %s %s%s: %s (%s)", count, gcoll_dtype_name(dt),
             gcoll_op_name(op), inplace ? " in place" : "", gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    } else {
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < count; i++) {
            double want = expected(i, dt, op), got = load(recv, i, dt);
            if (!(fabs(got - want) <= tolerance(dt, op, want))) {
                if (!wrong++)
                    first = i;
            }
        }
        if (wrong)
            FAIL("allreduce count=%zu %s %s%s: %zu wrong, first at %zu: got %g want %g", count,
                 gcoll_dtype_name(dt), gcoll_op_name(op), inplace ? " in place" : "", wrong,
                 first, load(recv, first, dt), expected(first, dt, op));
        if (!inplace)
            for (size_t i = 0; i < count; i++)
                if (load(in, i, dt) != (double)input(rank, i, op)) {
                    FAIL("allreduce modified its send buffer at %zu", i);
                    break;
                }
    }
    free(in);
    free(out);
}

static void check_broadcast(size_t count, gcoll_dtype_t dt, int root)
{
    size_t esz = gcoll_dtype_size(dt);
    uint8_t *buf = malloc(count * esz + 1);
    for (size_t i = 0; i < count; i++)
        store(buf, i, dt, rank == root ? input(root, i, GCOLL_SUM) : 77);
    gcoll_status_t st = gcoll_broadcast(comm, buf, count, dt, root);
    checks++;
    if (st != GCOLL_OK) {
        FAIL("broadcast count=%zu root=%d: %s (%s)", count, root, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    } else {
        for (size_t i = 0; i < count; i++)
            if (load(buf, i, dt) != (double)input(root, i, GCOLL_SUM)) {
                FAIL("broadcast count=%zu %s root=%d: wrong at %zu", count, gcoll_dtype_name(dt),
                     root, i);
                break;
            }
    }
    free(buf);
}

/* Fills block data for rank r: a value depending on (r, i) so misplaced blocks show. */
static int blockval(int r, size_t i) { return (int)((r * 31 + (int)(i % 61)) % 97) - 48; }

static void verify(const char *what, const void *buf, size_t n, gcoll_dtype_t dt,
                   int (*want)(size_t i, void *ctx), void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        if (load(buf, i, dt) != (double)want(i, ctx)) {
            FAIL("%s %s: wrong at %zu: got %g want %d", what, gcoll_dtype_name(dt), i,
                 load(buf, i, dt), want(i, ctx));
            return;
        }
    }
}

typedef struct {
    const size_t *counts, *displs;
    size_t n;
    gcoll_op_t op;
} layout_t;

static int want_gather(size_t i, void *ctx)
{
    layout_t *l = ctx;
    for (int r = 0; r < size; r++)
        if (i >= l->displs[r] && i < l->displs[r] + l->counts[r])
            return blockval(r, i - l->displs[r]);
    return 55; /* gaps keep their fill */
}

static void check_allgatherv(size_t unit, gcoll_dtype_t dt, int variable, int inplace)
{
    size_t *counts = calloc((size_t)size, sizeof(size_t)), *displs = calloc((size_t)size, sizeof(size_t));
    size_t total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = variable ? unit * (size_t)((r * 3 + 1) % 4) : unit; /* some ranks send 0 */
        displs[r] = total + (variable ? 3 : 0);                           /* gaps between blocks */
        total = displs[r] + counts[r];
    }
    size_t esz = gcoll_dtype_size(dt);
    uint8_t *recv = malloc(total * esz + 1), *send = malloc(counts[rank] * esz + 1);
    for (size_t i = 0; i < total; i++)
        store(recv, i, dt, 55);
    for (size_t i = 0; i < counts[rank]; i++)
        store(variable || !inplace ? send : recv + displs[rank] * esz, i, dt, blockval(rank, i));
    const void *src = (!variable && inplace) ? recv + displs[rank] * esz : send;
    gcoll_status_t st = variable
        ? gcoll_allgatherv(comm, src, counts[rank], recv, counts, displs, dt)
        : gcoll_allgather(comm, src, recv, unit, dt);
    checks++;
    layout_t l = {counts, displs, total, GCOLL_SUM};
    if (st != GCOLL_OK)
        FAIL("allgather%s unit=%zu: %s (%s)", variable ? "v" : "", unit, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    else
        verify(variable ? "allgatherv" : "allgather", recv, total, dt, want_gather, &l);
    free(recv);
    free(send);
    free(counts);
    free(displs);
}

static int want_rs(size_t i, void *ctx)
{
    layout_t *l = ctx;
    /* element i of this rank's block is element rank*n+i of every rank's input */
    long acc = input(0, (size_t)rank * l->n + i, l->op);
    for (int r = 1; r < size; r++) {
        long v = input(r, (size_t)rank * l->n + i, l->op);
        acc = l->op == GCOLL_PROD ? acc * v : l->op == GCOLL_MIN ? (v < acc ? v : acc)
              : l->op == GCOLL_MAX ? (v > acc ? v : acc) : acc + v;
    }
    return (int)(l->op == GCOLL_AVG ? acc / size : acc);
}

static void check_reduce_scatter(size_t n, gcoll_dtype_t dt, gcoll_op_t op, int inplace)
{
    size_t esz = gcoll_dtype_size(dt);
    uint8_t *send = malloc((size_t)size * n * esz + 1), *out = malloc(n * esz + 1);
    for (size_t i = 0; i < (size_t)size * n; i++)
        store(send, i, dt, input(rank, i, op));
    void *recv = inplace ? send + (size_t)rank * n * esz : out;
    gcoll_status_t st = gcoll_reduce_scatter(comm, send, recv, n, dt, op);
    checks++;
    layout_t l = {NULL, NULL, n, op};
    if (st != GCOLL_OK)
        FAIL("reduce_scatter n=%zu: %s (%s)", n, gcoll_status_string(st), gcoll_comm_last_error(comm));
    else if (op == GCOLL_AVG && (dt != GCOLL_INT32 && dt != GCOLL_INT64))
        ; /* AVG of floats is covered by allreduce; integer AVG checks the truncation here */
    else
        verify("reduce_scatter", recv, n, dt, want_rs, &l);
    free(send);
    free(out);
}

/* alltoallv: rank r sends (r + j) % 3 * unit elements to rank j. */
static size_t a2a_count(int from, int to, size_t unit, int variable)
{
    return variable ? (size_t)((from + to) % 3) * unit : unit;
}

static void check_alltoall(size_t unit, gcoll_dtype_t dt, int variable)
{
    size_t esz = gcoll_dtype_size(dt);
    size_t *sc = calloc(4 * (size_t)size, sizeof(size_t)), *sd = sc + size, *rc = sd + size,
           *rd = rc + size, stot = 0, rtot = 0;
    for (int j = 0; j < size; j++) {
        sc[j] = a2a_count(rank, j, unit, variable);
        sd[j] = stot;
        stot += sc[j];
        rc[j] = a2a_count(j, rank, unit, variable);
        rd[j] = rtot;
        rtot += rc[j];
    }
    uint8_t *send = malloc(stot * esz + 1), *recv = malloc(rtot * esz + 1);
    for (int j = 0; j < size; j++)
        for (size_t i = 0; i < sc[j]; i++)
            store(send, sd[j] + i, dt, blockval(rank * 7 + j, i));
    gcoll_status_t st = variable ? gcoll_alltoallv(comm, send, sc, sd, recv, rc, rd, dt)
                                 : gcoll_alltoall(comm, send, recv, unit, dt);
    checks++;
    if (st != GCOLL_OK) {
        FAIL("alltoall%s unit=%zu: %s (%s)", variable ? "v" : "", unit, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    } else {
        for (int j = 0; j < size; j++)
            for (size_t i = 0; i < rc[j]; i++)
                if (load(recv, rd[j] + i, dt) != (double)blockval(j * 7 + rank, i)) {
                    FAIL("alltoall%s: block from rank %d wrong at %zu", variable ? "v" : "", j, i);
                    j = size;
                    break;
                }
    }
    free(send);
    free(recv);
    free(sc);
}

static void run_gathers(void)
{
    const size_t units[] = {0, 1, 7, 10007};
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
            check_allgatherv(units[u], dtypes[d], 0, 0);
            check_allgatherv(units[u], dtypes[d], 0, 1);
            check_allgatherv(units[u], dtypes[d], 1, 0);
            check_alltoall(units[u], dtypes[d], 0);
            check_alltoall(units[u], dtypes[d], 1);
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                check_reduce_scatter(units[u], dtypes[d], ops[o], (int)(o % 2));
        }
    }
    check_allgatherv(300007, GCOLL_FLOAT32, 1, 0); /* several ring chunks per block */
    check_reduce_scatter(300007, GCOLL_FLOAT32, GCOLL_SUM, 1);
}

/* ---- sparse allreduce ---- */

/* Rank r's pairs for pattern p: n pairs (unsorted, some repeated) with small integer
 * values, so every sum is exact and the reference is independent of order. */
static size_t sparse_pairs(int r, int pattern, size_t count, size_t n, uint32_t *idx, float *val)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = n - 1 - i; /* descending: unsorted input */
        switch (pattern) {
        case 0: idx[i] = (uint32_t)((j * 7919 + (size_t)r * 13) % count); break; /* overlapping */
        case 1: idx[i] = (uint32_t)((j * (size_t)size + (size_t)r) % count); break; /* disjoint */
        case 2: idx[i] = (uint32_t)(count / 2); break;                 /* all the same index */
        default: idx[i] = (uint32_t)(j % count); break;                /* every index (k = n) */
        }
        val[i] = (float)((int)((i + (size_t)r * 3) % 11) - 5);
    }
    return n;
}

/* odd_empty: odd ranks contribute nothing. */
static void check_sparse(size_t count, size_t n, int pattern, gcoll_op_t op, int odd_empty)
{
    uint32_t *idx = malloc((n + 1) * sizeof(uint32_t));
    float *val = malloc((n + 1) * sizeof(float)), *out = malloc((count + 1) * sizeof(float));
    double *want = calloc(count + 1, sizeof(double));
    for (int r = 0; r < size; r++) {
        size_t m = odd_empty && r % 2 ? 0 : n;
        sparse_pairs(r, pattern, count, m, idx, val);
        for (size_t i = 0; i < m; i++)
            want[idx[i]] += val[i];
    }
    if (odd_empty && rank % 2)
        n = 0;
    sparse_pairs(rank, pattern, count, n, idx, val);
    for (size_t i = 0; i < count; i++)
        out[i] = 12345.0f;
    gcoll_status_t st = gcoll_sparse_allreduce(comm, idx, val, n, count, out, op);
    checks++;
    if (st != GCOLL_OK) {
        FAIL("sparse count=%zu nnz=%zu pattern %d: %s (%s)", count, n, pattern,
             gcoll_status_string(st), gcoll_comm_last_error(comm));
    } else {
        for (size_t i = 0; i < count; i++) {
            double w = op == GCOLL_AVG ? want[i] / size : want[i];
            if (fabs(out[i] - w) > fabs(w) * 1e-6) {
                FAIL("sparse count=%zu nnz=%zu pattern %d %s: wrong at %zu: got %g want %g",
                     count, n, pattern, gcoll_op_name(op), i, out[i], w);
                break;
            }
        }
        /* every rank must hold exactly the same bits */
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < count * sizeof(float); i++)
            h = (h ^ ((uint8_t *)out)[i]) * 1099511628211ull;
        uint64_t lo = h, hi = h;
        if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_INT64, GCOLL_MIN) != GCOLL_OK ||
            gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_INT64, GCOLL_MAX) != GCOLL_OK || lo != hi)
            FAIL("sparse count=%zu pattern %d: results differ between ranks", count, pattern);
    }
    free(idx);
    free(val);
    free(out);
    free(want);
}

static int run_sparse(void)
{
    const size_t counts[] = {1, 97, 100003};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t count = counts[c];
        check_sparse(count, 0, 0, GCOLL_SUM, 0); /* empty everywhere */
        for (int pattern = 0; pattern < 4; pattern++) {
            size_t n = pattern == 3 ? count : GCOLL_SPARSE_N(count);
            check_sparse(count, n, pattern, pattern % 2 ? GCOLL_AVG : GCOLL_SUM, 0);
        }
    }
    check_sparse(1000, 20000, 0, GCOLL_SUM, 0); /* many repeats: nnz > dense size */
    check_sparse(5000, 300, 0, GCOLL_SUM, 1); /* empty on some ranks only */
    check_sparse(200000, 20000, 1, GCOLL_SUM, 0); /* large enough for split under auto */
    /* bad arguments are local errors */
    uint32_t bad_idx[2] = {0, 100};
    float v[2] = {1, 2}, out[10], nan_v[1] = {NAN};
    checks += 3;
    if (gcoll_sparse_allreduce(comm, bad_idx, v, 2, 10, out, GCOLL_SUM) != GCOLL_ERR_INVALID)
        FAIL("sparse: index beyond dense_count accepted");
    if (gcoll_sparse_allreduce(comm, bad_idx, nan_v, 1, 10, out, GCOLL_SUM) != GCOLL_ERR_INVALID)
        FAIL("sparse: NaN value accepted");
    if (gcoll_sparse_allreduce(comm, bad_idx, v, 1, 10, out, GCOLL_MAX) != GCOLL_ERR_INVALID)
        FAIL("sparse: op max accepted");
    return failures;
}

/* ---- compressed allreduce ---- */

static float grad_of(int r, int step, size_t k)
{
    return sinf((float)k * 0.37f + (float)r * 1.3f + (float)step * 0.7f) * (float)(1 + k % 13);
}

/* The collective's chunking: a balanced split of count over the ranks. */
static void chunk_of(size_t count, int j, size_t *off, size_t *len)
{
    size_t base = count / (size_t)size, extra = count % (size_t)size;
    *off = (size_t)j * base + ((size_t)j < extra ? (size_t)j : extra);
    *len = base + ((size_t)j < extra);
}

/* Simulates every rank's codec with the public codec API and returns what the compressed
 * allreduce must produce: the sum of what each rank's codec sent (quantizers: the
 * re-compressed sum of each chunk). The simulated worker states are returned so the
 * caller can compare residuals. */
static void simulate(gcoll_compressor_t *c, gcoll_tensor_state_t **ws, gcoll_tensor_state_t **ss,
                     int step, size_t count, int quantizer, gcoll_op_t op, float *want)
{
    size_t cap = gcoll_compressor_bound(c, count), len;
    uint8_t *msg = malloc(cap);
    float *g = malloc(count * sizeof(float)), *acc = calloc(count + 1, sizeof(float));
    for (int i = 0; i < size; i++) {
        for (size_t k = 0; k < count; k++)
            g[k] = grad_of(i, step, k);
        if (!quantizer) {
            if (gcoll_encode(c, ws[i], g, count, msg, cap, &len) != GCOLL_OK ||
                gcoll_decode(c, msg, len, acc, count, 1) != GCOLL_OK)
                FAIL("simulated encode failed");
            continue;
        }
        for (int j = 0; j < size; j++) {
            size_t off, n;
            chunk_of(count, j, &off, &n);
            if (gcoll_encode_chunk(c, ws[i], off, g + off, n, msg, cap, &len) != GCOLL_OK ||
                gcoll_decode(c, msg, len, acc + off, n, i > 0) != GCOLL_OK)
                FAIL("simulated chunk encode failed");
        }
        gcoll_state_advance(ws[i]);
    }
    if (op == GCOLL_AVG)
        for (size_t k = 0; k < count; k++)
            acc[k] /= (float)size;
    if (quantizer) {
        for (int j = 0; j < size; j++) {
            size_t off, n;
            chunk_of(count, j, &off, &n);
            if (gcoll_encode(c, ss[j], acc + off, n, msg, cap, &len) != GCOLL_OK ||
                gcoll_decode(c, msg, len, want + off, n, 0) != GCOLL_OK)
                FAIL("simulated server encode failed");
        }
    } else {
        memcpy(want, acc, count * sizeof(float));
    }
    free(msg);
    free(g);
    free(acc);
}

static void check_compressed(const char *spec, size_t count, gcoll_op_t op)
{
    gcoll_compressor_t *c;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK) {
        FAIL("compressor '%s' not created", spec);
        return;
    }
    unsigned fl = gcoll_compressor_flags(c);
    int quantizer = !(fl & GCOLL_CODEC_SPARSE) && !((fl & GCOLL_CODEC_LOSSLESS) && strncmp(spec, "none", 4) == 0);
    int stochastic = (fl & GCOLL_CODEC_STOCHASTIC) != 0;
    gcoll_tensor_state_t *st = NULL, **ws = calloc((size_t)size, sizeof(*ws)),
                         **ss = calloc((size_t)size, sizeof(*ss));
    gcoll_state_create(c, count, &st);
    for (int i = 0; i < size; i++) {
        size_t off, n;
        chunk_of(count, i, &off, &n);
        gcoll_state_create(c, count, &ws[i]);
        gcoll_state_create(c, n, &ss[i]);
    }
    float *g = malloc((count + 1) * sizeof(float)), *out = malloc((count + 1) * sizeof(float)),
          *want = malloc((count + 1) * sizeof(float));
    for (int step = 0; step < 3; step++) {
        for (size_t k = 0; k < count; k++)
            g[k] = grad_of(rank, step, k);
        gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, count, op);
        checks++;
        if (rc != GCOLL_OK) {
            FAIL("compressed '%s' step %d: %s (%s)", spec, step, gcoll_status_string(rc),
                 gcoll_comm_last_error(comm));
            break;
        }
        simulate(c, ws, ss, step, count, quantizer, op, want);
        double err = 0, norm = 0;
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < count; k++) {
            /* exact up to float summation order: inputs are at most 13 in magnitude */
            double tol = 1e-5 * fabs(want[k]) + 4e-6 * 13 * size;
            err += (out[k] - want[k]) * (out[k] - want[k]);
            norm += want[k] * want[k];
            if (!(fabs(out[k] - want[k]) <= tol) && !bad++)
                first = k;
        }
        if (stochastic) {
            /* QSGD draws per-rank rounding noise the simulation cannot reproduce: check
             * the result is a plausible estimate of the exact sum instead (without error
             * feedback: QSGD is unbiased but not a contraction, so feedback can grow) */
            double e2 = 0, n2 = 0;
            for (size_t k = 0; k < count; k++) {
                double exact = 0;
                for (int i = 0; i < size; i++)
                    exact += grad_of(i, step, k);
                if (op == GCOLL_AVG)
                    exact /= size;
                e2 += (out[k] - exact) * (out[k] - exact);
                n2 += exact * exact;
            }
            if (!(e2 < n2))
                FAIL("compressed '%s' step %d: relative error %.3f", spec, step, sqrt(e2 / n2));
        } else if (bad) {
            FAIL("compressed '%s' step %d: %zu of %zu wrong, first at %zu: got %g want %g "
                 "(rel l2 %.2g)", spec, step, bad, count, first, out[first], want[first],
                 sqrt(err / (norm + 1e-30)));
        }
        /* the residual carried to the next step is exactly what the codec left behind */
        const float *res = gcoll_state_residual(st), *sres = gcoll_state_residual(ws[rank]);
        if (!stochastic && res && sres && memcmp(res, sres, count * sizeof(float)) != 0)
            FAIL("compressed '%s' step %d: residual differs from the codec's", spec, step);
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < count * sizeof(float); i++)
            h = (h ^ ((uint8_t *)out)[i]) * 1099511628211ull;
        uint64_t lo = h, hi = h;
        if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_INT64, GCOLL_MIN) != GCOLL_OK ||
            gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_INT64, GCOLL_MAX) != GCOLL_OK || lo != hi)
            FAIL("compressed '%s' step %d: results differ between ranks", spec, step);
    }
    /* reduce-scatter: this rank's shard of the worker-compressed sum */
    size_t off, n;
    gcoll_shard_range(comm, count, &off, &n);
    if (quantizer && !stochastic) {
        for (size_t k = 0; k < count; k++)
            g[k] = grad_of(rank, 3, k);
        checks++;
        gcoll_status_t rc = gcoll_compressed_reduce_scatter(comm, st, g, out, count, op);
        if (rc != GCOLL_OK)
            FAIL("compressed reduce_scatter '%s': %s", spec, gcoll_status_string(rc));
        /* the reduce-scatter is the first half of the simulation */
        size_t cap = gcoll_compressor_bound(c, count), len;
        uint8_t *msg = malloc(cap);
        float *acc = calloc(n + 1, sizeof(float)), *gi = malloc(count * sizeof(float));
        for (int i = 0; i < size; i++) {
            for (size_t k = 0; k < count; k++)
                gi[k] = grad_of(i, 3, k);
            gcoll_encode_chunk(c, ws[i], off, gi + off, n, msg, cap, &len);
            gcoll_decode(c, msg, len, acc, n, i > 0);
        }
        for (size_t k = 0; rc == GCOLL_OK && k < n; k++) {
            float w = op == GCOLL_AVG ? acc[k] / (float)size : acc[k];
            if (out[k] != w) {
                FAIL("compressed reduce_scatter '%s': wrong at %zu: %g vs %g", spec, k, out[k], w);
                break;
            }
        }
        free(msg);
        free(acc);
        free(gi);
    }
    free(g);
    free(out);
    free(want);
    for (int i = 0; i < size; i++) {
        gcoll_state_destroy(ws[i]);
        gcoll_state_destroy(ss[i]);
    }
    free(ws);
    free(ss);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
}

static int run_compressed(void)
{
    static const char *const specs[] = {
        "none", "fp16", "bf16", "q8", "sign", "sign:scale=l2", "qsgd:bits=8,ef=0",
        "topk:density=0.01", "topk:density=0.05,select=sample", "topk:density=0.01+q8",
        "topk:density=0.01,ef=0", "threshold:tau=8", "randomk:density=0.05,seed=3",
        "randomk:density=0.05,seed=3,unbiased=1", "dgc:density=0.01,momentum=0.9",
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        check_compressed(specs[i], 30011, i % 2 ? GCOLL_AVG : GCOLL_SUM);
    check_compressed("topk:density=0.02", 7, GCOLL_SUM); /* fewer elements than ranks */
    /* bad input is a local error */
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *st;
    gcoll_compressor_create("fp16", &c);
    gcoll_state_create(c, 10, &st);
    float g[10] = {0}, out[10];
    g[3] = NAN;
    checks += 2;
    if (gcoll_compressed_allreduce(comm, st, g, out, 10, GCOLL_SUM) != GCOLL_ERR_INVALID)
        FAIL("compressed: NaN accepted");
    if (gcoll_compressed_allreduce(comm, st, g, out, 9, GCOLL_SUM) != GCOLL_ERR_INVALID)
        FAIL("compressed: count differing from the state accepted");
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    return failures;
}

/* ---- bucketer ---- */

static const struct {
    const char *name;
    size_t count;
} layers[] = {
    /* backward order: the network's last layer first */
    {"fc3.bias", 10},       {"fc3.weight", 2560},  {"norm2.weight", 256}, {"fc2.bias", 256},
    {"fc2.weight", 65536},  {"fc1.bias", 512},     {"fc1.weight", 200704},
};
#define NLAYERS ((int)(sizeof(layers) / sizeof(layers[0])))

static float layer_val(int r, int step, int l, size_t i)
{
    return (float)((int)((i * 7 + (size_t)l * 5 + (size_t)r * 3 + (size_t)step) % 19) - 9);
}

/* Ready order: a different permutation on every rank. */
static void ready_all(gcoll_bucketer_t *b, const int *id, int skip)
{
    for (int k = 0; k < NLAYERS; k++) {
        int l = (k * 3 + rank * 5 + 1) % NLAYERS;
        if (l != skip && gcoll_bucketer_ready(b, id[l]) != GCOLL_OK)
            FAIL("bucketer_ready(%s)", layers[l].name);
    }
}

static void check_bucketer_dense(int accumulate)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024, .op = GCOLL_AVG,
                                   .default_spec = "none", .accumulate_steps = accumulate};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create");
        return;
    }
    float *g[NLAYERS];
    int id[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = malloc(layers[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    for (int step = 0; step < 2 * accumulate; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                g[l][i] = layer_val(rank, step, l, i);
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("bucketer_wait: %s", gcoll_comm_last_error(comm));
            break;
        }
        int comm_step = (step + 1) % accumulate == 0;
        for (int l = 0; l < NLAYERS; l++) {
            for (size_t i = 0; i < layers[l].count; i++) {
                double want = 0;
                if (!comm_step) {
                    want = layer_val(rank, step, l, i); /* untouched: accumulated locally */
                } else {
                    for (int r = 0; r < size; r++)
                        for (int s2 = step + 1 - accumulate; s2 <= step; s2++)
                            want += layer_val(r, s2, l, i);
                    want /= size;
                }
                if (fabs(g[l][i] - want) > 1e-6 * (fabs(want) + 1)) {
                    FAIL("bucketer (accumulate %d) step %d %s[%zu]: got %g want %g", accumulate,
                         step, layers[l].name, i, g[l][i], want);
                    l = NLAYERS;
                    break;
                }
            }
        }
    }
    if (gcoll_bucketer_num_buckets(b) < 3)
        FAIL("bucketer made %d buckets, expected several", gcoll_bucketer_num_buckets(b));
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
}

/* One bucket of one codec equals the compressed allreduce of the fused tensors, step
 * after step (the bucket's residual carries over like a tensor state's). */
static void check_bucketer_compressed(const char *spec)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 64 << 20, .op = GCOLL_SUM,
                                   .default_spec = spec};
    gcoll_bucketer_t *b;
    gcoll_bucketer_create(comm, &cfg, &b);
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *st;
    size_t total = 0;
    for (int l = 0; l < NLAYERS; l++)
        total += layers[l].count;
    gcoll_compressor_create(spec, &c);
    gcoll_state_create(c, total, &st);
    float *g[NLAYERS], *fused = malloc(total * sizeof(float)), *ref = malloc(total * sizeof(float));
    int id[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = malloc(layers[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    for (int step = 0; step < 2; step++) {
        size_t off = 0;
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                fused[off++] = g[l][i] = layer_val(rank, step, l, i) * 0.37f;
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK ||
            gcoll_compressed_allreduce(comm, st, fused, ref, total, GCOLL_SUM) != GCOLL_OK) {
            FAIL("bucketer %s: %s", spec, gcoll_comm_last_error(comm));
            break;
        }
        off = 0;
        for (int l = 0; l < NLAYERS; l++, off += layers[l - 1].count)
            if (memcmp(g[l], ref + off, layers[l].count * sizeof(float)) != 0) {
                FAIL("bucketer %s step %d: %s differs from the compressed allreduce", spec, step,
                     layers[l].name);
                break;
            }
    }
    if (gcoll_bucketer_num_buckets(b) != 1)
        FAIL("bucketer %s: %d buckets, expected 1", spec, gcoll_bucketer_num_buckets(b));
    gcoll_bucketer_destroy(b);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
    free(fused);
    free(ref);
}

static void check_bucketer_errors(void)
{
    gcoll_bucketer_t *b;
    gcoll_bucketer_config_t bad = {.policy = "*bias*=none;size<oops=fp16;*=topk:density=0.01"};
    checks += 4;
    if (gcoll_bucketer_create(comm, &bad, &b) != GCOLL_ERR_INVALID ||
        !strstr(gcoll_comm_last_error(comm), "size<oops=fp16"))
        FAIL("bad policy rule not named: '%s'", gcoll_comm_last_error(comm));
    gcoll_bucketer_config_t badspec = {.policy = "fc*=topk:density=7"};
    if (gcoll_bucketer_create(comm, &badspec, &b) != GCOLL_ERR_INVALID ||
        !strstr(gcoll_comm_last_error(comm), "fc*=topk:density=7"))
        FAIL("bad compressor in a policy rule not named: '%s'", gcoll_comm_last_error(comm));
    gcoll_bucketer_config_t ok = {.default_spec = "none"};
    gcoll_bucketer_create(comm, &ok, &b);
    float x[4];
    int id;
    gcoll_bucketer_add_tensor(b, "w", x, 4, GCOLL_FLOAT32, NULL, &id);
    if (gcoll_bucketer_add_tensor(b, "w", x, 3, GCOLL_FLOAT32, NULL, &id) != GCOLL_ERR_INVALID)
        FAIL("re-registration accepted");
    if (gcoll_bucketer_ready(b, 99) != GCOLL_ERR_INVALID)
        FAIL("ready on an unknown tensor accepted");
    gcoll_bucketer_ready(b, 0);
    gcoll_bucketer_wait(b);
    gcoll_bucketer_destroy(b);
}

static int run_bucketer(void)
{
    check_bucketer_dense(1);
    check_bucketer_dense(2);
    check_bucketer_compressed("topk:density=0.01+q8");
    check_bucketer_compressed("sign");
    check_bucketer_errors();
    return failures;
}

/* GCOLL_ADAPT (set by the caller): every rank measures its own (noisy) times, yet all
 * must pick the same densities at every step, within the configured bounds. */
static int run_adapt(void)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024, .op = GCOLL_AVG,
                                   .policy = "*bias*=none;*=topk:density=0.01"};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return failures;
    }
    float *g[NLAYERS];
    int id[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = malloc(layers[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    int changed = 0;
    double first = -1;
    for (int step = 0; step < 12; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                g[l][i] = layer_val(rank, step, l, i) * (step < 6 ? 1.0f : 5.0f);
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("adapt step %d: %s", step, gcoll_comm_last_error(comm));
            break;
        }
        for (int k = 0; k < gcoll_bucketer_num_buckets(b); k++) {
            double d = gcoll_bucketer_density(b, k), lo = d, hi = d;
            if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
                gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK ||
                lo != hi)
                FAIL("adapt step %d bucket %d: ranks chose different densities (%g..%g)", step,
                     k, lo, hi);
            if (d != 1.0 && (d < 0.001 - 1e-12 || d > 0.2 + 1e-12))
                FAIL("adapt step %d bucket %d: density %g outside [0.001, 0.2]", step, k, d);
            if (k == gcoll_bucketer_num_buckets(b) - 1 && d != 1.0) {
                if (first < 0)
                    first = d;
                changed |= d != first;
            }
        }
    }
    printf("rank %d: adaptation kept densities equal on every rank; last bucket's density now "
           "%g%s\n", rank, gcoll_bucketer_density(b, gcoll_bucketer_num_buckets(b) - 1),
           changed ? " (changed during the run)" : "");
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
    return failures;
}

/* Rank `victim` never marks fc2.weight ready: it reports that tensor, the others time out
 * in its bucket with an error naming the bucket. */
static int run_bucket_missing(int victim)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024, .default_spec = "none"};
    gcoll_bucketer_t *b;
    gcoll_bucketer_create(comm, &cfg, &b);
    float *g[NLAYERS];
    int id[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = calloc(layers[l].count, sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    double t0 = now();
    ready_all(b, id, rank == victim ? 4 : -1);
    gcoll_status_t st = gcoll_bucketer_wait(b);
    const char *err = gcoll_comm_last_error(comm);
    if (st == GCOLL_OK)
        FAIL("missing ready() went unnoticed");
    else if (rank == victim && !strstr(err, "fc2.weight"))
        FAIL("the rank that skipped ready() does not name the tensor: %s", err);
    else if (rank != victim && !strstr(err, "bucket"))
        FAIL("the others' error does not name the bucket: %s", err);
    else
        printf("rank %d: missing ready() failed as expected after %.2f s: %s | %s\n", rank,
               now() - t0, gcoll_status_string(st), err);
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
    return failures;
}

/* Several nonblocking allreduces in flight at once, completed out of order. */
static void check_nonblocking(void)
{
    enum { N = 4 };
    size_t count = 100003;
    float *buf[N];
    gcoll_request_t *req[N];
    for (int k = 0; k < N; k++) {
        buf[k] = malloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            buf[k][i] = (float)(input(rank, i, GCOLL_SUM) + k);
        if (gcoll_iallreduce(comm, buf[k], buf[k], count, GCOLL_FLOAT32, GCOLL_SUM, &req[k]))
            FAIL("iallreduce %d could not be queued", k);
    }
    int done = 0;
    gcoll_test(req[N - 1], &done); /* either answer is fine; it must not block */
    for (int k = N - 1; k >= 0; k--) {
        checks++;
        gcoll_status_t st = gcoll_wait(req[k]);
        if (st != GCOLL_OK) {
            FAIL("iallreduce %d: %s", k, gcoll_status_string(st));
            continue;
        }
        for (size_t i = 0; i < count; i++)
            if (buf[k][i] != (float)(expected(i, GCOLL_FLOAT32, GCOLL_SUM) + k * size)) {
                FAIL("iallreduce %d wrong at %zu", k, i);
                break;
            }
    }
    for (int k = 0; k < N; k++)
        free(buf[k]);
    gcoll_request_t *b;
    if (gcoll_ibarrier(comm, &b) != GCOLL_OK || gcoll_wait(b) != GCOLL_OK)
        FAIL("ibarrier");
}

static void check_bad_args(void)
{
    float x[4] = {0};
    struct {
        const char *what;
        gcoll_status_t st;
    } cases[] = {
        {"NULL sendbuf", gcoll_allreduce(comm, NULL, x, 4, GCOLL_FLOAT32, GCOLL_SUM)},
        {"NULL recvbuf", gcoll_allreduce(comm, x, NULL, 4, GCOLL_FLOAT32, GCOLL_SUM)},
        {"bad dtype", gcoll_allreduce(comm, x, x, 4, (gcoll_dtype_t)42, GCOLL_SUM)},
        {"bad op", gcoll_allreduce(comm, x, x, 4, GCOLL_FLOAT32, (gcoll_op_t)42)},
        {"huge count", gcoll_allreduce(comm, x, x, SIZE_MAX / 2, GCOLL_FLOAT32, GCOLL_SUM)},
        {"root -1", gcoll_broadcast(comm, x, 4, GCOLL_FLOAT32, -1)},
        {"root = size", gcoll_broadcast(comm, x, 4, GCOLL_FLOAT32, size)},
        {"NULL comm", gcoll_allreduce(NULL, x, x, 4, GCOLL_FLOAT32, GCOLL_SUM)},
        {"NULL request", gcoll_wait(NULL)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        checks++;
        if (cases[i].st != GCOLL_ERR_INVALID)
            FAIL("%s: got %s, want GCOLL_ERR_INVALID", cases[i].what,
                 gcoll_status_string(cases[i].st));
    }
    if (!strstr(gcoll_comm_last_error(comm), "gcoll_"))
        FAIL("last_error does not describe the bad argument: '%s'", gcoll_comm_last_error(comm));
}

/* Allreduce only, for each forced algorithm (GCOLL_ALGO set by the caller). */
static int run_allreduce(void)
{
    const size_t counts[] = {0, 1, 2, 7, 1000, 65537, 1000003};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                check_allreduce(counts[c], dtypes[d], ops[o], (int)((c + o) % 2));
    return failures;
}

static int run_all(void)
{
    run_gathers();
    const size_t counts[] = {0, 1, 7, 1000003};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                for (int inplace = 0; inplace < 2; inplace++)
                    check_allreduce(counts[c], dtypes[d], ops[o], inplace);
    for (int root = 0; root < size; root++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            check_broadcast(counts[c], root % 2 ? GCOLL_FLOAT16 : GCOLL_INT32, root);
    check_broadcast(300001, GCOLL_FLOAT64, size - 1); /* large: chain path */
    for (int k = 0; k < 3; k++) {
        checks++;
        if (gcoll_barrier(comm) != GCOLL_OK)
            FAIL("barrier");
    }
    check_nonblocking();
    check_bad_args();
    /* Bad arguments are local errors: the communicator still works. */
    check_allreduce(1000, GCOLL_FLOAT32, GCOLL_SUM, 0);
    gcoll_counters_t ctr;
    if (gcoll_comm_counters(comm, &ctr) != GCOLL_OK || ctr.ops == 0 ||
        (size > 1 && ctr.bytes_sent == 0))
        FAIL("counters not updated");
    return failures;
}

/* ---- failure scenarios -------------------------------------------------------------- */

static int expect_error(gcoll_status_t st, const char *what, double t0, double limit)
{
    double dt = now() - t0;
    if (st == GCOLL_OK) {
        FAIL("%s succeeded, expected an error", what);
        return 1;
    }
    if (dt > limit) {
        FAIL("%s took %.1f s to fail (limit %.1f s)", what, dt, limit);
        return 1;
    }
    printf("rank %d: %s failed as expected after %.2f s: %s | %s\n", rank, what, dt,
           gcoll_status_string(st), gcoll_comm_last_error(comm));
    gcoll_status_t again = gcoll_barrier(comm);
    if (again != GCOLL_ERR_ABORTED) {
        FAIL("a call after the failure returned %s, expected GCOLL_ERR_ABORTED",
             gcoll_status_string(again));
        return 1;
    }
    return 0;
}

static double timeout_s(void)
{
    const char *t = getenv("GCOLL_TIMEOUT_MS");
    return t ? atof(t) / 1000.0 : 300.0;
}

/* Rank `victim` dies in the middle of a large allreduce; the others must fail fast. */
static int run_die(int victim)
{
    size_t count = 4 << 20;
    float *x = calloc(count, sizeof(float));
    if (gcoll_allreduce(comm, x, x, 1000, GCOLL_FLOAT32, GCOLL_SUM) != GCOLL_OK)
        FAIL("warm-up allreduce");
    if (rank == victim) {
        gcoll_request_t *req;
        gcoll_iallreduce(comm, x, x, count, GCOLL_FLOAT32, GCOLL_SUM, &req);
        usleep(20000);
        printf("rank %d: exiting in the middle of an allreduce\n", rank);
        fflush(stdout);
        _exit(3);
    }
    double t0 = now();
    gcoll_status_t st = gcoll_allreduce(comm, x, x, count, GCOLL_FLOAT32, GCOLL_SUM);
    free(x);
    return expect_error(st, "allreduce with a dead peer", t0, timeout_s() + 5);
}

/* Rank `victim` stays silent past the timeout; the others must time out, not hang. */
static int run_silent(int victim)
{
    float x[100] = {0};
    double t0 = now();
    if (rank == victim) {
        usleep((useconds_t)((timeout_s() * 2 + 1) * 1e6));
        gcoll_status_t st = gcoll_allreduce(comm, x, x, 100, GCOLL_FLOAT32, GCOLL_SUM);
        if (st == GCOLL_OK)
            FAIL("allreduce after the others gave up succeeded");
        return failures;
    }
    gcoll_status_t st = gcoll_allreduce(comm, x, x, 100, GCOLL_FLOAT32, GCOLL_SUM);
    return expect_error(st, "allreduce with a silent peer", t0, timeout_s() * 2 + 5);
}

/* Rank `victim` passes a different count to collective `which`: every rank must report
 * GCOLL_ERR_MISMATCH. */
static int run_mismatch(int victim, const char *which)
{
    size_t count = 10000 + (rank == victim ? 1 : 0);
    float *x = calloc(count * (size_t)size + 1, sizeof(float)),
          *y = calloc(count * (size_t)size + 1, sizeof(float));
    double t0 = now();
    gcoll_status_t st;
    if (strcmp(which, "allgather") == 0)
        st = gcoll_allgather(comm, x, y, count, GCOLL_FLOAT32);
    else if (strcmp(which, "reduce_scatter") == 0)
        st = gcoll_reduce_scatter(comm, x, y, count, GCOLL_FLOAT32, GCOLL_SUM);
    else if (strcmp(which, "alltoall") == 0)
        st = gcoll_alltoall(comm, x, y, count, GCOLL_FLOAT32);
    else if (strcmp(which, "broadcast") == 0)
        st = gcoll_broadcast(comm, x, count, GCOLL_FLOAT32, victim == 0 ? 1 : 0);
    else if (strcmp(which, "codec") == 0 || strcmp(which, "tensor") == 0 ||
             strcmp(which, "sparsecodec") == 0) {
        /* compressed allreduce with another codec, or a tensor of another size */
        const char *spec = strcmp(which, "sparsecodec") == 0
                               ? (rank == victim ? "topk:density=0.01+q8" : "topk:density=0.01")
                               : (strcmp(which, "codec") == 0 && rank == victim ? "bf16" : "fp16");
        size_t n = strcmp(which, "tensor") == 0 ? count : 10000;
        gcoll_compressor_t *c;
        gcoll_tensor_state_t *s;
        gcoll_compressor_create(spec, &c);
        gcoll_state_create(c, n, &s);
        st = gcoll_compressed_allreduce(comm, s, x, y, n, GCOLL_SUM);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    } else if (strcmp(which, "op") == 0) /* same count, different op */
        st = gcoll_allreduce(comm, x, x, 10000, GCOLL_FLOAT32, rank == victim ? GCOLL_MAX : GCOLL_SUM);
    else
        st = gcoll_allreduce(comm, x, x, count, GCOLL_FLOAT32, GCOLL_SUM);
    if (st == GCOLL_OK && strcmp(which, "broadcast") == 0) {
        /* In a broadcast data only flows down the tree: the root and ranks whose subtree
         * holds no mismatched rank finish without seeing it. The detecting rank's abort
         * reaches them, and their next call reports the mismatch. */
        usleep(300000);
        st = gcoll_barrier(comm);
    }
    free(x);
    free(y);
    if (st != GCOLL_ERR_MISMATCH)
        FAIL("mismatched %s gave %s (%s), expected GCOLL_ERR_MISMATCH", which,
             gcoll_status_string(st), gcoll_comm_last_error(comm));
    else
        expect_error(st, "call with mismatched arguments", t0, timeout_s() + 5);
    return failures;
}

static void *abort_later(void *arg)
{
    (void)arg;
    usleep(300000);
    gcoll_comm_abort(comm);
    return NULL;
}

/* Rank 0 aborts from another thread while it waits in a barrier the others join late:
 * rank 0's barrier must return, and the others must fail at once instead of timing out. */
static int run_abort(void)
{
    pthread_t th;
    double t0 = now();
    gcoll_status_t st;
    if (rank == 0) {
        pthread_create(&th, NULL, abort_later, NULL);
        st = gcoll_barrier(comm);
        pthread_join(th, NULL);
        if (st != GCOLL_ERR_ABORTED)
            FAIL("aborted barrier returned %s, expected GCOLL_ERR_ABORTED",
                 gcoll_status_string(st));
    } else {
        usleep(1000000);
        st = gcoll_barrier(comm);
    }
    return expect_error(st, "barrier interrupted by gcoll_comm_abort", t0, timeout_s() + 5);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    int victim = argc > 2 ? atoi(argv[2]) : 1;
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        fprintf(stderr, "coll_check: gcoll_comm_init: %s\n", gcoll_status_string(st));
        return 1;
    }
    rank = gcoll_comm_rank(comm);
    size = gcoll_comm_size(comm);
    double t0 = now();
    int bad;
    if (strcmp(mode, "all") == 0)
        bad = run_all();
    else if (strcmp(mode, "adapt") == 0)
        bad = run_adapt();
    else if (strcmp(mode, "bucketer") == 0)
        bad = run_bucketer();
    else if (strcmp(mode, "bucket_missing") == 0)
        bad = run_bucket_missing(victim);
    else if (strcmp(mode, "compressed") == 0)
        bad = run_compressed();
    else if (strcmp(mode, "sparse") == 0)
        bad = run_sparse();
    else if (strcmp(mode, "allreduce") == 0)
        bad = run_allreduce();
    else if (strcmp(mode, "die") == 0)
        bad = run_die(victim);
    else if (strcmp(mode, "silent") == 0)
        bad = run_silent(victim);
    else if (strcmp(mode, "mismatch") == 0)
        bad = run_mismatch(victim, argc > 3 ? argv[3] : "allreduce");
    else if (strcmp(mode, "abort") == 0)
        bad = run_abort();
    else {
        fprintf(stderr, "coll_check: unknown mode '%s'\n", mode);
        return 2;
    }
    gcoll_comm_destroy(comm);
    if (bad) {
        fprintf(stderr, "rank %d: %d of %d checks FAILED\n", rank, failures, checks);
        return 1;
    }
    printf("rank %d/%d: %s: %d checks passed in %.2f s\n", rank, size, mode, checks,
           now() - t0);
    return 0;
}
