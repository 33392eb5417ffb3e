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

/* Marks requests[0..n) complete, so that slots no message uses count as done. */
static void reqs_idle(gcoll_treq_t *req, size_t n)
{
    for (size_t i = 0; i < n; i++)
        req[i] = (gcoll_treq_t){.done = 1, .status = GCOLL_OK};
}

/* Waits for one request. */
static gcoll_status_t wait1(gcoll_comm_t *comm, gcoll_treq_t *r)
{
    return gcoll_net_waitall(comm, r, 1);
}

gcoll_status_t gcoll_compressed_ring(gcoll_comm_t *comm, gcoll_tensor_state_t *s,
                                     const float *grad, float *out, size_t count, gcoll_op_t op,
                                     int shard_only, uint32_t sig)
{
    const int P = comm->size, r = comm->rank, left = (r - 1 + P) % P, right = (r + 1) % P;
    const gcoll_compressor_t *c = s->c;
    const gcoll_span_t mine = gcoll_even_chunk(count, P, r);
    size_t maxlen = gcoll_even_chunk(count, P, 0).len;
    ring_geom_t g;
    g.segf = gcoll_cring_segment(comm->cfg.ring_chunk, count, P);
    const size_t steps = (size_t)(P - 1);
    g.nseg = nseg_of(&g, maxlen);
    g.segcap = gcoll_codec_bound(c, g.segf);
    if (g.segcap == 0) {
        gcoll_comm_set_error(comm, "compressed ring: segments of %zu elements exceed the "
                             "codec's range", g.segf);
        return GCOLL_ERR_INVALID;
    }
    const size_t nmsg = steps * g.nseg; /* messages per phase, received or sent */
    gcoll_treq_t *rreq = calloc(2 * nmsg + 1, sizeof(*rreq)), *sreq = rreq ? rreq + nmsg : NULL;
    uint8_t *rstore = malloc(nmsg * g.segcap + 1), *sstore = malloc(nmsg * g.segcap + 1);
    uint8_t *own = malloc(nseg_of(&g, mine.len) * g.segcap + 1);
    size_t *ownlen = calloc(nseg_of(&g, mine.len) + 1, sizeof(size_t));
    float *x = malloc((g.segf + 1) * sizeof(float)), *acc = malloc((mine.len + 1) * sizeof(float));
    int nr = 0, ns = 0;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    const int checked = s->input_checked;
    if (!rreq || !rstore || !sstore || !own || !ownlen || !x || !acc)
        goto out;
#define RBUF(t, k) (rstore + ((size_t)(t) * g.nseg + (k)) * g.segcap)
#define SBUF(t, k) (sstore + ((size_t)(t) * g.nseg + (k)) * g.segcap)
#define REQ(t, k) ((size_t)(t) * g.nseg + (k))
    reqs_idle(rreq, 2 * nmsg);

    /* ---- reduce-scatter with re-quantization at every hop ---- */
    for (size_t t = 0; t < steps; t++) {
        gcoll_span_t cr = gcoll_even_chunk(count, P, (int)(((long)r - (long)t - 2 + 2L * P) % P));
        for (size_t k = 0; k < nseg_of(&g, cr.len); k++) {
            GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &rreq[REQ(t, k)], left,
                                             PHASE(6) | (uint32_t)REQ(t, k), sig, RBUF(t, k),
                                             g.segcap, GCOLL_TREQ_ANYLEN), st, out);
            nr = (int)REQ(t, k) + 1;
        }
        nr = (int)REQ(t + 1, 0);
    }
    gcoll_state_set_salt(s, (uint64_t)r);
    for (size_t t = 0; t < steps; t++) {
        gcoll_span_t cs = gcoll_even_chunk(count, P, (int)(((long)r - (long)t - 1 + 2L * P) % P));
        for (size_t k = 0; k < nseg_of(&g, cs.len); k++) {
            gcoll_span_t sg = seg_of(&g, cs, k);
            const float *in = grad + sg.off;
            if (t > 0) {
                /* the partial sum of this segment arrived at the previous step */
                gcoll_treq_t *rq = &rreq[REQ(t - 1, k)];
                GCOLL_CHECK_GOTO(wait1(comm, rq), st, out);
                uint64_t t0 = gcoll_time_ns();
                st = gcoll_codec_decode(c, RBUF(t - 1, k), rq->nbytes, x, sg.len,
                                        GCOLL_DECODE_SET);
                if (st != GCOLL_OK) {
                    gcoll_comm_set_error(comm, "the compressed partial sum from rank %d is "
                                         "malformed", left);
                    goto out;
                }
                for (size_t i = 0; i < sg.len; i++)
                    x[i] += grad[sg.off + i];
                comm->counters.ns_compress += gcoll_time_ns() - t0;
                in = x;
                s->input_checked = 0; /* a sum may overflow: the encoder checks it */
            }
            uint64_t t0 = gcoll_time_ns();
            size_t len = 0;
            st = gcoll_codec_encode_range(c, s, sg.off, in, sg.len, s->step, SBUF(t, k),
                                          g.segcap, &len);
            s->input_checked = checked;
            comm->counters.ns_compress += gcoll_time_ns() - t0;
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "compressing the partial sum of elements [%zu, %zu) "
                                     "failed (overflow to Inf?)", sg.off, sg.off + sg.len);
                goto out;
            }
            GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &sreq[REQ(t, k)], right,
                                             PHASE(6) | (uint32_t)REQ(t, k), sig, SBUF(t, k), len),
                             st, out);
            ns = (int)REQ(t, k) + 1;
        }
        ns = (int)REQ(t + 1, 0);
    }
    /* my chunk: the last partial sum plus my own gradient (and what my residual holds for
     * it, which the ring never compresses: zero unless the all-to-all scheme ran before) */
    for (size_t k = 0; k < nseg_of(&g, mine.len); k++) {
        gcoll_span_t sg = seg_of(&g, mine, k);
        float *a = acc + (sg.off - mine.off);
        if (P > 1) {
            gcoll_treq_t *rq = &rreq[REQ(steps - 1, k)];
            GCOLL_CHECK_GOTO(wait1(comm, rq), st, out);
        }
        uint64_t t0 = gcoll_time_ns();
        if (P > 1) {
            gcoll_treq_t *rq = &rreq[REQ(steps - 1, k)];
            st = gcoll_codec_decode(c, RBUF(steps - 1, k), rq->nbytes, a, sg.len,
                                    GCOLL_DECODE_SET);
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "the compressed partial sum from rank %d is malformed",
                                     left);
                goto out;
            }
        } else {
            memset(a, 0, sg.len * sizeof(float));
        }
        for (size_t i = 0; i < sg.len; i++)
            a[i] += grad[sg.off + i];
        if (s->e) {
            float *e = s->e + sg.off;
            for (size_t i = 0; i < sg.len; i++)
                a[i] += e[i];
            memset(e, 0, sg.len * sizeof(float));
        }
        comm->counters.ns_compress += gcoll_time_ns() - t0;
    }
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, sreq, ns), st, out);
    if (op == GCOLL_AVG)
        for (size_t i = 0; i < mine.len; i++)
            acc[i] /= (float)P;
    if (shard_only) {
        memcpy(out, acc, mine.len * sizeof(float));
        goto out;
    }

    /* ---- the owner re-compresses its chunk; an allgather forwards the bytes ---- */
    uint64_t t0 = gcoll_time_ns();
    GCOLL_CHECK_GOTO(gcoll_compressed_server_state(s, mine.len), st, out);
    gcoll_state_set_salt(s->server, (uint64_t)(P + r));
    for (size_t k = 0; k < nseg_of(&g, mine.len); k++) {
        gcoll_span_t sg = seg_of(&g, (gcoll_span_t){0, mine.len}, k);
        GCOLL_CHECK_GOTO(gcoll_codec_encode_range(c, s->server, sg.off, acc + sg.off, sg.len,
                                                  s->step, own + k * g.segcap, g.segcap,
                                                  &ownlen[k]), st, out);
    }
    s->server->step++;
    comm->counters.ns_compress += gcoll_time_ns() - t0;
    nr = ns = 0;
    reqs_idle(rreq, 2 * nmsg);
    for (size_t t = 0; t < steps; t++) {
        gcoll_span_t cr = gcoll_even_chunk(count, P, (int)(((long)r - (long)t - 1 + 2L * P) % P));
        for (size_t k = 0; k < nseg_of(&g, cr.len); k++) {
            GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &rreq[REQ(t, k)], left,
                                             PHASE(7) | (uint32_t)REQ(t, k), sig, RBUF(t, k),
                                             g.segcap, GCOLL_TREQ_ANYLEN), st, out);
            nr = (int)REQ(t, k) + 1;
        }
        nr = (int)REQ(t + 1, 0);
    }
    for (size_t t = 0; t < steps; t++) {
        /* forward chunk r-t: mine at step 0, else what arrived at step t-1 */
        gcoll_span_t cs = gcoll_even_chunk(count, P, (int)(((long)r - (long)t + 2L * P) % P));
        for (size_t k = 0; k < nseg_of(&g, cs.len); k++) {
            const uint8_t *msg = own + k * g.segcap;
            size_t len = ownlen[k];
            if (t > 0) {
                gcoll_treq_t *rq = &rreq[REQ(t - 1, k)];
                GCOLL_CHECK_GOTO(wait1(comm, rq), st, out);
                msg = RBUF(t - 1, k);
                len = rq->nbytes;
            }
            GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &sreq[REQ(t, k)], right,
                                             PHASE(7) | (uint32_t)REQ(t, k), sig, msg, len),
                             st, out);
            ns = (int)REQ(t, k) + 1;
        }
        ns = (int)REQ(t + 1, 0);
    }
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, rreq, nr), st, out);
    /* decode every chunk, mine included, from the bytes everyone holds */
    t0 = gcoll_time_ns();
    for (size_t t = 0; t <= steps; t++) {
        int j = (int)(((long)r - (long)t + 2L * P) % P);
        gcoll_span_t ch = gcoll_even_chunk(count, P, j);
        for (size_t k = 0; k < nseg_of(&g, ch.len); k++) {
            gcoll_span_t sg = seg_of(&g, ch, k);
            const uint8_t *msg = t == 0 ? own + k * g.segcap : RBUF(t - 1, k);
            size_t len = t == 0 ? ownlen[k] : rreq[REQ(t - 1, k)].nbytes;
            st = gcoll_codec_decode(c, msg, len, out + sg.off, sg.len, GCOLL_DECODE_SET);
            if (st != GCOLL_OK) {
                gcoll_comm_set_error(comm, "the compressed chunk %d forwarded by rank %d is "
                                     "malformed", j, left);
                goto out;
            }
        }
    }
    comm->counters.ns_compress += gcoll_time_ns() - t0;
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, sreq, ns), st, out);
#undef RBUF
#undef SBUF
#undef REQ
out:
    s->input_checked = checked;
    if (st != GCOLL_OK && rreq) {
        gcoll_net_cancel(comm, rreq, nr);
        gcoll_net_cancel(comm, sreq, ns);
    }
    free(rreq);
    free(rstore);
    free(sstore);
    free(own);
    free(ownlen);
    free(x);
    free(acc);
    return st;
}
