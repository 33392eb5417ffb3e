/* bench.c: the benchmark engine: size sweep, warm-up, timed iterations, correctness check,
 * and the algbw/busbw arithmetic of nccl-tests. */
#include "bench.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const coll_names[] = {"allreduce", "allgather", "reduce_scatter", "alltoall",
                                         "broadcast"};

int bench_parse_coll(const char *s, bench_coll_t *c)
{
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, coll_names[i]) == 0) {
            *c = (bench_coll_t)i;
            return 0;
        }
    return -1;
}

const char *bench_coll_name(bench_coll_t c) { return coll_names[c]; }

int bench_parse_dtype(const char *s, gcoll_dtype_t *d)
{
    static const struct {
        const char *n;
        gcoll_dtype_t d;
    } t[] = {{"float", GCOLL_FLOAT32}, {"float32", GCOLL_FLOAT32}, {"half", GCOLL_FLOAT16},
             {"float16", GCOLL_FLOAT16}, {"bfloat16", GCOLL_BFLOAT16}, {"double", GCOLL_FLOAT64},
             {"float64", GCOLL_FLOAT64}, {"int32", GCOLL_INT32}, {"int", GCOLL_INT32},
             {"int64", GCOLL_INT64}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcasecmp(s, t[i].n) == 0) {
            *d = t[i].d;
            return 0;
        }
    return -1;
}

int bench_parse_op(const char *s, gcoll_op_t *o)
{
    static const char *const n[] = {"sum", "avg", "min", "max", "prod"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, n[i]) == 0) {
            *o = (gcoll_op_t)i;
            return 0;
        }
    return -1;
}

double bench_bus_factor(bench_coll_t c, int n)
{
    switch (c) {
    case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
    case BENCH_ALLGATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLTOALL: return (double)(n - 1) / n;
    case BENCH_BROADCAST: return 1.0;
    }
    return 1.0;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Element i of rank r's input: small integers, exact in every dtype and sum. */
static int val(int r, size_t i) { return (int)((i * 7 + (size_t)r * 3) % 9) - 4; }

static void put(void *b, size_t i, gcoll_dtype_t d, int v)
{
    switch (d) {
    case GCOLL_FLOAT32: ((float *)b)[i] = (float)v; break;
    case GCOLL_FLOAT64: ((double *)b)[i] = v; break;
    case GCOLL_INT32: ((int32_t *)b)[i] = v; break;
    case GCOLL_INT64: ((int64_t *)b)[i] = v; break;
    case GCOLL_FLOAT16: {
        /* small integers only: |v| <= 64 */
        int a = v < 0 ? -v : v, e = 0;
        uint16_t h = 0;
        if (a) {
            while ((a >> e) > 1)
                e++;
            h = (uint16_t)(((e + 15) << 10) | ((((unsigned)a << 10) >> e) & 0x3ff));
        }
        ((uint16_t *)b)[i] = (uint16_t)(h | (v < 0 ? 0x8000 : 0));
        break;
    }
    case GCOLL_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
        break;
    }
    }
}

static int equal(const void *b, size_t i, gcoll_dtype_t d, int v)
{
    uint8_t tmp[8];
    put(tmp, 0, d, v);
    size_t e = gcoll_dtype_size(d);
    return memcmp((const uint8_t *)b + i * e, tmp, e) == 0;
}

/* Elements of one rank's input and of its output, and the nccl-tests "size". */
static void shape(const bench_opts_t *o, size_t bytes, int n, size_t *in, size_t *out,
                  size_t *count, size_t *size)
{
    size_t esz = gcoll_dtype_size(o->dtype), c = bytes / esz;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
    case BENCH_BROADCAST: *in = *out = *count = c; break;
    case BENCH_ALLGATHER: *count = c / (size_t)n; *in = *count; *out = *count * (size_t)n; break;
    case BENCH_REDUCE_SCATTER: *count = c / (size_t)n; *in = *count * (size_t)n; *out = *count; break;
    case BENCH_ALLTOALL: *count = c / (size_t)n; *in = *out = *count * (size_t)n; break;
    }
    *size = (o->coll == BENCH_ALLREDUCE || o->coll == BENCH_BROADCAST) ? *count * esz
                                                                        : *count * (size_t)n * esz;
}

static gcoll_status_t run_once(gcoll_comm_t *comm, const bench_opts_t *o, void *in, void *out,
                               size_t count)
{
    switch (o->coll) {
    case BENCH_ALLREDUCE: return gcoll_allreduce(comm, in, out, count, o->dtype, o->op);
    case BENCH_ALLGATHER: return gcoll_allgather(comm, in, out, count, o->dtype);
    case BENCH_REDUCE_SCATTER: return gcoll_reduce_scatter(comm, in, out, count, o->dtype, o->op);
    case BENCH_ALLTOALL: return gcoll_alltoall(comm, in, out, count, o->dtype);
    case BENCH_BROADCAST: return gcoll_broadcast(comm, in, count, o->dtype, o->root);
    }
    return GCOLL_ERR_INVALID;
}

/* Fills inputs, runs once and counts wrong output elements on this rank. */
static long check(gcoll_comm_t *comm, const bench_opts_t *o, void *in, void *out, size_t nin,
                  size_t count, gcoll_status_t *st)
{
    int r = gcoll_comm_rank(comm), n = gcoll_comm_size(comm);
    for (size_t i = 0; i < nin; i++)
        put(in, i, o->dtype, val(r, i));
    *st = run_once(comm, o, in, out, count);
    if (*st != GCOLL_OK)
        return -1;
    long wrong = 0;
    int sum_only = o->op == GCOLL_SUM;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE_SCATTER:
        if (!sum_only)
            return 0; /* the integration tests cover the other ops */
        for (size_t i = 0; i < count; i++) {
            size_t gi = o->coll == BENCH_REDUCE_SCATTER ? (size_t)r * count + i : i;
            int want = 0;
            for (int k = 0; k < n; k++)
                want += val(k, gi);
            wrong += !equal(out, i, o->dtype, want);
        }
        break;
    case BENCH_ALLGATHER:
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < count; i++)
                wrong += !equal(out, (size_t)k * count + i, o->dtype, val(k, i));
        break;
    case BENCH_ALLTOALL:
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < count; i++)
                wrong += !equal(out, (size_t)k * count + i, o->dtype, val(k, (size_t)r * count + i));
        break;
    case BENCH_BROADCAST:
        for (size_t i = 0; i < count; i++)
            wrong += !equal(in, i, o->dtype, val(o->root, i));
        break;
    }
    return wrong;
}

gcoll_status_t bench_run(gcoll_comm_t *comm, const bench_opts_t *o,
                         void (*emit)(const bench_row_t *row, void *ctx), void *ctx)
{
    const int n = gcoll_comm_size(comm);
    const size_t esz = gcoll_dtype_size(o->dtype);
    size_t nin, nout, count, size;
    shape(o, o->max_bytes, n, &nin, &nout, &count, &size);
    uint8_t *in = calloc(nin + 1, esz), *out = calloc(nout + 1, esz);
    if (!in || !out) {
        free(in);
        free(out);
        return GCOLL_ERR_NOMEM;
    }
    gcoll_status_t st = GCOLL_OK;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
        shape(o, bytes, n, &nin, &nout, &count, &size);
        for (size_t i = 0; i < nin; i++)
            put(in, i, o->dtype, 1);
        for (int w = 0; w < o->warmup && st == GCOLL_OK; w++)
            st = run_once(comm, o, in, out, count);
        if (st == GCOLL_OK)
            st = gcoll_barrier(comm);
        double t0 = now_us();
        for (int it = 0; it < o->iters && st == GCOLL_OK; it++)
            st = run_once(comm, o, in, out, count);
        double t = (now_us() - t0) / (o->iters > 0 ? o->iters : 1);
        if (st != GCOLL_OK)
            break;
        /* the slowest rank's time is the collective's time */
        st = gcoll_allreduce(comm, &t, &t, 1, GCOLL_FLOAT64, GCOLL_MAX);
        long wrong = -1;
        if (st == GCOLL_OK && o->check) {
            wrong = check(comm, o, in, out, nin, count, &st);
            if (st == GCOLL_OK) {
                int64_t w = wrong;
                st = gcoll_allreduce(comm, &w, &w, 1, GCOLL_INT64, GCOLL_SUM);
                wrong = (long)w;
            }
        }
        if (st != GCOLL_OK)
            break;
        bench_row_t row = {.bytes = size, .count = count, .time_us = t,
                           .algbw = t > 0 ? (double)size / t / 1e3 : 0, .wrong = wrong};
        row.busbw = row.algbw * bench_bus_factor(o->coll, n);
        emit(&row, ctx);
        size_t next = o->factor > 1 ? (size_t)((double)bytes * o->factor) : bytes + o->step;
        if (next <= bytes)
            break;
        bytes = next;
    }
    free(in);
    free(out);
    return st;
}
