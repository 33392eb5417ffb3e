/* topk_stream.c: the compressed allreduce of top-k with its selection pass on the wire.
 *
 * The plain sparse path encodes, then sends: at 1 Gbit/s (4 ranks, 25M floats, top-k 1%)
 * its 31 ms of wire came after the 85 ms of codec work instead of during it
 * (docs/results/shaped-link.md). Here the selection's one pass over e + g (select.c: a sampled
 * threshold, then everything at or above it collected with its value) runs segment by
 * segment, and each segment's candidates go to every other rank as soon as the segment is
 * done. After the pass the selection trims the candidates to k; the rule it applied (keep
 * |v| > thr, and the first `ties` with |v| == thr: select.h) follows in a trailer, and
 * every receiver applies it to the candidates it holds, which yields exactly the pairs the
 * sender selected and subtracted from its residual. When the selection did not come from
 * the streamed candidates (the sampled threshold undershot and the histogram path ran),
 * the trailer says so and the encoded selection follows it. Every rank then sums every
 * rank's pairs in rank order: the same bits as the plain allgather plan.
 *
 * The price is the candidates the trim drops (the sample's padding: about 10% more pairs
 * on the wire); the gain is that the wire runs during the pass, which is the longer part.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "compress/compress.h"
#include "compress/sparsify.h"
#include "compress/wire.h"
#include "collectives/compressed/compressed.h"
#include "collectives/sparse.h"
#include "base/util.h"

/* Segment 0 has the tag of the first message of the other sparse paths (the census
 * and the direct gather: PHASE(0)), so that ranks taking different paths, as they do when
 * their codecs or sizes differ, meet on it and fail with a mismatch instead of a timeout. */
#define PHASE(n) ((uint32_t)(n) << 24)
#define SUB_SEG(s) (PHASE(0) | (uint32_t)(s))
#define SUB_TRAILER PHASE(2)
#define SUB_FULL PHASE(3)

/* Segments per tensor at most: larger tensors get longer segments. */
#define STREAM_SEGS_MAX 256
/* Segments per tensor at least. Streaming costs the sample's padding on the wire (more, in
 * proportion, on smaller tensors: 22% over k at 25M floats and top-k 1%, 35% at 6M) and
 * per-segment work; it gains the wire time it hides under the pass. At 1 Gbit/s, 4 ranks,
 * top-k 1%: 6M floats 27 ms streamed against 24 ms not, 2.5M 11 against 9, 12M 52 against
 * 55, 16M 74 against 74, 25M 102-106 against 120-127. */
#define STREAM_SEGS_MIN 16

/* Trailer: u32 magic, u32 flags, u64 candidates streamed, u64 pairs selected, u32 trim
 * threshold (|v| bits), u32 zero, u64 ties kept at the threshold. */
#define TRAILER_MAGIC 0x54534347u /* "GCST" */
#define TRAILER_LEN 40
enum { TRAILER_FALLBACK = 1u };

size_t gcoll_topk_stream_segment(const gcoll_coll_t *ctx, size_t count)
{
    size_t seg = ctx->cfg->topk_stream;
    if (seg == 0)
        return 0;
    seg = GCOLL_MAX(seg, GCOLL_DIV_UP(count, (size_t)STREAM_SEGS_MAX));
    return GCOLL_DIV_UP(seg, 8) * 8; /* whole vectors of the kernels but at the end */
}

int gcoll_coll_topk_stream_eligible(const gcoll_coll_t *ctx, const gcoll_compressor_t *c, int ef,
                                    size_t count, size_t k)
{
    size_t seg = gcoll_topk_stream_segment(ctx, count);
    /* the selection streams its pass only for top-k of e + g sent as f32 (select.h); the
     * plain path would pick the allgather plan (merged pairs well under the dense size) */
    return ctx->size > 1 && ctx->cfg->sparse_algo == GCOLL_SPARSE_AUTO && seg &&
           count >= STREAM_SEGS_MIN * seg && count <= GCOLL_WIRE_MAX_COUNT && ef &&
           c->sparsify == GCOLL_SPARSIFY_TOPK && c->select != GCOLL_SELECT_REUSE &&
           !gcoll_codec_layered(c, 0, count) && /* one trim rule for the whole tensor */
           c->vs.fmt == GCOLL_VF_F32 && k > 0 && k <= count / (2 * (size_t)ctx->size);
}

/* One peer's incoming messages, received one after the other into buf. */
typedef struct {
    gcoll_treq_t req;
    size_t stage; /* next: segment 0..S-1, S the trailer, S+1 the full selection, S+2 done */
    size_t used;  /* bytes of buf the segments hold */
    size_t *off, *len;
    uint8_t *buf;
    uint8_t trailer[TRAILER_LEN];
    unsigned flags;
    uint64_t cand, nnz, ties;
    uint32_t thr;
    size_t full_len;
} rx_t;

typedef struct {
    const gcoll_coll_t *ctx;
    const gcoll_compressor_t *c;
    size_t count, seg, S, k, bufcap;
    uint32_t sig;
    rx_t *rx;
    gcoll_treq_t *tx;
    int ntx, tx_done;
    uint8_t *sbuf; /* this rank's segment messages, one after the other */
    size_t sused, sent, cand;
    uint8_t trailer[TRAILER_LEN];
    gcoll_status_t st;
    uint64_t ns_net;
    gcoll_select_stream_t rule;
} stream_t;

static gcoll_status_t post_rx(stream_t *t, int j)
{
    rx_t *x = &t->rx[j];
    if (x->stage < t->S)
        return gcoll_channel_irecv(t->ctx->ch, &x->req, j, SUB_SEG(x->stage), t->sig,
                                   x->buf + x->used, t->bufcap - x->used, GCOLL_TREQ_ANYLEN);
    if (x->stage == t->S)
        return gcoll_channel_irecv(t->ctx->ch, &x->req, j, SUB_TRAILER, t->sig, x->trailer,
                                   TRAILER_LEN, 0);
    if (x->stage == t->S + 1)
        return gcoll_channel_irecv(t->ctx->ch, &x->req, j, SUB_FULL, t->sig, x->buf, t->bufcap,
                                   GCOLL_TREQ_ANYLEN);
    return GCOLL_OK;
}

static gcoll_status_t bad_trailer(stream_t *t, int j)
{
    gcoll_channel_set_error(t->ctx->ch, "rank %d sent a malformed streamed top-k trailer", j);
    return GCOLL_ERR_INVALID;
}

/* Takes in a completed message of peer j and posts the next receive. */
static gcoll_status_t rx_complete(stream_t *t, int j)
{
    rx_t *x = &t->rx[j];
    size_t S = t->S;
    if (x->stage < S) {
        x->off[x->stage] = x->used;
        x->len[x->stage] = x->req.nbytes;
        x->used += x->req.nbytes;
    } else if (x->stage == S) {
        const uint8_t *p = x->trailer;
        x->flags = gcoll_get_u32(p + 4);
        x->cand = gcoll_get_u64(p + 8);
        x->nnz = gcoll_get_u64(p + 16);
        x->thr = gcoll_get_u32(p + 24);
        x->ties = gcoll_get_u64(p + 32);
        if (gcoll_get_u32(p) != TRAILER_MAGIC || (x->flags & ~TRAILER_FALLBACK) ||
            gcoll_get_u32(p + 28) != 0 || x->nnz > t->k || x->cand > gcoll_select_cand_cap(t->k) ||
            x->ties > x->nnz || x->thr > 0x7f800000u)
            return bad_trailer(t, j);
        if (!(x->flags & TRAILER_FALLBACK))
            x->stage++; /* no full selection follows */
    } else {
        x->full_len = x->req.nbytes;
    }
    x->stage++;
    return post_rx(t, j);
}

/* Folds in completed requests; 1 in *done_p once everything arrived and went out. */
static gcoll_status_t advance(stream_t *t, int *done_p)
{
    const int P = t->ctx->size;
    int all = 1, done;
    for (int j = 0; j < P; j++) {
        rx_t *x = &t->rx[j];
        if (j == t->ctx->rank)
            continue;
        while (x->stage < t->S + 2) {
            GCOLL_CHECK(gcoll_channel_done(t->ctx->ch, &x->req, &done));
            if (!done)
                break;
            GCOLL_CHECK(rx_complete(t, j));
        }
        all &= x->stage == t->S + 2;
    }
    while (t->tx_done < t->ntx) {
        GCOLL_CHECK(gcoll_channel_done(t->ctx->ch, &t->tx[t->tx_done], &done));
        if (!done)
            break;
        t->tx_done++;
    }
    if (done_p)
        *done_p = all && t->tx_done == t->ntx;
    return GCOLL_OK;
}

static gcoll_status_t send_all(stream_t *t, uint32_t sub, const uint8_t *buf, size_t len)
{
    const int P = t->ctx->size, r = t->ctx->rank;
    for (int k = 1; k < P; k++)
        GCOLL_CHECK(
            gcoll_channel_isend(t->ctx->ch, &t->tx[t->ntx++], (r + k) % P, sub, t->sig, buf, len));
    return GCOLL_OK;
}

/* Segment s of this rank's candidates, as an f32 sparse message to every peer. */
static gcoll_status_t send_segment(stream_t *t, size_t s, const uint32_t *idx, const float *val,
                                   size_t n)
{
    size_t len = 0;
    GCOLL_CHECK(gcoll_codec_encode_pairs(NULL, idx, val, n, t->count, t->sbuf + t->sused,
                                         t->bufcap - t->sused, &len));
    GCOLL_CHECK(send_all(t, SUB_SEG(s), t->sbuf + t->sused, len));
    t->sused += len;
    t->sent = s + 1;
    t->cand += n;
    return GCOLL_OK;
}

/* select.c's hook after each segment of the pass: send it, and move the network along
 * without waiting. A failure is kept for after the pass, which cannot be stopped. */
static void on_segment(void *arg, size_t s, const uint32_t *idx, const float *val, size_t n)
{
    stream_t *t = arg;
    if (t->st != GCOLL_OK)
        return;
    t->st = send_segment(t, s, idx, val, n);
    uint64_t t0 = gcoll_time_ns();
    if (t->st == GCOLL_OK)
        t->st = gcoll_channel_progress(t->ctx->ch, 0);
    if (t->st == GCOLL_OK)
        t->st = advance(t, NULL);
    t->ns_net += gcoll_time_ns() - t0;
}

/* The trailer after the last segment (and the whole selection where the pass did not
 * stream it: the fallback), to every peer. */
static gcoll_status_t send_trailer(stream_t *t, size_t nnz, const uint8_t *msg, size_t len)
{
    int fallback = !t->rule.streamed;
    gcoll_put_u32(t->trailer, TRAILER_MAGIC);
    gcoll_put_u32(t->trailer + 4, fallback ? TRAILER_FALLBACK : 0);
    gcoll_put_u64(t->trailer + 8, t->cand);
    gcoll_put_u64(t->trailer + 16, nnz);
    gcoll_put_u32(t->trailer + 24, fallback ? 0 : t->rule.thr);
    gcoll_put_u32(t->trailer + 28, 0);
    gcoll_put_u64(t->trailer + 32, fallback ? 0 : t->rule.ties);
    GCOLL_CHECK(send_all(t, SUB_TRAILER, t->trailer, TRAILER_LEN));
    if (fallback)
        GCOLL_CHECK(send_all(t, SUB_FULL, msg, len));
    GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS,
                "streamed top-k: %zu candidates in %zu segments, %zu "
                "selected %s %zu at the threshold",
                t->cand, t->S, nnz,
                fallback ? "whole (not from the candidates)" : "by the trim rule, keeping",
                fallback ? (size_t)0 : t->rule.ties);
    return GCOLL_OK;
}

/* Until every peer's messages are in and every send is done. */
static gcoll_status_t wait_all(stream_t *t)
{
    const int P = t->ctx->size, r = t->ctx->rank;
    for (int done = 0;;) {
        GCOLL_CHECK(advance(t, &done));
        if (done)
            return GCOLL_OK;
        /* the wait names one pending peer: one that shares our CPU if there is one (it
         * needs the CPU; gcoll_channel_poll then yields at once), else the first */
        const gcoll_treq_t *w = NULL;
        for (int j = 0; j < P; j++) {
            if (j == r || t->rx[j].stage >= t->S + 2)
                continue;
            if (!w)
                w = &t->rx[j].req;
            if (gcoll_channel_peer_shares_cpu(t->ctx->ch, j) == 1) {
                w = &t->rx[j].req;
                break;
            }
        }
        GCOLL_CHECK(gcoll_channel_poll(t->ctx->ch, w ? w : &t->tx[t->tx_done]));
    }
}

/* Every rank's selection, summed in rank order into out: the peers' read from their
 * messages through their trim rules (validated first: decode.c), this rank's the one just
 * sent (nnz pairs in the state's scratch, select.h). */
static gcoll_status_t sum_selections(stream_t *t, gcoll_tensor_state_t *s, float *out,
                                     gcoll_op_t op, size_t nnz)
{
    const int P = t->ctx->size, r = t->ctx->rank;
    uint64_t t0 = gcoll_time_ns();
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    gcoll_sum_src_t *src = calloc((size_t)P, sizeof(*src));
    const uint8_t **msgs = src ? calloc((size_t)P * t->S, sizeof(*msgs)) : NULL;
    if (!src || !msgs)
        goto out;
    for (int j = 0; j < P; j++) {
        rx_t *x = &t->rx[j];
        gcoll_sum_src_t *q = &src[j];
        if (j == r) {
            *q = (gcoll_sum_src_t){.idx = s->sc.idx, .val = s->sc.val, .n = nnz};
            continue;
        }
        q->msgs = msgs + (size_t)j * t->S;
        q->want = (size_t)x->nnz;
        if (x->flags & TRAILER_FALLBACK) {
            msgs[(size_t)j * t->S] = x->buf;
            q->lens = &x->full_len;
            q->nmsg = 1;
            continue;
        }
        for (size_t g = 0; g < t->S; g++)
            msgs[(size_t)j * t->S + g] = x->buf + x->off[g];
        q->lens = x->len;
        q->nmsg = t->S;
        q->seg = t->seg;
        q->filter = 1;
        q->thr = x->thr;
        q->ties = (size_t)x->ties;
        q->cand = (size_t)x->cand;
    }
    int bad = 0;
    st = gcoll_sum_sources(t->c, src, P, out, t->count, op == GCOLL_AVG ? (float)P : 1.0f, &bad);
    if (st == GCOLL_ERR_INVALID)
        gcoll_channel_set_error(t->ctx->ch,
                                "rank %d sent a malformed streamed top-k selection (its "
                                "segments or its trailer)",
                                bad);
    t->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
out:
    free(src);
    free(msgs);
    return st;
}

gcoll_status_t gcoll_topk_stream_run(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     gcoll_nancheck_t check, const gcoll_step_plan_t *plan,
                                     uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    const gcoll_compressor_t *c = s->c;
    stream_t t = {.ctx = ctx, .c = c, .count = count, .sig = sig};
    t.seg = gcoll_topk_stream_segment(ctx, count);
    t.S = GCOLL_DIV_UP(count, t.seg);
    t.k = plan->k; /* the call's plan: the k its selection keeps */
    /* every segment's header plus at most cand_cap pairs of 8 bytes (raw indices, f32) */
    t.bufcap = t.S * GCOLL_WIRE_HDR + 8 * gcoll_select_cand_cap(t.k);
    size_t msgcap = plan->bound, len = 0, nnz = 0;
    uint8_t *msg = malloc(msgcap), *rstore = NULL;
    size_t *offs = calloc(2 * t.S * (size_t)P + 1, sizeof(size_t));
    t.rx = calloc((size_t)P, sizeof(*t.rx));
    t.tx = calloc((size_t)(P - 1) * (t.S + 2) + 1, sizeof(*t.tx));
    t.sbuf = malloc(t.bufcap);
    rstore = malloc((size_t)(P - 1) * t.bufcap);
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!msg || !offs || !t.rx || !t.tx || !t.sbuf || !rstore)
        goto out;
    for (int j = 0, q = 0; j < P; j++) {
        rx_t *x = &t.rx[j];
        x->off = offs + 2 * t.S * (size_t)j;
        x->len = x->off + t.S;
        if (j == r)
            continue;
        x->buf = rstore + (size_t)q++ * t.bufcap;
        GCOLL_CHECK_GOTO(post_rx(&t, j), st, out);
    }
    /* the selection pass, sending as it goes */
    t.rule = (gcoll_select_stream_t){.seg = t.seg, .emit = on_segment, .arg = &t};
    const gcoll_encode_opts_t opt = {.check = check, .stream = &t.rule, .plan = plan};
    uint64_t t0 = gcoll_time_ns();
    st = gcoll_codec_encode_range(c, s, 0, grad, count, s->step, &opt, msg, msgcap, &len);
    uint64_t dt = gcoll_time_ns() - t0;
    ctx->ch->counters.ns_compress += dt - GCOLL_MIN(dt, t.ns_net);
    ctx->ch->counters.ns_wire += t.ns_net;
    if (st == GCOLL_OK)
        st = t.st;
    if (st == GCOLL_OK)
        st = gcoll_decode_info(msg, len, NULL, &nnz);
    if (st != GCOLL_OK)
        goto out;
    /* segments the pass did not stream (the selection took another way) go out empty */
    while (t.sent < t.S)
        GCOLL_CHECK_GOTO(send_segment(&t, t.sent, NULL, NULL, 0), st, out);
    GCOLL_CHECK_GOTO(send_trailer(&t, nnz, msg, len), st, out);
    uint64_t t1 = gcoll_time_ns();
    GCOLL_CHECK_GOTO(wait_all(&t), st, out);
    uint64_t t2 = gcoll_time_ns();
    st = sum_selections(&t, s, out, op, nnz);
    /* where the call's time went, for docs/results/shaped-link.md (bench/stream-trace.sh) */
    GCOLL_TRACE(GCOLL_SUBSYS_COMPRESS,
                "topk-stream phases: rank %d count %zu pass_ms %.3f net_ms %.3f tail_ms %.3f "
                "wait_ms %.3f sum_ms %.3f",
                r, count, dt / 1e6, t.ns_net / 1e6, (t1 - t0 - dt) / 1e6, (t2 - t1) / 1e6,
                (gcoll_time_ns() - t2) / 1e6);
out:
    if (st != GCOLL_OK) {
        gcoll_channel_cancel(ctx->ch, t.tx, t.ntx);
        for (int j = 0; t.rx && j < P; j++)
            if (j != r && t.rx[j].buf && t.rx[j].stage < t.S + 2)
                gcoll_channel_cancel(ctx->ch, &t.rx[j].req, 1);
    }
    free(rstore);
    free(t.sbuf);
    free(t.tx);
    free(t.rx);
    free(offs);
    free(msg);
    return st;
}
