/* check_sparse.c: coll_check's sparse and compressed allreduce modes. */
#include "check.h"

/* a few hundred pairs per rank, or all of a small tensor */
#define GCOLL_SPARSE_N(count) ((count) < 300 ? (count) / 2 + 1 : 300)

/* ---- sparse allreduce ---- */

/* Rank r's pairs for pattern p: n pairs (unsorted, some repeated) with small integer
 * values, so every sum is exact and the reference is independent of order. */
static size_t sparse_pairs(int r, int pattern, size_t count, size_t n, uint32_t *idx, float *val)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = n - 1 - i; /* descending: unsorted input */
        /* clang-format off */
        switch (pattern) {
        case 0: idx[i] = (uint32_t)((j * 7919 + (size_t)r * 13) % count); break; /* overlapping */
        case 1: idx[i] = (uint32_t)((j * (size_t)size + (size_t)r) % count); break; /* disjoint */
        case 2: idx[i] = (uint32_t)(count / 2); break;                 /* all the same index */
        default: idx[i] = (uint32_t)(j % count); break;                /* every index (k = n) */
        }
        /* clang-format on */
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
                FAIL("sparse count=%zu nnz=%zu pattern %d %s: wrong at %zu: got %g want %g", count,
                     n, pattern, gcoll_op_name(op), i, out[i], w);
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

int run_sparse(void)
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
    check_sparse(1000, 20000, 0, GCOLL_SUM, 0);   /* many repeats: nnz > dense size */
    check_sparse(5000, 300, 0, GCOLL_SUM, 1);     /* empty on some ranks only */
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

/* Gradient pattern: 0 smooth values of many magnitudes; 1 997 magnitudes, each about 30
 * times in 30011 elements, so that top-k's threshold falls among equal ones (ties); 2 one
 * magnitude everywhere, so that a sampled threshold collects everything and top-k takes
 * its fallback path. */
static int grad_pattern;

static float grad_of(int r, int step, size_t k)
{
    float v = sinf((float)k * 0.37f + (float)r * 1.3f + (float)step * 0.7f);
    if (grad_pattern == 1)
        return (v < 0 ? -1.0f : 1.0f) *
               (1.0f + (float)((k + (size_t)r * 13 + (size_t)step * 7) % 997) / 997.0f);
    if (grad_pattern == 2)
        return v < 0 ? -2.0f : 2.0f;
    return v * (float)(1 + k % 13);
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

/* Elements per segment when the compressed allreduce of count runs the ring scheme (the
 * test forces it with GCOLL_COMPRESSED_ALGO=ring), else 0. */
static size_t ring_segf(gcoll_compressor_t *c, size_t count, int shard_only)
{
    size_t segf = 0;
    const char *sc = gcoll_compressed_scheme(comm, c, count, shard_only, &segf);
    return sc && strcmp(sc, "ring") == 0 ? segf : 0;
}

/* Simulates the ring scheme: chunk j starts at rank j+1 and each rank on its way decodes
 * the partial sum, adds its gradient and compresses it again (with its residual), segment
 * by segment; rank j adds its own gradient last. acc receives the reduced chunks (divided
 * by P for AVG); unless shard_only, want receives the server-compressed result. */
static void simulate_ring(gcoll_compressor_t *c, gcoll_tensor_state_t **ws,
                          gcoll_tensor_state_t **ss, int step, size_t count, gcoll_op_t op,
                          float *acc, float *want, int shard_only)
{
    size_t segf = ring_segf(c, count, shard_only), cap = gcoll_compressor_bound(c, segf), len = 0;
    uint8_t *msg = malloc(cap);
    float *x = malloc((segf + 1) * sizeof(float));
    for (int j = 0; j < size; j++) {
        size_t off, n;
        chunk_of(count, j, &off, &n);
        for (size_t k0 = 0; k0 < n; k0 += segf) {
            size_t m = n - k0 < segf ? n - k0 : segf, so = off + k0;
            for (int h = 1; h < size; h++) {
                int i = (j + h) % size;
                if (h > 1 && gcoll_decode(c, msg, len, x, m, 0) != GCOLL_OK)
                    FAIL("simulated ring decode failed");
                for (size_t q = 0; q < m; q++)
                    x[q] = h > 1 ? x[q] + grad_of(i, step, so + q) : grad_of(i, step, so + q);
                if (gcoll_encode_chunk(c, ws[i], so, x, m, msg, cap, &len) != GCOLL_OK)
                    FAIL("simulated ring encode failed");
            }
            if (size > 1)
                gcoll_decode(c, msg, len, acc + so, m, 0);
            else
                memset(acc + so, 0, m * sizeof(float));
            for (size_t q = 0; q < m; q++)
                acc[so + q] += grad_of(j, step, so + q);
        }
        if (op == GCOLL_AVG)
            for (size_t q = 0; q < n; q++)
                acc[off + q] /= (float)size;
        for (size_t k0 = 0; !shard_only && k0 < n; k0 += segf) {
            size_t m = n - k0 < segf ? n - k0 : segf;
            if (gcoll_encode_chunk(c, ss[j], k0, acc + off + k0, m, msg, cap, &len) != GCOLL_OK ||
                gcoll_decode(c, msg, len, want + off + k0, m, 0) != GCOLL_OK)
                FAIL("simulated ring server encode failed");
        }
    }
    for (int i = 0; i < size; i++)
        gcoll_state_advance(ws[i]);
    free(msg);
    free(x);
}

/* A rank (or -1: none) whose step-1 gradient first holds a NaN: its call fails alone
 * (GCOLL_ERR_INVALID, the communicator usable) and it calls again with the clean gradient,
 * which the others' call, still waiting, pairs with; every check of the step then holds. */
static int nan_victim = -1;

static void check_compressed(const char *spec, size_t count, gcoll_op_t op)
{
    gcoll_compressor_t *c;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK) {
        FAIL("compressor '%s' not created", spec);
        return;
    }
    unsigned fl = gcoll_compressor_flags(c);
    int quantizer = !(fl & GCOLL_CODEC_SPARSE) &&
                    !((fl & GCOLL_CODEC_LOSSLESS) && strncmp(spec, "none", 4) == 0);
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
        if (rank == nan_victim && step == 1) {
            g[count / 3] = NAN;
            /* the nonblocking form refuses it in the call, before anything is queued */
            gcoll_request_t *req = NULL;
            gcoll_status_t rn = gcoll_icompressed_allreduce(comm, st, g, out, count, op, &req);
            checks++;
            if (rn != GCOLL_ERR_INVALID || req)
                FAIL("compressed '%s': a NaN in a nonblocking call gave %s", spec,
                     gcoll_status_string(rn == GCOLL_OK ? gcoll_wait(req) : rn));
            rn = gcoll_compressed_allreduce(comm, st, g, out, count, op);
            checks++;
            if (rn != GCOLL_ERR_INVALID || !strstr(gcoll_comm_last_error(comm), "NaN"))
                FAIL("compressed '%s': a NaN gave %s (%s), not a local invalid-argument error",
                     spec, gcoll_status_string(rn), gcoll_comm_last_error(comm));
            g[count / 3] = grad_of(rank, step, count / 3);
        }
        gcoll_status_t rc = gcoll_compressed_allreduce(comm, st, g, out, count, op);
        checks++;
        if (rc != GCOLL_OK) {
            FAIL("compressed '%s' step %d: %s (%s)", spec, step, gcoll_status_string(rc),
                 gcoll_comm_last_error(comm));
            break;
        }
        if (quantizer && ring_segf(c, count, 0)) {
            float *acc = malloc((count + 1) * sizeof(float));
            simulate_ring(c, ws, ss, step, count, op, acc, want, 0);
            free(acc);
        } else {
            simulate(c, ws, ss, step, count, quantizer, op, want);
        }
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
             * the result is a plausible estimate of the exact sum instead (ef=0: the
             * unbiased form; with feedback QSGD sends its contractive form, scaled by
             * 1/(1 + omega), which check_ef.c's efmean checks over many steps) */
            /* QSGD's variance (Alistarh et al. 2017, lemma 3.1): a value x_i of a bucket of b
             * values with norm ||x|| and s levels rounds to a neighbouring level ||x||/s
             * apart with probability p_i, adding variance (||x||/s)^2 p_i (1 - p_i) <=
             * ||x||^2 / (4 s^2); over the bucket E||Q(x) - x||^2 <= b/(4 s^2) ||x||^2
             * (bits=8: s=127, default bucket 512). Rounding noise is independent between
             * quantizations, so the expected squared error is at most beta times the squared
             * norms of everything quantized: each rank's gradient (all-to-all) or each
             * partial sum on its way round the ring (ring), then the reduced chunk. Over
             * ~30000 elements the error concentrates (measured: 0.6 of the bound): 1.5x. */
            const double sl = 127.0, b = 512.0, beta = b / (4.0 * sl * sl);
            const int ring = ring_segf(c, count, 0) && size > 1;
            double e2 = 0, pre = 0, fin = 0;
            for (size_t k = 0; k < count; k++) {
                double exact = 0, part = 0;
                for (int i = 0; i < size; i++)
                    exact += grad_of(i, step, k);
                if (ring) {
                    /* chunk j is summed in the order j+1, j+2, ..., j+P-1, then j */
                    int j = 0;
                    for (int q = 0; q < size; q++) {
                        size_t o, n;
                        chunk_of(count, q, &o, &n);
                        if (k >= o && k < o + n)
                            j = q;
                    }
                    for (int h = 1; h < size; h++) {
                        part += grad_of((j + h) % size, step, k);
                        pre += part * part;
                    }
                } else {
                    for (int i = 0; i < size; i++)
                        pre += (double)grad_of(i, step, k) * grad_of(i, step, k);
                }
                if (op == GCOLL_AVG)
                    exact /= size;
                e2 += (out[k] - exact) * (out[k] - exact);
                fin += exact * exact;
            }
            double bound = beta * (pre / (op == GCOLL_AVG ? (double)size * size : 1.0) + fin);
            if (!(e2 <= 1.5 * bound))
                FAIL("compressed '%s' step %d: squared error %.4g above 1.5x QSGD's bound %.4g",
                     spec, step, e2, bound);
        } else if (bad) {
            FAIL("compressed '%s' step %d: %zu of %zu wrong, first at %zu: got %g want %g "
                 "(rel l2 %.2g)",
                 spec, step, bad, count, first, out[first], want[first],
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
        float *acc = calloc(count + 1, sizeof(float)), *gi = malloc(count * sizeof(float));
        int ring = ring_segf(c, count, 1) != 0;
        if (ring) {
            simulate_ring(c, ws, ss, 3, count, op, acc, NULL, 1);
            memmove(acc, acc + off, n * sizeof(float));
        }
        for (int i = 0; !ring && i < size; i++) {
            for (size_t k = 0; k < count; k++)
                gi[k] = grad_of(i, 3, k);
            gcoll_encode_chunk(c, ws[i], off, gi + off, n, msg, cap, &len);
            gcoll_decode(c, msg, len, acc, n, i > 0);
        }
        for (size_t k = 0; rc == GCOLL_OK && k < n; k++) {
            float w = op == GCOLL_AVG && !ring ? acc[k] / (float)size : acc[k];
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

int run_compressed(void)
{
    static const char *const specs[] = {
        "none",
        "fp16",
        "bf16",
        "q8",
        "sign",
        "sign:scale=l2",
        "qsgd:bits=8,ef=0",
        "topk:density=0.01",
        "topk:density=0.05,select=sample",
        "topk:density=0.01+q8",
        "topk:density=0.01,ef=0",
        "threshold:tau=8",
        "randomk:density=0.05,seed=3",
        "randomk:density=0.05,seed=3,unbiased=1,ef=0",
        "dgc:density=0.01,momentum=0.9",
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        check_compressed(specs[i], 30011, i % 2 ? GCOLL_AVG : GCOLL_SUM);
    check_compressed("topk:density=0.02", 7, GCOLL_SUM); /* fewer elements than ranks */
    /* random-k's output streamed block by block (1M elements and more), averaged */
    check_compressed("randomk:density=0.01,seed=9", ((size_t)1 << 20) + 4099, GCOLL_AVG);
    /* top-k's threshold among many equal magnitudes, and a selection that cannot come
     * from the sampled threshold's candidates (the streamed scheme's trailer then carries
     * the trim rule's ties, or says the selection follows whole) */
    for (grad_pattern = 1; grad_pattern <= 2; grad_pattern++) {
        check_compressed("topk:density=0.01", 30011, GCOLL_SUM);
        check_compressed("topk:density=0.02,select=sample", 30011, GCOLL_AVG);
    }
    grad_pattern = 0;
    /* a NaN on the last rank: top-k and random-k find it in their feedback pass
     * (GCOLL_EF_SPARE), the others in the scan before the call; the same local error,
     * then the retry */
    nan_victim = size - 1;
    check_compressed("topk:density=0.01+q8", 30011, GCOLL_SUM);
    check_compressed("topk:density=0.02,select=sample", 30011, GCOLL_AVG);
    check_compressed("randomk:density=0.05,seed=3", 30011, GCOLL_AVG);
    check_compressed("q8", 30011, GCOLL_SUM);
    nan_victim = -1;
    /* quantizers with fewer elements than ranks, and none at all */
    check_compressed("q8", 2, GCOLL_SUM);
    check_compressed("sign", 0, GCOLL_AVG);
    /* the ring: chunks cut into different numbers of segments (one more element than
     * P whole segments, one fewer) */
    gcoll_compressor_t *q;
    gcoll_compressor_create("q8", &q);
    size_t segf = ring_segf(q, 1000000, 0);
    gcoll_compressor_destroy(q);
    if (segf && segf < 100000) {
        check_compressed("q8", (size_t)size * segf + 1, GCOLL_SUM);
        check_compressed("sign", (size_t)size * segf - 1, GCOLL_AVG);
    }
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
