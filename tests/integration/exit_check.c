/* exit_check: a series of one collective (or a seeded mix of them) with results checked
 * against values computed here, then gcoll_comm_destroy() and an immediate exit. Ranks are
 * started by hand through GCOLL_RANK/GCOLL_SIZE/GCOLL_ROOT/GCOLL_JOB_KEY (or gcoll-run).
 * Used by the teardown checks (every rank must exit 0) and by the chaos campaign (a rank is
 * killed; survivors must fail with a status, never hang, crash or return a wrong result).
 *
 *   exit_check MODE ITERS COUNT [SEED]
 *   MODE: bcast allreduce allgather reduce_scatter alltoall barrier sparse topk q8 mixed
 *
 * Exit status: 0 every call succeeded and matched; 1 a wrong result; 2 a call failed (its
 * status and message on stderr); 3 bad usage or init failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcoll.h"

static int rank, size;
static gcoll_comm_t *comm;

/* Rank r's integer input at index i of call number call: small, so every sum is exact. */
static int ival(int r, size_t i, unsigned call)
{
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(r * 40503u + 17u) ^ (call * 97u);
    h ^= h >> 13;
    return (int)(h % 17) - 8;
}

/* Rank r's top-k input: distinct magnitudes (a permutation of 1..n with signs), so the
 * selection has no ties and can be computed here. n must be odd for the permutation. */
static float tval(int r, size_t i, size_t n, unsigned call)
{
    size_t p = (i * 7919u + (size_t)r * 104729u + call * 31u) % n;
    float v = (float)(p + 1);
    return (p & 1) ? -v : v;
}

static uint64_t rng_state;
static unsigned rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(rng_state >> 33);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* compared with date(1) by the chaos scripts */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int failed(const char *what, unsigned call, gcoll_status_t st)
{
    fprintf(stderr, "exit_check rank %d: %s #%u failed at %.6f: %s: %s\n", rank, what, call, now(),
            gcoll_status_string(st), gcoll_comm_last_error(comm));
    return 2;
}

static int wrong(const char *what, unsigned call, size_t i, double got, double want)
{
    fprintf(stderr, "exit_check rank %d: WRONG %s #%u [%zu]: %g, expected %g\n", rank, what, call,
            i, got, want);
    return 1;
}

static int do_bcast(unsigned call, size_t n, float *buf)
{
    int root = (int)(call % (unsigned)size);
    for (size_t i = 0; i < n; i++)
        buf[i] = rank == root ? (float)ival(root, i, call) : -99.0f;
    gcoll_status_t st = gcoll_broadcast(comm, buf, n, GCOLL_FLOAT32, root);
    if (st != GCOLL_OK)
        return failed("broadcast", call, st);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)ival(root, i, call))
            return wrong("broadcast", call, i, buf[i], ival(root, i, call));
    return 0;
}

static int do_allreduce(unsigned call, size_t n, float *buf)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)ival(rank, i, call);
    gcoll_status_t st = gcoll_allreduce(comm, buf, buf, n, GCOLL_FLOAT32, GCOLL_SUM);
    if (st != GCOLL_OK)
        return failed("allreduce", call, st);
    for (size_t i = 0; i < n; i++) {
        int want = 0;
        for (int r = 0; r < size; r++)
            want += ival(r, i, call);
        if (buf[i] != (float)want)
            return wrong("allreduce", call, i, buf[i], want);
    }
    return 0;
}

static int do_allgather(unsigned call, size_t n, float *buf)
{
    float *mine = buf + (size_t)rank * n;
    for (size_t i = 0; i < n; i++)
        mine[i] = (float)ival(rank, i, call);
    gcoll_status_t st = gcoll_allgather(comm, mine, buf, n, GCOLL_FLOAT32);
    if (st != GCOLL_OK)
        return failed("allgather", call, st);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            if (buf[(size_t)r * n + i] != (float)ival(r, i, call))
                return wrong("allgather", call, (size_t)r * n + i, buf[(size_t)r * n + i],
                             ival(r, i, call));
    return 0;
}

static int do_reduce_scatter(unsigned call, size_t n, float *buf, float *out)
{
    for (size_t i = 0; i < n * (size_t)size; i++)
        buf[i] = (float)ival(rank, i, call);
    gcoll_status_t st = gcoll_reduce_scatter(comm, buf, out, n, GCOLL_FLOAT32, GCOLL_SUM);
    if (st != GCOLL_OK)
        return failed("reduce_scatter", call, st);
    for (size_t i = 0; i < n; i++) {
        size_t g = (size_t)rank * n + i;
        int want = 0;
        for (int r = 0; r < size; r++)
            want += ival(r, g, call);
        if (out[i] != (float)want)
            return wrong("reduce_scatter", call, i, out[i], want);
    }
    return 0;
}

static int do_alltoall(unsigned call, size_t n, float *buf, float *out)
{
    for (int j = 0; j < size; j++)
        for (size_t i = 0; i < n; i++)
            buf[(size_t)j * n + i] = (float)ival(rank, (size_t)j * n + i, call);
    gcoll_status_t st = gcoll_alltoall(comm, buf, out, n, GCOLL_FLOAT32);
    if (st != GCOLL_OK)
        return failed("alltoall", call, st);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) {
            int want = ival(r, (size_t)rank * n + i, call);
            if (out[(size_t)r * n + i] != (float)want)
                return wrong("alltoall", call, (size_t)r * n + i, out[(size_t)r * n + i], want);
        }
    return 0;
}

static int do_barrier(unsigned call)
{
    gcoll_status_t st = gcoll_barrier(comm);
    return st == GCOLL_OK ? 0 : failed("barrier", call, st);
}

/* Every rank contributes the pairs (i, v) for i = rank, rank + size, ...: a known sum. */
static int do_sparse(unsigned call, size_t n, float *out)
{
    size_t nnz = 0;
    uint32_t *idx = malloc(sizeof(uint32_t) * (n / 4 + 2));
    float *val = malloc(sizeof(float) * (n / 4 + 2));
    for (size_t i = (size_t)rank % 4; i < n && nnz < n / 4 + 2; i += 4) {
        idx[nnz] = (uint32_t)i;
        val[nnz++] = (float)ival(rank, i, call);
    }
    gcoll_status_t st = gcoll_sparse_allreduce(comm, idx, val, nnz, n, out, GCOLL_SUM);
    free(idx);
    free(val);
    if (st != GCOLL_OK)
        return failed("sparse_allreduce", call, st);
    for (size_t i = 0; i < n; i++) {
        int want = 0;
        for (int r = 0; r < size; r++)
            if ((size_t)r % 4 == i % 4)
                want += ival(r, i, call);
        if (out[i] != (float)want)
            return wrong("sparse_allreduce", call, i, out[i], want);
    }
    return 0;
}

/* top-k without feedback: each rank's k largest magnitudes, summed where they land. */
static int do_topk(unsigned call, size_t n, float *buf, float *out)
{
    if (n % 2 == 0)
        n--;
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *s;
    gcoll_status_t st = gcoll_compressor_create("topk:density=0.01,ef=0", &c);
    if (st != GCOLL_OK)
        return failed("compressor_create", call, st);
    st = gcoll_state_create(c, n, &s);
    if (st != GCOLL_OK) {
        gcoll_compressor_destroy(c);
        return failed("state_create", call, st);
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = tval(rank, i, n, call);
    st = gcoll_compressed_allreduce(comm, s, buf, out, n, GCOLL_SUM);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    if (st != GCOLL_OK)
        return failed("compressed_allreduce topk", call, st);
    size_t k = (size_t)ceil(0.01 * (double)n);
    if (k < 1)
        k = 1;
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) {
            float v = tval(r, i, n, call);
            if (fabsf(v) > (float)(n - k)) /* magnitudes n-k+1..n are the k largest */
                want += v;
        }
        if (out[i] != (float)want)
            return wrong("compressed_allreduce topk", call, i, out[i], want);
    }
    return 0;
}

/* q8 with feedback off: the mean within the quantizer's error bound. */
static int do_q8(unsigned call, size_t n, float *buf, float *out)
{
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *s;
    gcoll_status_t st = gcoll_compressor_create("q8:ef=0", &c);
    if (st != GCOLL_OK)
        return failed("compressor_create", call, st);
    st = gcoll_state_create(c, n, &s);
    if (st != GCOLL_OK) {
        gcoll_compressor_destroy(c);
        return failed("state_create", call, st);
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)ival(rank, i, call);
    st = gcoll_compressed_allreduce(comm, s, buf, out, n, GCOLL_AVG);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    if (st != GCOLL_OK)
        return failed("compressed_allreduce q8", call, st);
    /* |x| <= 8: each of the (at most two) quantizations errs by at most 8/127 */
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++)
            want += ival(r, i, call);
        want /= size;
        if (!(fabs(out[i] - want) <= 2.0 * 8.0 / 127.0 + 1e-4))
            return wrong("compressed_allreduce q8", call, i, out[i], want);
    }
    return 0;
}

enum { M_BCAST, M_ALLREDUCE, M_ALLGATHER, M_RS, M_A2A, M_BARRIER, M_SPARSE, M_TOPK, M_Q8, M_N };
static const char *const mode_names[M_N] = {"bcast",          "allreduce", "allgather",
                                            "reduce_scatter", "alltoall",  "barrier",
                                            "sparse",         "topk",      "q8"};

static int run_one(int m, unsigned call, size_t n, float *a, float *b)
{
    switch (m) {
    case M_BCAST:
        return do_bcast(call, n, a);
    case M_ALLREDUCE:
        return do_allreduce(call, n, a);
    case M_ALLGATHER:
        return do_allgather(call, n, a);
    case M_RS:
        return do_reduce_scatter(call, n, a, b);
    case M_A2A:
        return do_alltoall(call, n, a, b);
    case M_BARRIER:
        return do_barrier(call);
    case M_SPARSE:
        return do_sparse(call, n, a);
    case M_TOPK:
        return do_topk(call, n, a, b);
    default:
        return do_q8(call, n, a, b);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: exit_check MODE ITERS COUNT [SEED]\n");
        return 3;
    }
    const char *mode = argv[1];
    unsigned iters = (unsigned)strtoul(argv[2], NULL, 10);
    size_t count = strtoul(argv[3], NULL, 10);
    rng_state = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    int m = -1;
    for (int i = 0; i < M_N; i++)
        if (strcmp(mode, mode_names[i]) == 0)
            m = i;
    if (m < 0 && strcmp(mode, "mixed") != 0) {
        fprintf(stderr, "exit_check: unknown mode %s\n", mode);
        return 3;
    }
    if (count < 1)
        count = 1;
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        fprintf(stderr, "exit_check: init: %s\n", gcoll_status_string(st));
        return 3;
    }
    rank = gcoll_comm_rank(comm);
    size = gcoll_comm_size(comm);
    /* the kill campaign kills only ranks past init: a kill during the rendezvous tests
     * init's failure, not a dead peer in the middle of a stream */
    printf("exit_check rank %d: ready\n", rank);
    fflush(stdout);
    /* buffers for the largest mixed call: size blocks of 4 * count */
    size_t cap = 4 * count * (size_t)size + 1;
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
    int rc = 0;
    for (unsigned call = 0; call < iters && rc == 0; call++) {
        if (m >= 0) {
            rc = run_one(m, call, count, a, b);
            continue;
        }
        /* same seed on every rank: the same sequence of collectives and sizes */
        int which = (int)(rnd() % M_N);
        size_t n = 1 + rnd() % (4 * count);
        rc = run_one(which, call, n, a, b);
    }
    free(a);
    free(b);
    st = gcoll_comm_destroy(comm);
    if (st != GCOLL_OK && rc == 0) {
        fprintf(stderr, "exit_check rank %d: destroy: %s\n", rank, gcoll_status_string(st));
        rc = 2;
    }
    return rc;
}
