/* compressed.c: allreduce and reduce-scatter of a gradient through its tensor state's
 * compressor, with error feedback. Sparsifiers go through the sparse allreduce; random-k
 * with a shared seed reduces only the k selected values densely; quantizers use the
 * scheme of 1-bit Adam (Tang et al. 2021): compress with the worker residual, all-to-all
 * the chunks, each rank decodes and reduces its chunk, re-compresses it with a server
 * residual, and everyone gathers the compressed chunks. Every rank decodes the same bytes,
 * so the result is bit-identical on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "compress/compress.h"
#include "collectives/compressed/compressed.h"
#include "hier/hier.h"
#include "compress/kernels.h"
#include "collectives/reduce.h"
#include "collectives/sparse.h"
#include "base/util.h"

#define PHASE(n) ((uint32_t)(n) << 24)

static gcoll_span_t chunk(size_t count, int P, int j)
{
    return gcoll_even_chunk(count, P, j);
}

gcoll_status_t gcoll_compressed_server_state(gcoll_tensor_state_t *s, size_t n)
{
    if (s->server && s->server->count == n)
        return GCOLL_OK;
    if (s->server)
        GCOLL_INFO(GCOLL_SUBSYS_COMPRESS, "compressed allreduce: chunk size changed; "
                                          "server residual reset");
    gcoll_state_destroy(s->server);
    s->server = NULL;
    return gcoll_state_create_mode(s->c, n, GCOLL_STATE_SERVER, &s->server);
}

/* The quantizers' scheme's buffers (run_quantized): this rank's chunk, and per rank the
 * lengths, capacities and places of the messages. */
typedef struct {
    const gcoll_coll_t *ctx;
    gcoll_tensor_state_t *s;
    size_t count;
    gcoll_span_t mine;
    uint32_t sig;
    size_t *len, *cap, *rlen;
    uint8_t **sbuf, **rbuf;
    uint8_t *sstore, *rstore, *smsg;
    float *acc;  /* this rank's reduced chunk */
    size_t mlen; /* of smsg, the reduced chunk re-compressed */
} quant_t;

/* 1. worker: compress every chunk with its slice of the residual, clip= scaling by the
 * norm of the whole gradient (not each chunk's own). */
static gcoll_status_t quant_encode(quant_t *q, const float *grad, gcoll_nancheck_t check)
{
    const int P = q->ctx->size, r = q->ctx->rank;
    gcoll_tensor_state_t *s = q->s;
    const gcoll_compressor_t *c = s->c;
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < P; j++) {
        q->cap[j] = gcoll_codec_bound(c, chunk(q->count, P, j).len);
        stot += q->cap[j];
        rtot += gcoll_codec_bound(c, q->mine.len);
    }
    if (!(q->sstore = malloc(stot)) || !(q->rstore = malloc(rtot)) ||
        !(q->acc = malloc((q->mine.len + 1) * sizeof(float))))
        return GCOLL_ERR_NOMEM;
    uint64_t t0 = gcoll_time_ns();
    gcoll_state_set_salt(s, (uint64_t)r);
    const gcoll_encode_opts_t opt = {
        .check = check,
        .clip_preset = 1,
        .clip_factor = gcoll_codec_clip_factor(c, grad, q->count, 1, s->nranks),
    };
    stot = rtot = 0;
    for (int j = 0; j < P; j++) {
        gcoll_span_t ch = chunk(q->count, P, j);
        q->sbuf[j] = q->sstore + stot;
        GCOLL_CHECK(gcoll_codec_encode_range(c, s, ch.off, grad + ch.off, ch.len, s->step, &opt,
                                             q->sbuf[j], q->cap[j], &q->len[j]));
        stot += q->cap[j];
        q->rbuf[j] = q->rstore + rtot;
        rtot += gcoll_codec_bound(c, q->mine.len);
    }
    q->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    return GCOLL_OK;
}

/* 2. chunk j goes to rank j; 3. this rank reduces its chunk into q->acc, contributions in
 * rank order (from *t0_p on: codec time). */
static gcoll_status_t quant_reduce(quant_t *q, gcoll_op_t op, uint64_t *t0_p)
{
    const int P = q->ctx->size, r = q->ctx->rank;
    const gcoll_compressor_t *c = q->s->c;
    size_t rc = gcoll_codec_bound(c, q->mine.len);
    size_t *rcap = calloc((size_t)P, sizeof(size_t));
    if (!rcap)
        return GCOLL_ERR_NOMEM;
    for (int j = 0; j < P; j++)
        rcap[j] = rc;
    gcoll_status_t st =
        gcoll_exchange_anylen(q->ctx, PHASE(0), q->sig, q->sbuf, q->len, q->rbuf, rcap, q->rlen);
    free(rcap);
    if (st != GCOLL_OK)
        return st;
    q->rbuf[r] = q->sbuf[r];
    q->rlen[r] = q->len[r];
    *t0_p = gcoll_time_ns();
    for (int i = 0; i < P; i++) {
        st = gcoll_codec_decode(c, q->rbuf[i], q->rlen[i], q->acc, q->mine.len,
                                i == 0 ? GCOLL_DECODE_SET : GCOLL_DECODE_ADD);
        if (st != GCOLL_OK) {
            gcoll_channel_set_error(q->ctx->ch, "the compressed chunk from rank %d is malformed",
                                    i);
            return st;
        }
    }
    if (op == GCOLL_AVG)
        for (size_t i = 0; i < q->mine.len; i++)
            q->acc[i] /= (float)P;
    /* the worker messages are done with: a call holds one phase's buffers at a time */
    free(q->sstore);
    free(q->rstore);
    q->sstore = q->rstore = NULL;
    return GCOLL_OK;
}

/* 4. server: re-compress the reduced chunk with its own residual into q->smsg. */
static gcoll_status_t quant_server(quant_t *q)
{
    const int P = q->ctx->size, r = q->ctx->rank;
    gcoll_tensor_state_t *s = q->s;
    const gcoll_compressor_t *c = s->c;
    GCOLL_CHECK(gcoll_compressed_server_state(s, q->mine.len));
    gcoll_state_set_salt(s->server, (uint64_t)(P + r));
    size_t mcap = gcoll_codec_bound(c, q->mine.len);
    if (!(q->smsg = malloc(mcap)))
        return GCOLL_ERR_NOMEM;
    GCOLL_CHECK(gcoll_codec_encode_range(c, s->server, 0, q->acc, q->mine.len, s->step, NULL,
                                         q->smsg, mcap, &q->mlen));
    s->server->step++;
    return GCOLL_OK;
}

/* 5. everyone gathers every compressed chunk and decodes it in place (the reduced chunk is
 * done with: freed before the gather's buffers are taken). */
static gcoll_status_t quant_gather(quant_t *q, float *out)
{
    const int P = q->ctx->size, r = q->ctx->rank;
    const gcoll_compressor_t *c = q->s->c;
    free(q->acc);
    q->acc = NULL;
    for (int j = 0; j < P; j++) {
        q->sbuf[j] = q->smsg;
        q->len[j] = q->mlen;
    }
    free(q->rstore);
    size_t rtot = 0;
    for (int j = 0; j < P; j++)
        rtot += q->cap[j];
    if (!(q->rstore = malloc(rtot)))
        return GCOLL_ERR_NOMEM;
    rtot = 0;
    for (int j = 0; j < P; j++) {
        q->rbuf[j] = q->rstore + rtot;
        rtot += q->cap[j];
    }
    GCOLL_CHECK(
        gcoll_exchange_anylen(q->ctx, PHASE(1), q->sig, q->sbuf, q->len, q->rbuf, q->cap, q->rlen));
    q->rbuf[r] = q->smsg;
    q->rlen[r] = q->mlen;
    uint64_t t0 = gcoll_time_ns();
    for (int j = 0; j < P; j++) {
        gcoll_span_t ch = chunk(q->count, P, j);
        gcoll_status_t st =
            gcoll_codec_decode(c, q->rbuf[j], q->rlen[j], out + ch.off, ch.len, GCOLL_DECODE_SET);
        if (st != GCOLL_OK) {
            gcoll_channel_set_error(q->ctx->ch, "the reduced chunk from rank %d is malformed", j);
            return st;
        }
    }
    q->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    return GCOLL_OK;
}

/* Quantizers: all-to-all of worker-compressed chunks, reduce, re-compress, gather. */
static gcoll_status_t run_quantized(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                    const float *grad, float *out, size_t count, gcoll_op_t op,
                                    int shard_only, gcoll_nancheck_t check, uint32_t sig)
{
    const int P = ctx->size;
    quant_t q = {
        .ctx = ctx, .s = s, .count = count, .mine = chunk(count, P, ctx->rank), .sig = sig};
    q.len = calloc(3 * (size_t)P, sizeof(size_t));
    q.cap = q.len ? q.len + P : NULL;
    q.rlen = q.len ? q.cap + P : NULL;
    q.sbuf = calloc(2 * (size_t)P, sizeof(uint8_t *));
    q.rbuf = q.sbuf ? q.sbuf + P : NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    uint64_t t0 = 0;
    if (!q.len || !q.sbuf)
        goto out;
    GCOLL_CHECK_GOTO(quant_encode(&q, grad, check), st, out);
    GCOLL_CHECK_GOTO(quant_reduce(&q, op, &t0), st, out);
    if (shard_only) {
        memcpy(out, q.acc, q.mine.len * sizeof(float));
        ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
        goto out;
    }
    GCOLL_CHECK_GOTO(quant_server(&q), st, out);
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    st = quant_gather(&q, out);
out:
    free(q.smsg);
    free(q.acc);
    free(q.rstore);
    free(q.sstore);
    free(q.sbuf);
    free(q.len);
    return st;
}

/* Whether a sparsifier's messages are small enough to gather without a census: when every
 * rank's largest possible message (the codec's bound) takes at most 1/P of the dense
 * tensor, the sparse allreduce would pick its allgather plan whatever the counts, so each
 * rank sends its message straight to every other (one step instead of the census's P-1
 * and the ring's P-1: latency a small bucket pays on every call). Deterministic from the
 * configuration, the codec and count. */
static int gather_direct(const gcoll_coll_t *ctx, const gcoll_step_plan_t *plan, size_t count)
{
    size_t b = plan->bound;
    return ctx->size > 1 && ctx->cfg->sparse_algo == GCOLL_SPARSE_AUTO && b > 0 &&
           b <= count * sizeof(float) / (size_t)ctx->size;
}

/* Every rank's message to every rank, then their sum in rank order. */
static gcoll_status_t gather_and_sum(const gcoll_coll_t *ctx, const gcoll_compressor_t *c,
                                     size_t cap, uint8_t *msg, size_t len, float *out, size_t count,
                                     gcoll_op_t op, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    size_t *slen = calloc(3 * (size_t)P, sizeof(size_t)), *rcap = slen ? slen + P : NULL,
           *rlen = slen ? slen + 2 * P : NULL;
    uint8_t **sbuf = calloc(2 * (size_t)P, sizeof(uint8_t *)), **rbuf = sbuf ? sbuf + P : NULL;
    uint8_t *rstore = malloc((size_t)P * cap + 1);
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!slen || !sbuf || !rstore)
        goto out;
    for (int j = 0; j < P; j++) {
        sbuf[j] = msg;
        slen[j] = len;
        rbuf[j] = rstore + (size_t)j * cap;
        rcap[j] = cap;
    }
    /* PHASE(0): the tag of the census and of the streamed scheme's first message, so that
     * ranks on different paths (codecs or sizes that differ) fail on the signature */
    GCOLL_CHECK_GOTO(gcoll_exchange_anylen(ctx, PHASE(0), sig, sbuf, slen, rbuf, rcap, rlen), st,
                     out);
    rbuf[r] = msg;
    rlen[r] = len;
    uint64_t t0 = gcoll_time_ns();
    int bad = 0;
    st = gcoll_codec_sum(c, (const uint8_t *const *)rbuf, rlen, P, out, count,
                         op == GCOLL_AVG ? (float)P : 1.0f, &bad);
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (st == GCOLL_ERR_INVALID)
        gcoll_channel_set_error(ctx->ch, "the compressed message of rank %d is malformed", bad);
out:
    free(rstore);
    free(sbuf);
    free(slen);
    return st;
}

/* The whole tensor's encode, before anything is sent. Where the codec checks for NaN/Inf
 * in its feedback pass (GCOLL_NANCHECK_FOLD, chosen by run_compressed only), any failure leaves the
 * state as it was, so it is this rank's call's alone, as a bad argument would be
 * (the channel's op_local); on other paths a failure may come after the residual took g. */
static gcoll_status_t encode_first(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                   gcoll_nancheck_t check, const gcoll_step_plan_t *plan,
                                   const float *grad, size_t count, uint8_t *msg, size_t cap,
                                   size_t *len_p)
{
    const gcoll_encode_opts_t opt = {.check = check, .plan = plan};
    gcoll_status_t st =
        gcoll_codec_encode_range(s->c, s, 0, grad, count, s->step, &opt, msg, cap, len_p);
    if (st == GCOLL_OK || check != GCOLL_NANCHECK_FOLD)
        return st;
    ctx->ch->op_local = 1;
    if (st == GCOLL_ERR_INVALID) {
        size_t bad = gcoll_kernels()->first_bad(grad, count);
        if (bad < count)
            gcoll_channel_set_error(ctx->ch, "grad[%zu] is NaN or infinite", bad);
        else
            gcoll_channel_set_error(ctx->ch, "the residual plus the gradient is not finite");
    }
    return st;
}

/* Sparsifiers: encode once, then the sparse allreduce of what was sent. */
static gcoll_status_t run_sparse(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                 const float *grad, float *out, size_t count, gcoll_op_t op,
                                 gcoll_nancheck_t check, const gcoll_step_plan_t *plan,
                                 uint32_t sig)
{
    const gcoll_compressor_t *c = s->c;
    size_t cap = plan->bound, len = 0, nnz = 0;
    uint8_t *msg = malloc(cap);
    gcoll_pairs_t pairs = {0};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!msg)
        return st;
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK_GOTO(encode_first(ctx, s, check, plan, grad, count, msg, cap, &len), st, out);
    if (gather_direct(ctx, plan, count)) {
        ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
        st = gather_and_sum(ctx, c, cap, msg, len, out, count, op, sig);
        goto out;
    }
    GCOLL_CHECK_GOTO(gcoll_decode_info(msg, len, NULL, &nnz), st, out);
    pairs.n = nnz; /* decoded from msg only if the plan needs the pairs */
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    gcoll_sparse_call_t call = {.codec = c,
                                .pairs = &pairs,
                                .msg = msg,
                                .msglen = len,
                                .count = count,
                                .out = out,
                                .op = op,
                                .kind = GCOLL_KIND_COMPRESSED,
                                .sig = sig};
    st = gcoll_sparse_run(ctx, &call, NULL);
out:
    gcoll_pairs_free(&pairs);
    free(msg);
    return st;
}

/* Random-k's output from the k reduced values at their (ascending) indices: the sums, zeros
 * elsewhere, through the merged sum's blocks streamed out (glibc's memset reads every line
 * of a large output first); with EF21 (c->ef21) the estimate G = mean_i g_i (op SUM: the
 * sum) moved by the reduced differences, kept as the server state's buffer. */
static gcoll_status_t randomk_out(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                  const gcoll_compressor_t *c, const uint32_t *idx,
                                  const float *val, size_t k, float *out, size_t count,
                                  gcoll_op_t op)
{
    uint64_t t0 = gcoll_time_ns();
    const float div = op == GCOLL_AVG ? (float)ctx->size : 1.0f;
    gcoll_status_t st = GCOLL_OK;
    if (c->ef21 && s->e && s->mode == GCOLL_STATE_WORKER) {
        st = gcoll_compressed_server_state(s, count);
        if (st == GCOLL_OK) {
            float *G = s->server->e;
            for (size_t j = 0; j < k; j++)
                G[idx[j]] += div != 1.0f ? val[j] / div : val[j];
            memcpy(out, G, count * sizeof(float));
        }
    } else {
        gcoll_sum_src_t src = {.idx = idx, .val = val, .n = k};
        st = gcoll_sum_sources(c, &src, 1, out, count, div, NULL);
    }
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    return st;
}

/* Random-k with a shared seed: every rank picked the same indices, so only the k values
 * are reduced, densely. */
static gcoll_status_t run_randomk(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                  const float *grad, float *out, size_t count, gcoll_op_t op,
                                  gcoll_nancheck_t check, const gcoll_step_plan_t *plan,
                                  uint32_t sig)
{
    const gcoll_compressor_t *c = s->c;
    size_t cap = plan->bound, len = 0, k = 0;
    uint8_t *msg = malloc(cap);
    uint32_t *idx = NULL;
    float *val = NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!msg)
        return st;
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK_GOTO(encode_first(ctx, s, check, plan, grad, count, msg, cap, &len), st, out);
    GCOLL_CHECK_GOTO(gcoll_decode_info(msg, len, NULL, &k), st, out);
    idx = malloc((k + 1) * sizeof(uint32_t));
    val = malloc((k + 1) * sizeof(float));
    st = GCOLL_ERR_NOMEM;
    if (!idx || !val)
        goto out;
    GCOLL_CHECK_GOTO(gcoll_codec_decode_pairs(c, msg, len, count, idx, val, k, &k), st, out);
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    GCOLL_CHECK_GOTO(
        gcoll_coll_ring_allreduce(ctx, val, k, GCOLL_FLOAT32, GCOLL_SUM, sig, PHASE(0)), st, out);
    st = randomk_out(ctx, s, c, idx, val, k, out, count, op);
out:
    free(idx);
    free(val);
    free(msg);
    return st;
}

enum { ALGO_AUTO = 0, ALGO_ALLTOALL = 1, ALGO_RING = 2 }; /* GCOLL_COMPRESSED_ALGO */
typedef enum { S_DENSE, S_ALLTOALL, S_RING, S_RANDOMK, S_SPARSE, S_STREAM } scheme_t;
static const char *const scheme_names[GCOLL_COMPRESSED_SCHEMES] = {
    "dense ring", "alltoall", "ring", "random-k dense values", "sparse", "streamed sparse"};
/* Calls run by each scheme in this process (gcoll_coll_compressed_runs) */
static uint64_t scheme_runs[GCOLL_COMPRESSED_SCHEMES];

/* Scheme of a compressed allreduce; deterministic from the configuration, the codec, count,
 * P and the state's step (s NULL: a state of c past its warm-up), so every rank picks the
 * same; plan: the call's (its k). For quantizers both schemes put 2 (P-1)/P of the
 * compressed tensor on the wire; the ring overlaps compression with transfer segment by
 * segment but re-quantizes P-1 times and takes 2 (P-1) latency-bound steps. */
static scheme_t pick_scheme(const gcoll_coll_t *ctx, const gcoll_compressor_t *c,
                            const gcoll_tensor_state_t *s, const gcoll_step_plan_t *plan,
                            size_t count, int shard_only, char *why, size_t len)
{
    const int P = ctx->size;
    unsigned flags = gcoll_codec_flags(c);
    size_t segf = GCOLL_CRING_SEG(ctx->cfg->ring_chunk);
    size_t per = count / (size_t)(P > 0 ? P : 1);
    snprintf(why, len, "by codec");
    if (!shard_only && (flags & GCOLL_CODEC_LOSSLESS) && c->vs.fmt == GCOLL_VF_F32)
        return S_DENSE;
    if (!shard_only && (flags & GCOLL_CODEC_SPARSE)) {
        if (flags & GCOLL_CODEC_RANDOMK)
            return S_RANDOMK;
        size_t k = plan->k;
        int ef = s ? s->e != NULL && s->mode == GCOLL_STATE_WORKER : c->ef;
        if (!gcoll_coll_topk_stream_eligible(ctx, c, ef, count, k))
            return S_SPARSE;
        snprintf(why, len, "top-k of %zu in %zu floats, selection pass sent in segments of %zu", k,
                 count, gcoll_topk_stream_segment(ctx, count));
        return S_STREAM;
    }
    if (ctx->cfg->compressed_algo == ALGO_ALLTOALL) {
        snprintf(why, len, "forced by GCOLL_COMPRESSED_ALGO");
        return S_ALLTOALL;
    }
    if (P < 2 || c->clip > 0 || c->clip_value > 0) {
        snprintf(why, len, "%s",
                 P < 2 ? "one rank"
                       : "clipping applies to each rank's own "
                         "gradient: the ring would clip partial "
                         "sums");
        return S_ALLTOALL;
    }
    if (ctx->cfg->compressed_algo == ALGO_RING) {
        snprintf(why, len, "forced by GCOLL_COMPRESSED_ALGO");
        return S_RING;
    }
    if (gcoll_codec_reduce_fp32(c)) {
        /* NCCLX's quantized reduce-scatter, Megatron's fp32 reduction: each rank's message
         * is decoded and summed in fp32 by the chunk's owner, which quantizes once more,
         * so the error does not grow with P as the ring's hop-by-hop rounding does */
        snprintf(why, len, "narrow float format: decoded and summed in fp32, quantized once more");
        return S_ALLTOALL;
    }
    snprintf(why, len, "%d ranks, %zu floats per rank: %s 4 segments of %zu to pipeline", P, per,
             per >= 4 * segf ? "at least" : "fewer than", segf);
    return per >= 4 * segf ? S_RING : S_ALLTOALL;
}

/* The codec a call uses, for the state and its server state alike (this step's copy of a
 * codec in warm-up, then the original again). */
static void use_codec(gcoll_tensor_state_t *s, const gcoll_compressor_t *c)
{
    s->c = c;
    if (s->server)
        s->server->c = c;
}

/* The end of a call that used a step's codec: the state's own again and, on success, the
 * next step. */
static gcoll_status_t end_call(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                               const gcoll_compressor_t *orig, size_t count, gcoll_status_t st)
{
    use_codec(s, orig);
    if (st == GCOLL_OK) {
        gcoll_state_advance(s);
        ctx->ch->counters.bytes_raw += count * sizeof(float);
    }
    return st;
}

/* Ranks whose states were made from different specs would fail on an opaque call
 * signature, or not at all where their messages happen to agree in length. So the first
 * call with a state (and only it: later calls pay nothing) sends the hash of the canonical
 * spec and the spec as written to every rank, in a phase of its own with a signature that
 * does not depend on the spec (bytes not counted); every rank compares every rank's with
 * rank 0's, so all name the same pair. */
#define SPEC_CHECK PHASE(0x7f)
static gcoll_status_t check_spec(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                 const gcoll_compressor_t *c)
{
    const int P = ctx->size, r = ctx->rank;
    if (P == 1) {
        s->spec_checked = 1;
        return GCOLL_OK;
    }
    const size_t cap = 8 + GCOLL_SPEC_MAX, len = 8 + strnlen(c->given, GCOLL_SPEC_MAX - 1);
    uint8_t *store = malloc((size_t)(P + 1) * cap);
    uint8_t **sbuf = calloc(2 * (size_t)P, sizeof(uint8_t *)), **rbuf = sbuf ? sbuf + P : NULL;
    size_t *slen = calloc(3 * (size_t)P, sizeof(size_t)), *rcap = slen ? slen + P : NULL,
           *rlen = slen ? slen + 2 * P : NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!store || !sbuf || !slen)
        goto out;
    uint8_t *mine = store + (size_t)P * cap;
    gcoll_put_u64(mine, gcoll_hash64(c->spec, strlen(c->spec), 0));
    memcpy(mine + 8, c->given, len - 8);
    for (int j = 0; j < P; j++) {
        sbuf[j] = j == r ? NULL : mine;
        slen[j] = len;
        rbuf[j] = j == r ? NULL : store + (size_t)j * cap;
        rcap[j] = cap;
    }
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_COMPRESSED, 0, 0, 0, 0x7f);
    /* setup, as the rendezvous is: not the collective's bytes in the counters */
    const uint64_t sent = ctx->ch->counters.bytes_sent, got = ctx->ch->counters.bytes_received;
    st = gcoll_exchange_anylen(ctx, SPEC_CHECK, sig, sbuf, slen, rbuf, rcap, rlen);
    ctx->ch->counters.bytes_sent = sent;
    ctx->ch->counters.bytes_received = got;
    if (st != GCOLL_OK)
        goto out;
    rbuf[r] = mine;
    rlen[r] = len;
    for (int j = 0; j < P; j++)
        if (rlen[j] < 8) {
            gcoll_channel_set_error(ctx->ch, "the compressor spec check of rank %d is malformed",
                                    j);
            st = GCOLL_ERR_TRANSPORT;
            goto out;
        }
    for (int j = 1; j < P; j++)
        if (gcoll_get_u64(rbuf[j]) != gcoll_get_u64(rbuf[0])) {
            gcoll_channel_set_error(ctx->ch,
                                    "the compressor spec (gcoll_compressor_create, "
                                    "GCOLL_COMPRESSOR) differs: rank 0 has '%.*s', rank %d "
                                    "has '%.*s'",
                                    (int)(rlen[0] - 8), (const char *)rbuf[0] + 8, j,
                                    (int)(rlen[j] - 8), (const char *)rbuf[j] + 8);
            st = GCOLL_ERR_MISMATCH;
            goto out;
        }
    s->spec_checked = 1;
out:
    free(slen);
    free(sbuf);
    free(store);
    return st;
}

/* The compressed allreduce (or reduce-scatter) by the plan's scheme, which pick_scheme chose
 * for the plan's reason; check: the call's NaN/Inf policy (run_compressed). */
static gcoll_status_t run_scheme(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                 const float *grad, float *out, size_t count, gcoll_op_t op,
                                 int shard_only, gcoll_nancheck_t check,
                                 const gcoll_step_plan_t *plan)
{
    /* a quantizer's bit-width warm-up: this step's messages and the server's are those of
     * the plan's copy at this step's width (every rank at the same step picks the same) */
    const gcoll_compressor_t *orig = s->c;
    if (!s->spec_checked)
        GCOLL_CHECK(check_spec(ctx, s, orig));
    use_codec(s, gcoll_plan_codec(plan, orig));
    const gcoll_compressor_t *c = s->c;
    const scheme_t sc = (scheme_t)plan->scheme;
    const char *why = plan->why;
    s->nranks = ctx->size; /* DGC's local clipping threshold scales with it */
    /* the signature covers the spec, the count and the step: ranks whose states disagree
     * (another codec, or random-k indices from another step) fail with a mismatch */
    uint64_t h = gcoll_hash64(c->spec, strlen(c->spec), s->step);
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_COMPRESSED, count, (int)(h & 0xffff), op,
                                  (int)(h >> 32) ^ shard_only);
    gcoll_status_t st;
    const char *scheme = scheme_names[sc];
    __atomic_fetch_add(&scheme_runs[sc], 1, __ATOMIC_RELAXED);
    switch (sc) {
    case S_DENSE:
        if (out != grad)
            memcpy(out, grad, count * sizeof(float));
        st = gcoll_coll_ring_allreduce(ctx, out, count, GCOLL_FLOAT32, GCOLL_SUM, sig, 0);
        if (st == GCOLL_OK)
            gcoll_reduce_finish(out, count, GCOLL_FLOAT32, op, ctx->size);
        break;
    case S_RING:
        st = gcoll_compressed_ring(ctx, s, grad, out, count, op, shard_only, check, sig);
        break;
    case S_ALLTOALL:
        st = run_quantized(ctx, s, grad, out, count, op, shard_only, check, sig);
        break;
    case S_RANDOMK:
        st = run_randomk(ctx, s, grad, out, count, op, check, plan, sig);
        break;
    case S_STREAM:
        st = gcoll_topk_stream_run(ctx, s, grad, out, count, op, check, plan, sig);
        break;
    default:
        st = run_sparse(ctx, s, grad, out, count, op, check, plan, sig);
    }
    if (sc == S_RING || sc == S_ALLTOALL || sc == S_STREAM)
        GCOLL_INFO(GCOLL_SUBSYS_COMPRESS, "compressed %s of %zu floats with %s: %s scheme (%s)",
                   shard_only ? "reduce-scatter" : "allreduce", count, c->spec, scheme, why);
    GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS, "compressed %s of %zu floats with %s: %s scheme, step %llu",
                shard_only ? "reduce-scatter" : "allreduce", count, c->spec, scheme,
                (unsigned long long)s->step);
    return end_call(ctx, s, orig, count, st);
}

/* ---- for lib/api/compressed_api.c: the scheme, and the run by scheme (compressed.h) ---- */

void gcoll_coll_compressed_plan(const gcoll_coll_t *ctx, const gcoll_compressor_t *c,
                                const gcoll_tensor_state_t *s, size_t count, int shard_only,
                                gcoll_step_plan_t *plan)
{
    gcoll_codec_plan(c, count, s ? s->step : UINT64_MAX, plan);
    plan->scheme =
        (int)pick_scheme(ctx, c, s, plan, count, shard_only, plan->why, sizeof(plan->why));
}

const char *gcoll_coll_compressed_name(int scheme)
{
    return scheme_names[scheme];
}

uint64_t gcoll_coll_compressed_runs(int scheme)
{
    return __atomic_load_n(&scheme_runs[scheme], __ATOMIC_RELAXED);
}

int gcoll_coll_compressed_foldable(int scheme)
{
    return scheme == S_SPARSE || scheme == S_RANDOMK;
}

int gcoll_coll_compressed_is_ring(int scheme)
{
    return scheme == S_RING;
}

int gcoll_coll_compressed_is_stream(int scheme)
{
    return scheme == S_STREAM;
}

gcoll_status_t gcoll_coll_compressed_run(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                         const float *grad, float *out, size_t count, gcoll_op_t op,
                                         int shard_only, gcoll_nancheck_t check,
                                         const gcoll_step_plan_t *plan)
{
    return run_scheme(ctx, s, grad, out, count, op, shard_only, check, plan);
}

/* ---- the two stages of a pipelined caller (compressed.h) ---- */

void gcoll_encoded_free(gcoll_encoded_t *e)
{
    free(e->msg);
    free(e->idx);
    free(e->val);
    memset(e, 0, sizeof(*e));
}

/* Grows *buf to hold n elements of size esz (*cap_p counts elements). */
static int grow(void **buf, size_t *cap_p, size_t n, size_t esz)
{
    if (*buf && *cap_p >= n)
        return 1;
    void *p = realloc(*buf, (n + 1) * esz);
    if (!p)
        return 0;
    *buf = p;
    *cap_p = n;
    return 1;
}

/* run_scheme's and run_sparse's or run_randomk's local part: this step's codec and
 * signature, then the encode (and random-k's values at their indices). */
gcoll_status_t gcoll_coll_compressed_encode(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                            const float *grad, size_t count, gcoll_op_t op,
                                            gcoll_nancheck_t check, gcoll_encoded_t *e)
{
    e->staged = 0;
    e->st = GCOLL_OK;
    e->err[0] = '\0';
    e->ns = 0;
    const gcoll_step_plan_t *plan = &e->plan;
    const scheme_t sc = (scheme_t)plan->scheme;
    if (sc != S_SPARSE && sc != S_RANDOMK)
        return GCOLL_OK;
    uint64_t t0 = gcoll_time_ns();
    const gcoll_compressor_t *orig = s->c;
    e->staged = 1;
    s->c = gcoll_plan_codec(plan, orig);
    const gcoll_compressor_t *c = s->c;
    s->nranks = ctx->size;
    uint64_t h = gcoll_hash64(c->spec, strlen(c->spec), s->step);
    e->sig = gcoll_call_sig(GCOLL_KIND_COMPRESSED, count, (int)(h & 0xffff), op, (int)(h >> 32));
    /* as gcoll_compressed_run: folding is run_compressed's alone */
    const gcoll_encode_opts_t opt = {
        .check = check == GCOLL_NANCHECK_FOLD ? GCOLL_NANCHECK_SCAN : check, .plan = plan};
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (grow((void **)&e->msg, &e->cap, plan->bound, 1))
        st = gcoll_codec_encode_range(c, s, 0, grad, count, s->step, &opt, e->msg, e->cap, &e->len);
    if (st == GCOLL_OK && sc == S_RANDOMK) {
        size_t k = 0, kv = 0;
        st = gcoll_decode_info(e->msg, e->len, NULL, &k);
        if (st == GCOLL_OK && (!grow((void **)&e->idx, &e->kcap, k, sizeof(uint32_t)) ||
                               !grow((void **)&e->val, &kv, k, sizeof(float))))
            st = GCOLL_ERR_NOMEM;
        if (st == GCOLL_OK)
            st = gcoll_codec_decode_pairs(c, e->msg, e->len, count, e->idx, e->val, k, &e->k);
    }
    s->c = orig;
    e->st = st;
    e->ns = gcoll_time_ns() - t0;
    return st;
}

/* The exchange of a staged encode that succeeded (the caller has checked e->st). */
gcoll_status_t gcoll_coll_compressed_exchange(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                              gcoll_encoded_t *e, float *out, size_t count,
                                              gcoll_op_t op)
{
    const gcoll_compressor_t *orig = s->c;
    if (!s->spec_checked)
        GCOLL_CHECK(check_spec(ctx, s, orig));
    use_codec(s, gcoll_plan_codec(&e->plan, orig));
    const gcoll_compressor_t *c = s->c;
    gcoll_status_t st;
    __atomic_fetch_add(&scheme_runs[e->plan.scheme], 1, __ATOMIC_RELAXED);
    if (e->plan.scheme == S_RANDOMK) {
        st = gcoll_coll_ring_allreduce(ctx, e->val, e->k, GCOLL_FLOAT32, GCOLL_SUM, e->sig,
                                       PHASE(0));
        if (st == GCOLL_OK)
            st = randomk_out(ctx, s, c, e->idx, e->val, e->k, out, count, op);
    } else if (gather_direct(ctx, &e->plan, count)) {
        st = gather_and_sum(ctx, c, e->plan.bound, e->msg, e->len, out, count, op, e->sig);
    } else {
        gcoll_pairs_t pairs = {0};
        st = gcoll_decode_info(e->msg, e->len, NULL, &pairs.n);
        gcoll_sparse_call_t call = {.codec = c,
                                    .pairs = &pairs,
                                    .msg = e->msg,
                                    .msglen = e->len,
                                    .count = count,
                                    .out = out,
                                    .op = op,
                                    .kind = GCOLL_KIND_COMPRESSED,
                                    .sig = e->sig};
        if (st == GCOLL_OK)
            st = gcoll_sparse_run(ctx, &call, NULL);
        gcoll_pairs_free(&pairs);
    }
    GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS,
                "compressed allreduce of %zu floats with %s: %s scheme, step %llu, encoded ahead",
                count, c->spec, scheme_names[e->plan.scheme], (unsigned long long)s->step);
    return end_call(ctx, s, orig, count, st);
}
