/* compressed_ring.c: compressed allreduce of quantizers as a pipelined ring that
 * re-quantizes the partial sum at every hop (GCOLL_COMPRESSED_ALGO=ring).
 *
 * Reduce-scatter: at step t rank r sends chunk r-t-1 and receives chunk r-t-2 from its
 * left neighbour; it decodes what arrived, adds its own gradient, and compresses that
 * partial sum again (with error feedback into its own residual for that slice) before
 * passing it on, so after P-1 steps it holds the whole sum of chunk r. Each chunk travels
 * in segments of half GCOLL_RING_CHUNK uncompressed bytes (64K floats by default: at
 * 1 Gbit/s QSGD 4-bit took 0.190-0.194 s with them, 0.202-0.221 s with 128K). The owner
 * then compresses its reduced chunk with the server residual (as the all-to-all scheme
 * does) and an allgather
 * forwards those bytes unchanged around the ring: every rank decodes the same bytes, so
 * results are bit-identical on every rank.
 *
 * Schedule: the 2 (P-1) + 1 stages of a segment (P-1 reduce-scatter hops, the owner's
 * reduction and re-compression, P-1 allgather receipts) are not run step after step over
 * the whole tensor but skewed, as a software pipeline: stage u of segment k runs in round
 * k + u * CRING_SKEW. Step after step, the reduce-scatter was bound by codec time while
 * the link idled part of the time, and then the allgather by the link while the CPU
 * idled; skewed, every round mixes the hops of several segments, so codec work and wire
 * time overlap over the whole call and the allgather starts with the first reduced
 * segment. Besides, each rank forwards whatever allgather segment has arrived before its
 * next piece of codec work, and its allgather receives land in the reduce-scatter's
 * buffers as those are consumed. Each segment is encoded from the same input with the
 * same offset as step after step (QSGD's rounding is keyed by offset, the residuals are
 * per element), so the order changes no value.
 *
 * The price is P-1 quantizations of each partial sum instead of one; error feedback puts
 * each hop's error back into the next step (Seide et al. 2014's argument per hop). The
 * wire bytes are those of the all-to-all scheme, 2 (P-1)/P of one compressed tensor, plus
 * a message header per segment (48 bytes of codec header and a transport frame): small
 * segments cost bytes, hence the floor of GCOLL_CRING_MIN_SEG elements. */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "compress/compress.h"
#include "collectives/compressed/compressed.h"
#include "base/util.h"

#define PHASE(n) ((uint32_t)(n) << 24)
#define SUB_MAX ((uint32_t)1 << 24)

typedef struct {
    size_t segf;   /* floats per segment */
    size_t nseg;   /* most segments of one chunk */
    size_t segcap; /* bound of one segment's message */
} ring_geom_t;

static size_t nseg_of(const ring_geom_t *g, size_t len)
{
    return GCOLL_DIV_UP(len, g->segf);
}

static gcoll_span_t seg_of(const ring_geom_t *g, gcoll_span_t ch, size_t s)
{
    size_t off = s * g->segf;
    return (gcoll_span_t){ch.off + off, GCOLL_MIN(g->segf, ch.len - off)};
}

size_t gcoll_cring_segment(size_t ring_chunk, size_t count, int P)
{
    size_t segf = GCOLL_CRING_SEG(ring_chunk);
    size_t maxlen = gcoll_even_chunk(count, P, 0).len, steps = (size_t)(P > 1 ? P - 1 : 1);
    segf = GCOLL_MIN(segf, GCOLL_MAX(maxlen, (size_t)1));
    while (steps * GCOLL_DIV_UP(maxlen, segf) >= SUB_MAX)
        segf *= 2;
    return segf;
}

/* One call's ring: geometry, neighbours and the message slots of both phases. Slot (t, k)
 * is segment k of the chunk a step t moves; every slot has a buffer of segcap bytes
 * (rbuf) that the reduce-scatter receives into and, once its partial sum is decoded, the
 * allgather; and a request per phase and direction. */
typedef struct {
    const gcoll_coll_t *ctx;
    ring_geom_t g;
    size_t count, steps, nmsg;
    int P, r, left, right;
    uint32_t sig;
    gcoll_treq_t *rreq[2], *sreq[2]; /* [0] reduce-scatter, [1] allgather */
    uint8_t *rstore, *sstore;
    int ag;     /* an allgather follows (not a reduce-scatter alone) */
    size_t *fk; /* per allgather step t < P-2: the next segment to forward */
} ring_t;

#define RS 0
#define AG 1

/* Stage u of segment k runs in round k + u * CRING_SKEW: the segment a stage needs from the
 * left neighbour was produced there CRING_SKEW rounds earlier, time for it to cross the
 * link while this rank works on other stages. */
#define CRING_SKEW 8

static size_t slot(const ring_t *R, size_t t, size_t k)
{
    return t * R->g.nseg + k;
}
static uint8_t *rbuf(const ring_t *R, size_t t, size_t k)
{
    return R->rstore + slot(R, t, k) * R->g.segcap;
}

/* The chunk of rank r - t - back (mod P): what step t sends (back 1 in the reduce-scatter,
 * 0 in the allgather) or receives (one more). */
static gcoll_span_t chunk_at(const ring_t *R, size_t t, int back)
{
    long j = ((long)R->r - (long)t - back) % R->P;
    return gcoll_even_chunk(R->count, R->P, (int)(j < 0 ? j + R->P : j));
}

static uint32_t tag_of(const ring_t *R, int ph, size_t t, size_t k)
{
    return PHASE(6 + ph) | (uint32_t)slot(R, t, k);
}

static gcoll_status_t ring_recv(ring_t *R, int ph, size_t t, size_t k)
{
    return gcoll_channel_irecv(R->ctx->ch, &R->rreq[ph][slot(R, t, k)], R->left,
                               tag_of(R, ph, t, k), R->sig, rbuf(R, t, k), R->g.segcap,
                               GCOLL_TREQ_ANYLEN);
}

static gcoll_status_t ring_send(ring_t *R, int ph, size_t t, size_t k, const void *msg, size_t len)
{
    return gcoll_channel_isend(R->ctx->ch, &R->sreq[ph][slot(R, t, k)], R->right,
                               tag_of(R, ph, t, k), R->sig, msg, len);
}

/* Sends and the reduce-scatter's receives start complete (slots no message uses count as
 * done; cancel skips them); the allgather's receives start incomplete but not in
 * progress (forward_ready stops at them; cancel skips them). The reduce-scatter's
 * receives are all posted at once: step t receives chunk r-t-2. The allgather's receive
 * of slot (t, k) (chunk r-t-1) reuses that slot's buffer, so it is posted as soon as the
 * reduce-scatter has decoded what the slot held (partial_sum), or here when the
 * reduce-scatter never uses the slot: the neighbour's allgather messages then land in
 * place instead of being buffered by the transport. */
static gcoll_status_t post_recvs(ring_t *R)
{
    for (size_t i = 0; i < R->nmsg; i++) {
        R->rreq[RS][i] = R->sreq[RS][i] = R->sreq[AG][i] =
            (gcoll_treq_t){.done = 1, .status = GCOLL_OK};
        R->rreq[AG][i] = (gcoll_treq_t){.done = 0, .status = GCOLL_OK};
    }
    for (size_t t = 0; t < R->steps; t++) {
        size_t nrs = nseg_of(&R->g, chunk_at(R, t, 2).len);
        for (size_t k = 0; k < nrs; k++)
            GCOLL_CHECK(ring_recv(R, RS, t, k));
        for (size_t k = nrs; R->ag && k < nseg_of(&R->g, chunk_at(R, t, 1).len); k++)
            GCOLL_CHECK(ring_recv(R, AG, t, k));
    }
    return GCOLL_OK;
}

static gcoll_status_t forward_ready(ring_t *R, int poll);

/* Waits for slot (t, k) of phase ph, forwarding allgather segments as they come in the
 * meantime; *msg_p / *len_p: what arrived. */
static gcoll_status_t arrived(ring_t *R, int ph, size_t t, size_t k, const uint8_t **msg_p,
                              size_t *len_p)
{
    gcoll_treq_t *rq = &R->rreq[ph][slot(R, t, k)];
    int done = 0;
    for (;;) {
        GCOLL_CHECK(gcoll_channel_done(R->ctx->ch, rq, &done));
        if (done)
            break;
        GCOLL_CHECK(gcoll_channel_poll(R->ctx->ch, rq));
        GCOLL_CHECK(forward_ready(R, 0));
    }
    *msg_p = rbuf(R, t, k);
    *len_p = rq->nbytes;
    return GCOLL_OK;
}

/* dst = the partial sum of segment sg that arrived in slot (t, k) (zero when P == 1),
 * plus this rank's gradient; the slot is then free for the allgather's receive. */
static gcoll_status_t partial_sum(ring_t *R, const gcoll_compressor_t *c, size_t t, size_t k,
                                  gcoll_span_t sg, const float *grad, float *dst)
{
    const uint8_t *msg = NULL;
    size_t len = 0;
    if (R->P > 1)
        GCOLL_CHECK(arrived(R, RS, t, k, &msg, &len));
    uint64_t t0 = gcoll_time_ns();
    if (R->P == 1) {
        memset(dst, 0, sg.len * sizeof(float));
    } else if (gcoll_codec_decode(c, msg, len, dst, sg.len, GCOLL_DECODE_SET) != GCOLL_OK) {
        gcoll_channel_set_error(R->ctx->ch, "the compressed partial sum from rank %d is malformed",
                                R->left);
        return GCOLL_ERR_INVALID;
    }
    for (size_t i = 0; i < sg.len; i++)
        dst[i] += grad[sg.off + i];
    R->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (R->ag && R->P > 1 && k < nseg_of(&R->g, chunk_at(R, t, 1).len))
        GCOLL_CHECK(ring_recv(R, AG, t, k));
    return GCOLL_OK;
}

/* Forwards every allgather segment that has arrived and not gone on yet, per step in
 * segment order (the left neighbour sends them in that order), after a round of progress
 * that does not wait when poll is set. Codec work between two waits would otherwise hold
 * back what the left neighbour sent: the right link would idle while the next segments
 * sit here. A slot whose receive is not posted yet, or failed, stops its step (a failed
 * one is reported by its wait). Progress does not depend on it: the allgather stage of a
 * slot forwards it at the latest. */
static gcoll_status_t forward_ready(ring_t *R, int poll)
{
    if (!R->ag || R->P < 3)
        return GCOLL_OK;
    if (poll) {
        uint64_t t0 = gcoll_time_ns();
        gcoll_status_t st = gcoll_channel_progress(R->ctx->ch, 0);
        R->ctx->ch->counters.ns_wire += gcoll_time_ns() - t0;
        GCOLL_CHECK(st);
    }
    for (size_t t = 0; t + 1 < R->steps; t++) {
        const size_t n = nseg_of(&R->g, chunk_at(R, t, 1).len);
        for (size_t k = R->fk[t]; k < n; k = ++R->fk[t]) {
            const gcoll_treq_t *rq = &R->rreq[AG][slot(R, t, k)];
            if (!rq->done || rq->status < 0)
                break;
            GCOLL_CHECK(ring_send(R, AG, t + 1, k, rbuf(R, t, k), rq->nbytes));
        }
    }
    return GCOLL_OK;
}

/* Decodes the allgathered segment k of chunk ch into out. */
static gcoll_status_t decode_out(ring_t *R, const gcoll_compressor_t *c, gcoll_span_t ch, size_t k,
                                 const uint8_t *msg, size_t len, float *out, int from)
{
    gcoll_span_t sg = seg_of(&R->g, ch, k);
    uint64_t t0 = gcoll_time_ns();
    gcoll_status_t st = gcoll_codec_decode(c, msg, len, out + sg.off, sg.len, GCOLL_DECODE_SET);
    R->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (st != GCOLL_OK)
        gcoll_channel_set_error(R->ctx->ch,
                                "the compressed chunk at %zu forwarded by rank %d is "
                                "malformed",
                                ch.off, from);
    return st;
}

/* Stage P-1 of segment k of my chunk: the last partial sum plus my own gradient (and what
 * my residual holds for it, which the ring never compresses: zero unless the all-to-all
 * scheme ran before), into acc. Unless only the shard is wanted, the owner then compresses
 * it with the server residual (as the all-to-all scheme does), sends it round at once and
 * decodes it into out from the bytes every rank gets, not from acc, so that results are
 * bit-identical on every rank. */
static gcoll_status_t own_segment(ring_t *R, gcoll_tensor_state_t *s, const float *grad, float *out,
                                  gcoll_op_t op, float *acc, uint8_t *own, size_t *ownlen, size_t k)
{
    const gcoll_compressor_t *c = s->c;
    const gcoll_span_t mine = gcoll_even_chunk(R->count, R->P, R->r);
    gcoll_span_t sg = seg_of(&R->g, mine, k);
    float *a = acc + (sg.off - mine.off);
    GCOLL_CHECK(partial_sum(R, c, R->steps - 1, k, sg, grad, a));
    uint64_t t0 = gcoll_time_ns();
    if (s->e) {
        float *e = s->e + sg.off;
        for (size_t i = 0; i < sg.len; i++)
            a[i] += e[i];
        memset(e, 0, sg.len * sizeof(float));
    }
    if (op == GCOLL_AVG)
        for (size_t i = 0; i < sg.len; i++)
            a[i] /= (float)R->P;
    gcoll_status_t st = GCOLL_OK;
    uint8_t *msg = own + k * R->g.segcap;
    if (R->ag)
        st = gcoll_codec_encode_range(c, s->server, sg.off - mine.off, a, sg.len, s->step, NULL,
                                      msg, R->g.segcap, &ownlen[k]);
    R->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (st != GCOLL_OK || !R->ag)
        return st;
    if (R->P > 1)
        GCOLL_CHECK(ring_send(R, AG, 0, k, msg, ownlen[k]));
    return decode_out(R, c, mine, k, msg, ownlen[k], out, R->r);
}

/* Reduce-scatter step u of segment k of chunk r-u-1: its partial sum (the previous step's
 * message plus this rank's part; the input itself at step 0) compressed and sent right
 * (x: room for one segment); *skip_p when that chunk has no segment k. */
static gcoll_status_t rs_stage(ring_t *R, gcoll_tensor_state_t *s, const float *grad,
                               gcoll_nancheck_t check, float *x, size_t u, size_t k, int *skip_p)
{
    const gcoll_compressor_t *c = s->c;
    gcoll_span_t cs = chunk_at(R, u, 1);
    if (k >= nseg_of(&R->g, cs.len)) {
        *skip_p = 1;
        return GCOLL_OK;
    }
    gcoll_span_t sg = seg_of(&R->g, cs, k);
    const float *in = grad + sg.off;
    gcoll_encode_opts_t opt = {.check = check};
    if (u > 0) {
        /* the partial sum of this segment arrived at the previous step */
        GCOLL_CHECK(partial_sum(R, c, u - 1, k, sg, grad, x));
        in = x;
        opt.check = GCOLL_NANCHECK_SCAN; /* a sum may overflow: the encoder checks it */
    }
    uint64_t t0 = gcoll_time_ns();
    uint8_t *msg = R->sstore + slot(R, u, k) * R->g.segcap;
    size_t len = 0;
    gcoll_status_t st =
        gcoll_codec_encode_range(c, s, sg.off, in, sg.len, s->step, &opt, msg, R->g.segcap, &len);
    R->ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (st != GCOLL_OK) {
        gcoll_channel_set_error(R->ctx->ch,
                                "compressing the partial sum of elements "
                                "[%zu, %zu) failed (overflow to Inf?)",
                                sg.off, sg.off + sg.len);
        return st;
    }
    return ring_send(R, RS, u, k, msg, len);
}

/* Allgather step t of segment k of chunk r-t-1: once it arrived, forwarded and decoded
 * into out (nothing when that chunk has no segment k). */
static gcoll_status_t ag_stage(ring_t *R, const gcoll_compressor_t *c, float *out, size_t t,
                               size_t k)
{
    gcoll_span_t ch = chunk_at(R, t, 1);
    if (k >= nseg_of(&R->g, ch.len))
        return GCOLL_OK;
    const uint8_t *msg = NULL;
    size_t len = 0;
    GCOLL_CHECK(arrived(R, AG, t, k, &msg, &len));
    GCOLL_CHECK(forward_ready(R, 0)); /* this one at least */
    return decode_out(R, c, ch, k, msg, len, out, R->left);
}

gcoll_status_t gcoll_compressed_ring(const gcoll_coll_t *ctx, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     int shard_only, gcoll_nancheck_t check, uint32_t sig)
{
    const gcoll_compressor_t *c = s->c;
    ring_t R = {.ctx = ctx, .count = count, .P = ctx->size, .r = ctx->rank, .sig = sig};
    R.left = (R.r - 1 + R.P) % R.P;
    R.right = (R.r + 1) % R.P;
    R.steps = (size_t)(R.P - 1);
    R.g.segf = gcoll_cring_segment(ctx->cfg->ring_chunk, count, R.P);
    R.g.nseg = nseg_of(&R.g, gcoll_even_chunk(count, R.P, 0).len);
    R.g.segcap = gcoll_codec_bound(c, R.g.segf);
    if (R.g.segcap == 0) {
        gcoll_channel_set_error(ctx->ch,
                                "compressed ring: segments of %zu elements exceed the "
                                "codec's range",
                                R.g.segf);
        return GCOLL_ERR_INVALID;
    }
    const gcoll_span_t mine = gcoll_even_chunk(count, R.P, R.r);
    const size_t nmsg = R.steps * R.g.nseg, nmine = nseg_of(&R.g, mine.len);
    R.nmsg = nmsg;
    R.ag = !shard_only;
    /* the big buffers live in the owner's scratch: fresh ones would be faulted in
     * on every call. Floats first, for their alignment. */
    const size_t nacc = mine.len + 1, nx = R.g.segf + 1;
    const size_t bytes = (nacc + nx) * sizeof(float) + (2 * nmsg + nmine) * R.g.segcap;
    float *acc = gcoll_coll_scratch(ctx, bytes), *x = acc ? acc + nacc : NULL;
    R.rstore = x ? (uint8_t *)(x + nx) : NULL;
    R.sstore = R.rstore ? R.rstore + nmsg * R.g.segcap : NULL;
    uint8_t *own = R.sstore ? R.sstore + nmsg * R.g.segcap : NULL;
    gcoll_treq_t *reqs = calloc(4 * nmsg + 1, sizeof(gcoll_treq_t));
    size_t *ownlen = calloc(nmine + R.steps + 1, sizeof(size_t));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!acc || !reqs || !ownlen)
        goto out;
    R.fk = ownlen + nmine;
    for (int ph = 0; ph < 2; ph++) {
        R.rreq[ph] = reqs + (2 * ph) * nmsg;
        R.sreq[ph] = reqs + (2 * ph + 1) * nmsg;
    }

    /* ---- all stages of every segment, skewed (see the top of the file) ---- */
    GCOLL_CHECK_GOTO(post_recvs(&R), st, out);
    gcoll_state_set_salt(s, (uint64_t)R.r);
    if (R.ag) {
        GCOLL_CHECK_GOTO(gcoll_compressed_server_state(s, mine.len), st, out);
        gcoll_state_set_salt(s->server, (uint64_t)(R.P + R.r));
    }
    const size_t nst = R.ag ? 2 * R.steps + 1 : R.steps + 1;
    for (size_t i = 0; i < R.g.nseg + (nst - 1) * CRING_SKEW; i++) {
        for (size_t u = 0; u < nst && u * CRING_SKEW <= i; u++) {
            const size_t k = i - u * CRING_SKEW;
            if (u < R.steps) {
                int skip = 0;
                GCOLL_CHECK_GOTO(rs_stage(&R, s, grad, check, x, u, k, &skip), st, out);
                if (skip)
                    continue;
            } else if (u == R.steps) {
                if (k >= nmine)
                    continue;
                GCOLL_CHECK_GOTO(own_segment(&R, s, grad, out, op, acc, own, ownlen, k), st, out);
            } else {
                GCOLL_CHECK_GOTO(ag_stage(&R, c, out, u - R.steps - 1, k), st, out);
                continue;
            }
            GCOLL_CHECK_GOTO(forward_ready(&R, 1), st, out);
        }
    }
    if (R.ag)
        s->server->step++;
    else
        memcpy(out, acc, mine.len * sizeof(float));
    for (int ph = 0; ph < 2; ph++)
        GCOLL_CHECK_GOTO(gcoll_channel_waitall(ctx->ch, R.sreq[ph], (int)nmsg), st, out);
out:
    if (st != GCOLL_OK && reqs)
        for (int ph = 0; ph < 2; ph++) {
            gcoll_channel_cancel(ctx->ch, R.rreq[ph], (int)nmsg);
            gcoll_channel_cancel(ctx->ch, R.sreq[ph], (int)nmsg);
        }
    free(reqs);
    free(ownlen);
    return st;
}
