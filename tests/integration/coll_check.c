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

#include "check.h"

int rank, size, failures, checks;
gcoll_comm_t *comm;

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
int input(int r, size_t i, gcoll_op_t op)
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
    /* clang-format off */
    switch (dt) {
    case GCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case GCOLL_FLOAT64: ((double *)buf)[i] = v; break;
    case GCOLL_INT32: ((int32_t *)buf)[i] = v; break;
    case GCOLL_INT64: ((int64_t *)buf)[i] = v; break;
    case GCOLL_FLOAT16: ((uint16_t *)buf)[i] = int_to_half(v); break;
    case GCOLL_BFLOAT16: ((uint16_t *)buf)[i] = int_to_bf16(v); break;
    default: break; /* the other dtypes: check_dtypes.c */
    }
    /* clang-format on */
}

static double load(const void *buf, size_t i, gcoll_dtype_t dt)
{
    /* clang-format off */
    switch (dt) {
    case GCOLL_FLOAT32: return ((const float *)buf)[i];
    case GCOLL_FLOAT64: return ((const double *)buf)[i];
    case GCOLL_INT32: return ((const int32_t *)buf)[i];
    case GCOLL_INT64: return (double)((const int64_t *)buf)[i];
    case GCOLL_FLOAT16: return half_to_double(((const uint16_t *)buf)[i]);
    case GCOLL_BFLOAT16: return bf16_to_double(((const uint16_t *)buf)[i]);
    default: break;
    }
    /* clang-format on */
    return NAN;
}

double expected(size_t i, gcoll_dtype_t dt, gcoll_op_t op)
{
    long acc = input(0, i, op);
    for (int r = 1; r < size; r++) {
        long v = input(r, i, op);
        /* clang-format off */
        switch (op) {
        case GCOLL_SUM:
        case GCOLL_AVG: acc += v; break;
        case GCOLL_PROD: acc *= v; break;
        case GCOLL_MIN: acc = v < acc ? v : acc; break;
        case GCOLL_MAX: acc = v > acc ? v : acc; break;
        default: break;
        }
        /* clang-format on */
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
    double rel = dt == GCOLL_FLOAT16    ? 1.0 / 1024
                 : dt == GCOLL_BFLOAT16 ? 1.0 / 128
                 : dt == GCOLL_FLOAT32  ? 1.2e-7
                 : dt == GCOLL_FLOAT64  ? 1e-15
                                        : 0;
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
        FAIL("allreduce count=%zu %s %s%s: %s (%s)", count, gcoll_dtype_name(dt), gcoll_op_name(op),
             inplace ? " in place" : "", gcoll_status_string(st), gcoll_comm_last_error(comm));
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
                 gcoll_dtype_name(dt), gcoll_op_name(op), inplace ? " in place" : "", wrong, first,
                 load(recv, first, dt), expected(first, dt, op));
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
static int blockval(int r, size_t i)
{
    return (int)((r * 31 + (int)(i % 61)) % 97) - 48;
}

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
    size_t *counts = calloc((size_t)size, sizeof(size_t)),
           *displs = calloc((size_t)size, sizeof(size_t));
    size_t total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = variable ? unit * (size_t)((r * 3 + 1) % 4) : unit; /* some ranks send 0 */
        displs[r] = total + (variable ? 3 : 0);                         /* gaps between blocks */
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
        acc = l->op == GCOLL_PROD  ? acc * v
              : l->op == GCOLL_MIN ? (v < acc ? v : acc)
              : l->op == GCOLL_MAX ? (v > acc ? v : acc)
                                   : acc + v;
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
        FAIL("reduce_scatter n=%zu: %s (%s)", n, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
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

/* Every rank must end with the same bits, whatever the order each algorithm combines in:
 * float inputs with fractions (sums round differently in another order), and MAX over
 * +0 and -0 (equal, so the order decides which one is kept). Checked by gathering every
 * rank's result. */
static void check_identical(size_t count, gcoll_op_t op)
{
    float *x = malloc(count * sizeof(float)), *all = malloc(count * size * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 7);
        x[i] = op == GCOLL_MAX ? ((h >> 3) % 2 ? 0.0f : -0.0f) : (float)(h % 100003) / 7.0f;
    }
    checks++;
    if (gcoll_allreduce(comm, x, x, count, GCOLL_FLOAT32, op) != GCOLL_OK ||
        gcoll_allgather(comm, x, all, count, GCOLL_FLOAT32) != GCOLL_OK)
        FAIL("identical results, count %zu %s: %s", count, gcoll_op_name(op),
             gcoll_comm_last_error(comm));
    else
        for (int r = 1; r < size; r++)
            if (memcmp(all, all + (size_t)r * count, count * sizeof(float)) != 0) {
                FAIL("allreduce count=%zu %s: rank %d's result differs from rank 0's", count,
                     gcoll_op_name(op), r);
                break;
            }
    free(x);
    free(all);
}

/* Allreduce only, for each forced algorithm (GCOLL_ALGO set by the caller). */
static int run_allreduce(void)
{
    const size_t idcounts[] = {1, 5, 4099, 300007};
    for (size_t c = 0; c < sizeof(idcounts) / sizeof(idcounts[0]); c++) {
        check_identical(idcounts[c], GCOLL_SUM);
        check_identical(idcounts[c], GCOLL_MAX);
    }
    const size_t counts[] = {0, 1, 2, 7, 1000, 65537, 1000003};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
            for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
                check_allreduce(counts[c], dtypes[d], ops[o], (int)((c + o) % 2));
    run_dtypes();
    return failures;
}

static int run_all(void)
{
    run_gathers();
    run_dtypes();
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

/* The victim leaves `us` microseconds into the operation it has just started. */
static void exit_during(const char *what, useconds_t us)
{
    usleep(us);
    printf("rank %d: exiting in the middle of %s\n", rank, what);
    fflush(stdout);
    _exit(3);
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
        exit_during("an allreduce", 20000);
    }
    double t0 = now();
    gcoll_status_t st = gcoll_allreduce(comm, x, x, count, GCOLL_FLOAT32, GCOLL_SUM);
    free(x);
    return expect_error(st, "allreduce with a dead peer", t0, timeout_s() + 5);
}

/* The same in the middle of a compressed allreduce whose top-k selection pass is on the
 * wire (the test sets GCOLL_TOPK_STREAM small): the victim exits while segments are
 * streaming, the others fail fast instead of waiting for its trailer. */
static int run_die_stream(int victim)
{
    /* large enough that the victim's pass cannot be done 5 ms in (a victim that sent its
     * whole part before leaving would let the others finish, rightly) */
    size_t count = 1 << 24;
    float *x = malloc(count * sizeof(float)), *y = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        x[i] = (float)((i * 2654435761u + (size_t)rank) % 1000) - 500.0f;
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *s;
    gcoll_compressor_create("topk:density=0.01", &c);
    gcoll_state_create(c, count, &s);
    const char *sc = gcoll_compressed_scheme(comm, c, count, 0, NULL);
    if (!sc || strcmp(sc, "streamed sparse") != 0)
        FAIL("scheme %s, expected the streamed one (GCOLL_TOPK_STREAM)", sc ? sc : "(none)");
    if (gcoll_compressed_allreduce(comm, s, x, y, count, GCOLL_SUM) != GCOLL_OK)
        FAIL("warm-up compressed allreduce");
    if (rank == victim) {
        gcoll_request_t *req;
        gcoll_icompressed_allreduce(comm, s, x, y, count, GCOLL_SUM, &req);
        exit_during("a streamed compressed allreduce", 5000);
    }
    usleep(2000);
    double t0 = now();
    gcoll_status_t st = gcoll_compressed_allreduce(comm, s, x, y, count, GCOLL_SUM);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(y);
    return expect_error(st, "streamed compressed allreduce with a dead peer", t0, timeout_s() + 5);
}

/* Rank `victim` stays silent past the timeout; the others must time out, not hang. The
 * victim, arriving late, must not hang either. It may find that every other rank sent its
 * part before giving up (recursive doubling needs nothing else from them) and, when no
 * abort reached it (a peer that gave up can leave before its notice is out), complete:
 * then only with the exact sum. */
static int run_silent(int victim)
{
    float x[100];
    for (int i = 0; i < 100; i++)
        x[i] = (float)(rank + 1);
    double t0 = now();
    if (rank == victim) {
        usleep((useconds_t)((timeout_s() * 2 + 1) * 1e6));
        gcoll_status_t st = gcoll_allreduce(comm, x, x, 100, GCOLL_FLOAT32, GCOLL_SUM);
        for (int i = 0; st == GCOLL_OK && i < 100; i++)
            if (x[i] != (float)(size * (size + 1) / 2)) {
                FAIL("allreduce after the others gave up succeeded with a wrong sum (%g)", x[i]);
                break;
            }
        if (now() - t0 > timeout_s() * 4 + 10)
            FAIL("the late rank took %.1f s", now() - t0);
        return failures;
    }
    gcoll_status_t st = gcoll_allreduce(comm, x, x, 100, GCOLL_FLOAT32, GCOLL_SUM);
    return expect_error(st, "allreduce with a silent peer", t0, timeout_s() * 2 + 5);
}

/* Rank `victim` passes a different count to collective `which`: every rank must report
 * GCOLL_ERR_MISMATCH. */
static int run_mismatch(int victim, const char *which, size_t base)
{
    size_t count = base + (rank == victim ? 1 : 0);
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
             strcmp(which, "sparsecodec") == 0 || strcmp(which, "topkdensity") == 0 ||
             strcmp(which, "topkdense") == 0 || strcmp(which, "topktensor") == 0) {
        /* compressed allreduce with another codec, or a tensor of another size (topktensor:
         * the same top-k spec, large enough to stream, one element more on the victim) */
        const char *spec = strcmp(which, "sparsecodec") == 0
                               ? (rank == victim ? "topk:density=0.01+q8" : "topk:density=0.01")
                           : strcmp(which, "topkdensity") == 0
                               ? (rank == victim ? "topk:density=0.02" : "topk:density=0.01")
                           /* the victim's messages too large to skip the census */
                           : strcmp(which, "topkdense") == 0
                               ? (rank == victim ? "topk:density=0.5" : "topk:density=0.01")
                           : strcmp(which, "topktensor") == 0
                               ? "topk:density=0.01"
                               : (strcmp(which, "codec") == 0 && rank == victim ? "bf16" : "fp16");
        size_t n = strcmp(which, "tensor") == 0       ? count
                   : strcmp(which, "topktensor") == 0 ? 10000 + (rank == victim)
                                                      : 10000;
        gcoll_compressor_t *c;
        gcoll_tensor_state_t *s;
        gcoll_compressor_create(spec, &c);
        gcoll_state_create(c, n, &s);
        st = gcoll_compressed_allreduce(comm, s, x, y, n, GCOLL_SUM);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    } else if (strcmp(which, "op") == 0) /* same count, different op */
        st = gcoll_allreduce(comm, x, x, 10000, GCOLL_FLOAT32,
                             rank == victim ? GCOLL_MAX : GCOLL_SUM);
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
    else if (strcmp(mode, "adapt_ctl") == 0)
        bad = run_adapt_ctl();
    else if (strcmp(mode, "adapt_stream") == 0)
        bad = run_adapt_stream();
    else if (strcmp(mode, "bucketer") == 0)
        bad = run_bucketer();
    else if (strcmp(mode, "overlap") == 0)
        bad = run_overlap();
    else if (strcmp(mode, "warmup") == 0)
        bad = run_warmup();
    else if (strcmp(mode, "bucket_layers") == 0)
        bad = run_bucket_layers();
    else if (strcmp(mode, "bucket_missing") == 0)
        bad = run_bucket_missing(victim);
    else if (strcmp(mode, "bucket_nan") == 0)
        bad = run_bucket_nan(victim, 1);
    else if (strcmp(mode, "bucket_nan_acc") == 0)
        bad = run_bucket_nan(victim, 2);
    else if (strcmp(mode, "compressed") == 0)
        bad = run_compressed();
    else if (strcmp(mode, "rss") == 0)
        bad = run_rss(argc, argv);
    else if (strcmp(mode, "clip") == 0)
        bad = run_clip();
    else if (strcmp(mode, "efmean") == 0)
        bad = run_efmean(argc, argv);
    else if (strcmp(mode, "onestep") == 0)
        bad = run_onestep(argc, argv);
    else if (strcmp(mode, "sparse") == 0)
        bad = run_sparse();
    else if (strcmp(mode, "allreduce") == 0)
        bad = run_allreduce();
    else if (strcmp(mode, "die") == 0)
        bad = run_die(victim);
    else if (strcmp(mode, "die_stream") == 0)
        bad = run_die_stream(victim);
    else if (strcmp(mode, "silent") == 0)
        bad = run_silent(victim);
    else if (strcmp(mode, "mismatch") == 0)
        bad = run_mismatch(victim, argc > 3 ? argv[3] : "allreduce",
                           argc > 4 ? strtoul(argv[4], NULL, 10) : 10000);
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
    printf("rank %d/%d: %s: %d checks passed in %.2f s\n", rank, size, mode, checks, now() - t0);
    return 0;
}
