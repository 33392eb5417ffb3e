/* bench.c: the benchmark engine: size sweep, warm-up, timed iterations, correctness check,
 * and the algbw/busbw arithmetic of nccl-tests. */
#include "bench.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/half.h"

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

const char *bench_coll_name(bench_coll_t c)
{
    return coll_names[c];
}

int bench_parse_dtype(const char *s, gcoll_dtype_t *d)
{
    static const struct {
        const char *n;
        gcoll_dtype_t d;
    } t[] = {{"float", GCOLL_FLOAT32},
             {"float32", GCOLL_FLOAT32},
             {"half", GCOLL_FLOAT16},
             {"float16", GCOLL_FLOAT16},
             {"bfloat16", GCOLL_BFLOAT16},
             {"double", GCOLL_FLOAT64},
             {"float64", GCOLL_FLOAT64},
             {"int32", GCOLL_INT32},
             {"int", GCOLL_INT32},
             {"int64", GCOLL_INT64},
             {"bool", GCOLL_BOOL},
             {"int8", GCOLL_INT8},
             {"uint8", GCOLL_UINT8},
             {"int16", GCOLL_INT16},
             {"uint32", GCOLL_UINT32},
             {"uint64", GCOLL_UINT64},
             {"float8_e4m3", GCOLL_FLOAT8_E4M3},
             {"float8_e5m2", GCOLL_FLOAT8_E5M2}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcasecmp(s, t[i].n) == 0) {
            *d = t[i].d;
            return 0;
        }
    return -1;
}

int bench_parse_op(const char *s, gcoll_op_t *o)
{
    static const char *const n[] = {"sum", "avg", "min", "max", "prod", "band", "bor", "bxor"};
    for (int i = 0; i < 8; i++)
        if (strcasecmp(s, n[i]) == 0) {
            *o = (gcoll_op_t)i;
            return 0;
        }
    return -1;
}

double bench_bus_factor(bench_coll_t c, int n)
{
    switch (c) {
    case BENCH_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case BENCH_ALLGATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLTOALL:
        return (double)(n - 1) / n;
    case BENCH_BROADCAST:
        return 1.0;
    }
    return 1.0;
}

#define GCOLL_BENCH_CHECK(call)                                                                    \
    do {                                                                                           \
        gcoll_status_t st_ = (call);                                                               \
        if (st_ != GCOLL_OK)                                                                       \
            return st_;                                                                            \
    } while (0)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Element i of rank r's input: small integers, exact in every dtype and sum. */
static int val(int r, size_t i)
{
    return (int)((i * 7 + (size_t)r * 3) % 9) - 4;
}

static void put(void *b, size_t i, gcoll_dtype_t d, int v)
{
    /* clang-format off */
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
    /* clang-format on */
    case GCOLL_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
        break;
    }
    case GCOLL_BOOL:
        ((uint8_t *)b)[i] = v != 0;
        break;
    case GCOLL_INT8:
        ((int8_t *)b)[i] = (int8_t)v;
        break;
    case GCOLL_UINT8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case GCOLL_INT16:
        ((int16_t *)b)[i] = (int16_t)v;
        break;
    case GCOLL_UINT32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    case GCOLL_UINT64:
        ((uint64_t *)b)[i] = (uint64_t)(int64_t)v;
        break;
    case GCOLL_FLOAT8_E4M3:
        ((uint8_t *)b)[i] = gcoll_f32_to_e4m3((float)v);
        break;
    case GCOLL_FLOAT8_E5M2:
        ((uint8_t *)b)[i] = gcoll_f32_to_e5m2((float)v);
        break;
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
    case BENCH_BROADCAST:
        *in = *out = *count = c;
        break;
    case BENCH_ALLGATHER:
        *count = c / (size_t)n;
        *in = *count;
        *out = *count * (size_t)n;
        break;
    case BENCH_REDUCE_SCATTER:
        *count = c / (size_t)n;
        *in = *count * (size_t)n;
        *out = *count;
        break;
    case BENCH_ALLTOALL:
        *count = c / (size_t)n;
        *in = *out = *count * (size_t)n;
        break;
    }
    *size = (o->coll == BENCH_ALLREDUCE || o->coll == BENCH_BROADCAST) ? *count * esz
                                                                       : *count * (size_t)n * esz;
}

static gcoll_status_t run_once(gcoll_comm_t *comm, const bench_opts_t *o, void *in, void *out,
                               size_t count)
{
    /* clang-format off */
    switch (o->coll) {
    case BENCH_ALLREDUCE: return gcoll_allreduce(comm, in, out, count, o->dtype, o->op);
    case BENCH_ALLGATHER: return gcoll_allgather(comm, in, out, count, o->dtype);
    case BENCH_REDUCE_SCATTER: return gcoll_reduce_scatter(comm, in, out, count, o->dtype, o->op);
    case BENCH_ALLTOALL: return gcoll_alltoall(comm, in, out, count, o->dtype);
    case BENCH_BROADCAST: return gcoll_broadcast(comm, in, count, o->dtype, o->root);
    }
    /* clang-format on */
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
    /* a sum of the small inputs is exact and wraps alike in every integer type; bool's SUM is
     * an or and fp8 rounds partial sums: the integration tests check those */
    int sum_only = o->op == GCOLL_SUM && o->dtype != GCOLL_BOOL && o->dtype != GCOLL_FLOAT8_E4M3 &&
                   o->dtype != GCOLL_FLOAT8_E5M2;
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
                wrong +=
                    !equal(out, (size_t)k * count + i, o->dtype, val(k, (size_t)r * count + i));
        break;
    case BENCH_BROADCAST:
        for (size_t i = 0; i < count; i++)
            wrong += !equal(in, i, o->dtype, val(o->root, i));
        break;
    }
    return wrong;
}

/* ---- compressed allreduce ---------------------------------------------------------- */

/* Gradient-like input of rank r: a component common to all ranks (data-parallel
 * gradients of one model are correlated) plus a rank's own part, so that the sum does not
 * cancel out and the relative error means something. */
static float gval(int r, size_t i)
{
    return (sinf((float)i * 0.618f) + 0.5f * sinf((float)i * 0.377f + (float)r * 2.1f)) *
           (1.0f + (float)(i % 17) * 0.25f);
}

static void chunk_span(size_t count, int n, int j, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)j * base + ((size_t)j < extra ? (size_t)j : extra);
    *len = base + ((size_t)j < extra);
}

/* The ring scheme: chunk j starts at rank j+1, and every rank on its way decodes the
 * partial sum, adds its gradient and compresses the sum again, segment by segment (fresh
 * states: no residual yet); rank j adds its own gradient, re-compresses each segment as
 * the server and everyone decodes those bytes. */
static gcoll_status_t expected_ring(gcoll_compressor_t *c, int n, size_t count, size_t segf,
                                    float *want)
{
    size_t cap = gcoll_compressor_bound(c, segf), len = 0;
    uint8_t *msg = malloc(cap);
    float *x = malloc((segf + 1) * sizeof(float));
    gcoll_tensor_state_t **ws = calloc((size_t)n, sizeof(*ws)), *ss = NULL;
    gcoll_status_t st = msg && x && ws ? GCOLL_OK : GCOLL_ERR_NOMEM;
    for (int i = 0; i < n && st == GCOLL_OK; i++)
        st = gcoll_state_create(c, count, &ws[i]);
    for (int j = 0; j < n && st == GCOLL_OK; j++) {
        size_t off, m;
        chunk_span(count, n, j, &off, &m);
        if ((st = gcoll_state_create(c, m, &ss)) != GCOLL_OK)
            break;
        for (size_t k0 = 0; k0 < m && st == GCOLL_OK; k0 += segf) {
            size_t sl = m - k0 < segf ? m - k0 : segf, so = off + k0;
            for (int h = 1; h < n && st == GCOLL_OK; h++) {
                int i = (j + h) % n;
                if (h > 1)
                    st = gcoll_decode(c, msg, len, x, sl, 0);
                for (size_t q = 0; q < sl; q++)
                    x[q] = h > 1 ? x[q] + gval(i, so + q) : gval(i, so + q);
                if (st == GCOLL_OK)
                    st = gcoll_encode_chunk(c, ws[i], so, x, sl, msg, cap, &len);
            }
            if (st == GCOLL_OK && n > 1)
                st = gcoll_decode(c, msg, len, x, sl, 0);
            else
                memset(x, 0, sl * sizeof(float));
            for (size_t q = 0; q < sl; q++)
                x[q] += gval(j, so + q);
            if (st == GCOLL_OK)
                st = gcoll_encode_chunk(c, ss, k0, x, sl, msg, cap, &len);
            if (st == GCOLL_OK)
                st = gcoll_decode(c, msg, len, want + so, sl, 0);
        }
        gcoll_state_destroy(ss);
    }
    for (int i = 0; ws && i < n; i++)
        gcoll_state_destroy(ws[i]);
    free(ws);
    free(msg);
    free(x);
    return st;
}

/* What a fresh compressed allreduce must return: every rank's codec output, summed (for
 * quantizers, each chunk re-compressed by its owner), simulated with fresh states. */
static gcoll_status_t expected_compressed(gcoll_compressor_t *c, int n, size_t count, float *want)
{
    unsigned fl = gcoll_compressor_flags(c);
    int quant = !(fl & GCOLL_CODEC_SPARSE) &&
                !(fl & GCOLL_CODEC_LOSSLESS && strncmp(gcoll_compressor_spec(c), "none", 4) == 0);
    size_t cap = gcoll_compressor_bound(c, count), len;
    uint8_t *msg = malloc(cap);
    float *g = malloc((count + 1) * sizeof(float)), *acc = calloc(count + 1, sizeof(float));
    gcoll_status_t st = msg && g && acc ? GCOLL_OK : GCOLL_ERR_NOMEM;
    for (int i = 0; i < n && st == GCOLL_OK; i++) {
        gcoll_tensor_state_t *s;
        if ((st = gcoll_state_create(c, count, &s)) != GCOLL_OK)
            break;
        for (size_t k = 0; k < count; k++)
            g[k] = gval(i, k);
        for (int j = 0; j < (quant ? n : 1) && st == GCOLL_OK; j++) {
            size_t off = 0, m = count;
            if (quant)
                chunk_span(count, n, j, &off, &m);
            st = gcoll_encode_chunk(c, s, off, g + off, m, msg, cap, &len);
            if (st == GCOLL_OK)
                st = gcoll_decode(c, msg, len, acc + off, m, 1);
        }
        gcoll_state_destroy(s);
    }
    for (int j = 0; quant && j < n && st == GCOLL_OK; j++) {
        size_t off, m;
        gcoll_tensor_state_t *s;
        chunk_span(count, n, j, &off, &m);
        if ((st = gcoll_state_create(c, m, &s)) != GCOLL_OK)
            break;
        st = gcoll_encode(c, s, acc + off, m, msg, cap, &len);
        if (st == GCOLL_OK)
            st = gcoll_decode(c, msg, len, acc + off, m, 0);
        gcoll_state_destroy(s);
    }
    if (st == GCOLL_OK)
        memcpy(want, acc, count * sizeof(float));
    free(msg);
    free(g);
    free(acc);
    return st;
}

static gcoll_status_t run_compressed(gcoll_comm_t *comm, const bench_opts_t *o,
                                     gcoll_compressor_t *c, size_t count, float *in, float *out,
                                     float *ref, bench_row_t *row)
{
    const int n = gcoll_comm_size(comm), r = gcoll_comm_rank(comm);
    gcoll_tensor_state_t *s;
    gcoll_counters_t c0, c1;
    for (size_t i = 0; i < count; i++)
        in[i] = gval(r, i);
    GCOLL_BENCH_CHECK(gcoll_state_create(c, count, &s));
    gcoll_status_t st = GCOLL_OK;
    /* one fresh step: relative error against the dense sum, and the exact check */
    st = gcoll_compressed_allreduce(comm, s, in, out, count, GCOLL_SUM);
    if (st == GCOLL_OK)
        st = gcoll_allreduce(comm, in, ref, count, GCOLL_FLOAT32, GCOLL_SUM);
    double e2 = 0, r2 = 0;
    for (size_t i = 0; st == GCOLL_OK && i < count; i++) {
        e2 += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
        r2 += (double)ref[i] * ref[i];
    }
    row->rel_err = r2 > 0 ? sqrt(e2 / r2) : 0;
    row->scheme = gcoll_compressed_scheme(comm, c, count, 0, NULL);
    row->wrong = -1;
    if (st == GCOLL_OK && o->check && !(gcoll_compressor_flags(c) & GCOLL_CODEC_STOCHASTIC)) {
        size_t segf = 0;
        row->scheme = gcoll_compressed_scheme(comm, c, count, 0, &segf);
        st = segf ? expected_ring(c, n, count, segf, ref) : expected_compressed(c, n, count, ref);
        long wrong = 0;
        for (size_t i = 0; st == GCOLL_OK && i < count; i++)
            wrong += !(fabs((double)out[i] - ref[i]) <= 1e-5 * fabs(ref[i]) + 1e-5 * n);
        row->wrong = wrong;
    }
    for (int w = 0; w < o->warmup && st == GCOLL_OK; w++)
        st = gcoll_compressed_allreduce(comm, s, in, out, count, GCOLL_SUM);
    if (st == GCOLL_OK)
        st = gcoll_barrier(comm);
    gcoll_comm_counters(comm, &c0);
    double t0 = now_us();
    for (int it = 0; it < o->iters && st == GCOLL_OK; it++)
        st = gcoll_compressed_allreduce(comm, s, in, out, count, GCOLL_SUM);
    double t = (now_us() - t0) / o->iters;
    gcoll_comm_counters(comm, &c1);
    gcoll_state_destroy(s);
    if (st != GCOLL_OK)
        return st;
    double v[4] = {t, (double)(c1.ns_compress - c0.ns_compress) / 1e3 / o->iters,
                   (double)(c1.bytes_sent - c0.bytes_sent) / o->iters, (double)row->wrong};
    double mx[2] = {v[0], v[1]}, sum[2] = {v[2], v[3] < 0 ? 0 : v[3]};
    GCOLL_BENCH_CHECK(gcoll_allreduce(comm, mx, mx, 2, GCOLL_FLOAT64, GCOLL_MAX));
    GCOLL_BENCH_CHECK(gcoll_allreduce(comm, sum, sum, 2, GCOLL_FLOAT64, GCOLL_SUM));
    row->time_us = mx[0];
    row->comp_us = mx[1];
    row->wire_bytes = sum[0] / n;
    row->ratio = row->wire_bytes > 0 ? (double)(count * sizeof(float)) / row->wire_bytes : 0;
    if (row->wrong >= 0)
        row->wrong = (long)sum[1];
    return GCOLL_OK;
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
    gcoll_compressor_t *comp = NULL;
    float *ref = NULL;
    if (o->spec) {
        if (o->coll != BENCH_ALLREDUCE || o->dtype != GCOLL_FLOAT32 || o->op != GCOLL_SUM)
            st = GCOLL_ERR_UNSUPPORTED; /* compression is for float32 sum allreduce */
        else if ((st = gcoll_compressor_create(o->spec, &comp)) == GCOLL_OK &&
                 !(ref = calloc(nout + 1, sizeof(float))))
            st = GCOLL_ERR_NOMEM;
    }
    for (size_t bytes = o->min_bytes; st == GCOLL_OK && bytes <= o->max_bytes;) {
        shape(o, bytes, n, &nin, &nout, &count, &size);
        if (comp) {
            bench_row_t row = {.bytes = size, .count = count};
            if ((st = run_compressed(comm, o, comp, count, (float *)in, (float *)out, ref, &row)) !=
                GCOLL_OK)
                break;
            row.algbw = row.time_us > 0 ? (double)size / row.time_us / 1e3 : 0;
            row.busbw = row.algbw * bench_bus_factor(o->coll, n);
            emit(&row, ctx);
            size_t next = o->factor > 1 ? (size_t)((double)bytes * o->factor) : bytes + o->step;
            if (next <= bytes)
                break;
            bytes = next;
            continue;
        }
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
        bench_row_t row = {.bytes = size,
                           .count = count,
                           .time_us = t,
                           .algbw = t > 0 ? (double)size / t / 1e3 : 0,
                           .wrong = wrong};
        row.busbw = row.algbw * bench_bus_factor(o->coll, n);
        emit(&row, ctx);
        size_t next = o->factor > 1 ? (size_t)((double)bytes * o->factor) : bytes + o->step;
        if (next <= bytes)
            break;
        bytes = next;
    }
    gcoll_compressor_destroy(comp);
    free(ref);
    free(in);
    free(out);
    return st;
}
