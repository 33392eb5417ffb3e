/* compressed.c: gcoll-bench's compressed allreduce rows: time, wire bytes, codec time, the
 * error of one fresh step against the dense sum, and -c's exact check against what every
 * rank's codec sent, simulated here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

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

gcoll_status_t bench_compressed_row(gcoll_comm_t *comm, const bench_opts_t *o,
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
    row->oop.wrong = -1;
    if (st == GCOLL_OK && o->check && !(gcoll_compressor_flags(c) & GCOLL_CODEC_STOCHASTIC)) {
        size_t segf = 0;
        row->scheme = gcoll_compressed_scheme(comm, c, count, 0, &segf);
        st = segf ? expected_ring(c, n, count, segf, ref) : expected_compressed(c, n, count, ref);
        long wrong = 0;
        for (size_t i = 0; st == GCOLL_OK && i < count; i++)
            wrong += !(fabs((double)out[i] - ref[i]) <= 1e-5 * fabs(ref[i]) + 1e-5 * n);
        row->oop.wrong = wrong;
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
                   (double)(c1.bytes_sent - c0.bytes_sent) / o->iters, (double)row->oop.wrong};
    double mx[2] = {v[0], v[1]}, sum[2] = {v[2], v[3] < 0 ? 0 : v[3]};
    GCOLL_BENCH_CHECK(gcoll_allreduce(comm, mx, mx, 2, GCOLL_FLOAT64, GCOLL_MAX));
    GCOLL_BENCH_CHECK(gcoll_allreduce(comm, sum, sum, 2, GCOLL_FLOAT64, GCOLL_SUM));
    row->oop.ran = 1;
    row->oop.time_us = t;
    GCOLL_BENCH_CHECK(bench_combine_time(comm, o->average, &row->oop.time_us));
    row->comp_us = mx[1];
    row->wire_bytes = sum[0] / n;
    row->ratio = row->wire_bytes > 0 ? (double)(count * sizeof(float)) / row->wire_bytes : 0;
    if (row->oop.wrong >= 0)
        row->oop.wrong = (long)sum[1];
    return GCOLL_OK;
}
