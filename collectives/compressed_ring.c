/* compressed_ring.c: compressed allreduce of quantizers as a pipelined ring that
 * re-quantizes the partial sum at every hop (GCOLL_COMPRESSED_ALGO=ring).
 *
 * Reduce-scatter: at step t rank r sends chunk r-t-1 and receives chunk r-t-2 from its
 * left neighbour; it decodes what arrived, adds its own gradient, and compresses that
 * partial sum again (with error feedback into its own residual for that slice) before
 * passing it on, so after P-1 steps it holds the whole sum of chunk r. Each chunk travels
 * in segments of GCOLL_RING_CHUNK uncompressed bytes: a rank compresses segment s while
 * segments s+1.. of the same step are still on the wire, so compression and transfer
 * overlap (the all-to-all scheme compresses everything first, then sends). The owner then
 * compresses its reduced chunk with the server residual (as the all-to-all scheme does)
 * and an allgather forwards those bytes unchanged around the ring: every rank decodes the
 * same bytes, so results are bit-identical on every rank.
 *
 * The price is P-1 quantizations of each partial sum instead of one; error feedback puts
 * each hop's error back into the next step (Seide et al. 2014's argument per hop). The
 * wire bytes are those of the all-to-all scheme, 2 (P-1)/P of one compressed tensor, plus
 * a message header per segment (48 bytes of codec header and a transport frame): small
 * segments cost bytes, hence the floor of GCOLL_CRING_MIN_SEG elements. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "compress/compress.h"
#include "compressed.h"
#include "util.h"

#define PHASE(n) ((uint32_t)(n) << 24)
#define SUB_MAX ((uint32_t)1 << 24)

typedef struct {
    size_t segf;  /* floats per segment */
    size_t nseg;  /* most segments of one chunk */
    size_t segcap; /* bound of one segment's message */
} ring_geom_t;

static size_t nseg_of(const ring_geom_t *g, size_t len) { return GCOLL_DIV_UP(len, g->segf); }

static gcoll_span_t seg_of(const ring_geom_t *g, gcoll_span_t ch, size_t s)
{
    size_t off = s * g->segf;
    return (gcoll_span_t){ch.off + off, GCOLL_MIN(g->segf, ch.len - off)};
}

size_t gcoll_cring_segment(size_t ring_chunk, size_t count, int P)
{
    size_t segf = GCOLL_MAX(ring_chunk / sizeof(float), (size_t)GCOLL_CRING_MIN_SEG);
    size_t maxlen = gcoll_even_chunk(count, P, 0).len, steps = (size_t)(P > 1 ? P - 1 : 1);
    segf = GCOLL_MIN(segf, GCOLL_MAX(maxlen, (size_t)1));
    while (steps * GCOLL_DIV_UP(maxlen, segf) >= SUB_MAX)
        segf *= 2;
    return segf;
}

/* One call's ring: geometry, neighbours and the message slots of a phase. Slot (t, k) is
 * segment k of the chunk a step t moves; every slot has a request and a buffer of segcap
 * bytes, received into (rreq, rbuf) or sent from (sreq, sbuf). */
typedef struct {
    gcoll_comm_t *comm;
    ring_geom_t g;
    size_t count, steps;
    int P, r, left, right;
    uint32_t sig;
    gcoll_treq_t *rreq, *sreq;
    uint8_t *rstore, *sstore;
    int nr, ns; /* requests [0, nr) / [0, ns) may be posted */
} ring_t;

static size_t slot(const ring_t *R, size_t t, size_t k) { return t * R->g.nseg + k; }
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

/* Marks every slot's requests complete (slots no message uses count as done), then posts
 * the receive of every segment of every step of a phase: step t receives chunk r-t-back. */
static gcoll_status_t post_recvs(ring_t *R, uint32_t phase, int back)
{
    for (size_t i = 0; i < 2 * R->steps * R->g.nseg; i++)
        R->rreq[i] = (gcoll_treq_t){.done = 1, .status = GCOLL_OK};
    R->nr = R->ns = 0;
    for (size_t t = 0; t < R->steps; t++)
        for (size_t k = 0; k < nseg_of(&R->g, chunk_at(R, t, back).len); k++) {
            GCOLL_CHECK(gcoll_net_irecv(R->comm, &R->rreq[slot(R, t, k)], R->left,
                                        phase | (uint32_t)slot(R, t, k), R->sig, rbuf(R, t, k),
                                        R->g.segcap, GCOLL_TREQ_ANYLEN));
            R->nr = (int)slot(R, t, k) + 1;
        }
    R->nr = (int)(R->steps * R->g.nseg);
    return GCOLL_OK;
}

static gcoll_status_t ring_send(ring_t *R, uint32_t phase, size_t t, size_t k,
                                const void *msg, size_t len)
{
    GCOLL_CHECK(gcoll_net_isend(R->comm, &R->sreq[slot(R, t, k)], R->right,
                                phase | (uint32_t)slot(R, t, k), R->sig, msg, len));
    R->ns = (int)slot(R, t, k) + 1;
    return GCOLL_OK;
}

/* Waits for slot (t, k) of the current phase; *msg_p / *len_p: what arrived. */
static gcoll_status_t arrived(ring_t *R, size_t t, size_t k, const uint8_t **msg_p,
                              size_t *len_p)
{
    gcoll_treq_t *rq = &R->rreq[slot(R, t, k)];
    GCOLL_CHECK(gcoll_net_waitall(R->comm, rq, 1));
    *msg_p = rbuf(R, t, k);
    *len_p = rq->nbytes;
    return GCOLL_OK;
}

/* dst = the partial sum of segment sg that arrived in slot (t, k) (zero when P == 1),
 * plus this rank's gradient. */
static gcoll_status_t partial_sum(ring_t *R, const gcoll_compressor_t *c, size_t t, size_t k,
                                  gcoll_span_t sg, const float *grad, float *dst)
{
    const uint8_t *msg = NULL;
    size_t len = 0;
    if (R->P > 1)
        GCOLL_CHECK(arrived(R, t, k, &msg, &len));
    uint64_t t0 = gcoll_time_ns();
    if (R->P == 1) {
        memset(dst, 0, sg.len * sizeof(float));
    } else if (gcoll_codec_decode(c, msg, len, dst, sg.len, GCOLL_DECODE_SET) != GCOLL_OK) {
        gcoll_comm_set_error(R->comm, "the compressed partial sum from rank %d is malformed",
                             R->left);
        return GCOLL_ERR_INVALID;
    }
    for (size_t i = 0; i < sg.len; i++)
        dst[i] += grad[sg.off + i];
    R->comm->counters.ns_compress += gcoll_time_ns() - t0;
    return GCOLL_OK;
}

gcoll_status_t gcoll_compressed_ring(gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     int shard_only, uint32_t sig)
{
    const gcoll_compressor_t *c = s->c;
    ring_t R = {.comm = comm, .count = count, .P = comm->size, .r = comm->rank, .sig = sig};
    R.left = (R.r - 1 + R.P) % R.P;
    R.right = (R.r + 1) % R.P;
    R.steps = (size_t)(R.P - 1);
    R.g.segf = gcoll_cring_segment(comm->cfg.ring_chunk, count, R.P);
    R.g.nseg = nseg_of(&R.g, gcoll_even_chunk(count, R.P, 0).len);
    R.g.segcap = gcoll_codec_bound(c, R.g.segf);
    if (R.g.segcap == 0) {
        gcoll_comm_set_error(comm, "compressed ring: segments of %zu elements exceed the "
                             "codec's range", R.g.segf);
        return GCOLL_ERR_INVALID;
    }
    const gcoll_span_t mine = gcoll_even_chunk(count, R.P, R.r);
    const size_t nmsg = R.steps * R.g.nseg, nmine = nseg_of(&R.g, mine.len);
    R.rreq = calloc(2 * nmsg + 1, sizeof(gcoll_treq_t));
    R.sreq = R.rreq ? R.rreq + nmsg : NULL;
    R.rstore = malloc(nmsg * R.g.segcap + 1);
    R.sstore = malloc(nmsg * R.g.segcap + 1);
    uint8_t *own = malloc(nmine * R.g.segcap + 1);
    size_t *ownlen = calloc(nmine + 1, sizeof(size_t));
    float *x = malloc((R.g.segf + 1) * sizeof(float)), *acc = malloc((mine.len + 1) * sizeof(float));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    const int checked = s->input_checked;
    if (!R.rreq || !R.rstore || !R.sstore || !own || !ownlen || !x || !acc)
        goto out;

    /* ---- reduce-scatter with re-quantization at every hop ---- */
    GCOLL_CHECK_GOTO(post_recvs(&R, PHASE(6), 2), st, out);
    gcoll_state_set_salt(s, (uint64_t)R.r);
    for (size_t t = 0; t < R.steps; t++) {
        gcoll_span_t cs = chunk_at(&R, t, 1);
        for (size_t k = 0; k < nseg_of(&R.g, cs.len); k++) {
            gcoll_span_t sg = seg_of(&R.g, cs, k);
            const float *in = grad + sg.off;
            if (t > 0) {
                /* the partial sum of this segment arrived at the previous step */
                GCOLL_CHECK_GOTO(partial_sum(&R, c, t - 1, k, sg, grad, x), st, out);
                in = x;
                s->input_checked = 0; /* a sum may overflow: the encoder checks it */
            }
            uint64_t t0 = gcoll_time_ns();
            uint8_t *msg = R.sstore + slot(&R, t, k) * R.g.segcap;
            size_t len = 0;
            st = gcoll_codec_encode_range(c, s, sg.off, in, sg.len, s->step, msg, R.g.segcap,
                                          &len);
            s->input_checked = checked;
            comm->counters.ns_compress += gcoll_time_ns() - t0;
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "compressing the partial sum of elements [%zu, %zu) "
                                     "failed (overflow to Inf?)", sg.off, sg.off + sg.len);
                goto out;
            }
            GCOLL_CHECK_GOTO(ring_send(&R, PHASE(6), t, k, msg, len), st, out);
        }
    }
    /* my chunk: the last partial sum plus my own gradient (and what my residual holds for
     * it, which the ring never compresses: zero unless the all-to-all scheme ran before) */
    for (size_t k = 0; k < nmine; k++) {
        gcoll_span_t sg = seg_of(&R.g, mine, k);
        float *a = acc + (sg.off - mine.off);
        GCOLL_CHECK_GOTO(partial_sum(&R, c, R.steps - 1, k, sg, grad, a), st, out);
        if (s->e) {
            float *e = s->e + sg.off;
            for (size_t i = 0; i < sg.len; i++)
                a[i] += e[i];
            memset(e, 0, sg.len * sizeof(float));
        }
    }
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, R.sreq, R.ns), st, out);
    if (op == GCOLL_AVG)
        for (size_t i = 0; i < mine.len; i++)
            acc[i] /= (float)R.P;
    if (shard_only) {
        memcpy(out, acc, mine.len * sizeof(float));
        goto out;
    }

    /* ---- the owner re-compresses its chunk; an allgather forwards the bytes ---- */
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK_GOTO(gcoll_compressed_server_state(s, mine.len), st, out);
    gcoll_state_set_salt(s->server, (uint64_t)(R.P + R.r));
    for (size_t k = 0; k < nmine; k++) {
        gcoll_span_t sg = seg_of(&R.g, (gcoll_span_t){0, mine.len}, k);
        GCOLL_CHECK_GOTO(gcoll_codec_encode_range(c, s->server, sg.off, acc + sg.off, sg.len,
                                                  s->step, own + k * R.g.segcap, R.g.segcap,
                                                  &ownlen[k]), st, out);
    }
    s->server->step++;
    comm->counters.ns_compress += gcoll_time_ns() - t0;
    GCOLL_CHECK_GOTO(post_recvs(&R, PHASE(7), 1), st, out);
    for (size_t t = 0; t < R.steps; t++) {
        /* forward chunk r-t: mine at step 0, else what arrived at step t-1 */
        for (size_t k = 0; k < nseg_of(&R.g, chunk_at(&R, t, 0).len); k++) {
            const uint8_t *msg = own + k * R.g.segcap;
            size_t len = ownlen[k];
            if (t > 0)
                GCOLL_CHECK_GOTO(arrived(&R, t - 1, k, &msg, &len), st, out);
            GCOLL_CHECK_GOTO(ring_send(&R, PHASE(7), t, k, msg, len), st, out);
        }
    }
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, R.rreq, R.nr), st, out);
    /* decode every chunk, mine included, from the bytes everyone holds */
    t0 = gcoll_time_ns();
    for (size_t t = 0; t <= R.steps; t++) {
        gcoll_span_t ch = chunk_at(&R, t, 0);
        for (size_t k = 0; k < nseg_of(&R.g, ch.len); k++) {
            gcoll_span_t sg = seg_of(&R.g, ch, k);
            const uint8_t *msg = t == 0 ? own + k * R.g.segcap : rbuf(&R, t - 1, k);
            size_t len = t == 0 ? ownlen[k] : R.rreq[slot(&R, t - 1, k)].nbytes;
            st = gcoll_codec_decode(c, msg, len, out + sg.off, sg.len, GCOLL_DECODE_SET);
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "the compressed chunk at %zu forwarded by rank %d is "
                                     "malformed", ch.off, R.left);
                goto out;
            }
        }
    }
    comm->counters.ns_compress += gcoll_time_ns() - t0;
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, R.sreq, R.ns), st, out);
out:
    s->input_checked = checked;
    if (st != GCOLL_OK && R.rreq) {
        gcoll_net_cancel(comm, R.rreq, R.nr);
        gcoll_net_cancel(comm, R.sreq, R.ns);
    }
    free(R.rreq);
    free(R.rstore);
    free(R.sstore);
    free(own);
    free(ownlen);
    free(x);
    free(acc);
    return st;
}
