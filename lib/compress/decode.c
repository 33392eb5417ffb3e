/* decode.c: reading messages back: full validation of every bound, decoding into a dense
 * output (set, add, subtract), the pairs, and the merged sums of many messages. */
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/sparsify.h"
#include "compress/values.h"
#include "compress/wire.h"

/* --- decoding ------------------------------------------------------------------------ */

/* Full validation of the payload against the (already parsed) header. */
static gcoll_status_t check_payload_below(const gcoll_wire_hdr_t *h, const uint8_t *pl,
                                          uint64_t bound, size_t *isz_p)
{
    size_t isz = 0;
    uint64_t nvals = h->codec == GCOLL_WIRE_DENSE ? h->count : h->nnz;
    if (h->codec == GCOLL_WIRE_SPARSE && !(h->flags & GCOLL_WIRE_F_DENSE))
        GCOLL_CHECK(gcoll_idx_check(pl, (size_t)h->payload_len, h->flags, h->nnz, bound, &isz));
    size_t vsz = gcoll_vsec_size(&h->vs, nvals);
    if (vsz == SIZE_MAX || (uint64_t)vsz != h->payload_len - isz) {
        GCOLL_WARN("compress: malformed message: %llu value bytes for %llu values, "
                   "expected %zu",
                   (unsigned long long)(h->payload_len - isz), (unsigned long long)nvals, vsz);
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_vsec_check(&h->vs, pl + isz, nvals));
    *isz_p = isz;
    return GCOLL_OK;
}

static gcoll_status_t check_payload(const gcoll_wire_hdr_t *h, const uint8_t *pl, size_t *isz_p)
{
    return check_payload_below(h, pl, h->count, isz_p);
}

static gcoll_status_t match_codec(const gcoll_compressor_t *c, const gcoll_wire_hdr_t *h)
{
    if (!c)
        return GCOLL_OK;
    unsigned want = c->sparsify == GCOLL_SPARSIFY_NONE      ? GCOLL_WIRE_DENSE
                    : c->sparsify == GCOLL_SPARSIFY_RANDOMK ? GCOLL_WIRE_RANDOMK
                                                            : GCOLL_WIRE_SPARSE;
    if (h->codec != want || h->vs.fmt != c->vs.fmt || h->vs.bits != c->vs.bits ||
        h->vs.bucket != c->vs.bucket) {
        GCOLL_WARN("compress: message (codec %u, value format %d/%u/%u) was not made by "
                   "'%s'",
                   h->codec, (int)h->vs.fmt, h->vs.bits, h->vs.bucket, c->spec);
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_codec_parse(const gcoll_compressor_t *c, const void *in, size_t len,
                                 size_t count, gcoll_wire_hdr_t *h, size_t *isz_p)
{
    GCOLL_CHECK(gcoll_wire_parse_hdr(in, len, count, h));
    GCOLL_CHECK(match_codec(c, h));
    return check_payload(h, (const uint8_t *)in + GCOLL_WIRE_HDR, isz_p);
}

gcoll_status_t gcoll_codec_apply(const gcoll_wire_hdr_t *h, const uint8_t *pl, size_t isz,
                                 float *out, gcoll_dmode_t mode)
{
    size_t count = (size_t)h->count, nnz = (size_t)h->nnz;
    if (h->codec == GCOLL_WIRE_DENSE || (h->flags & GCOLL_WIRE_F_DENSE)) {
        gcoll_vsec_apply_range(&h->vs, pl, count, 0, count, out, mode);
        return GCOLL_OK;
    }
    if (mode == GCOLL_DECODE_SET)
        memset(out, 0, count * sizeof(float));
    float sign = mode == GCOLL_DECODE_SUB ? -1.0f : 1.0f;
    uint32_t ib[GCOLL_WIRE_IDX_BLOCK];
    float vb[GCOLL_WIRE_IDX_BLOCK];
    if (h->codec == GCOLL_WIRE_RANDOMK) {
        uint32_t *idx = malloc(nnz ? nnz * sizeof(uint32_t) : 1);
        if (!idx)
            return GCOLL_ERR_NOMEM;
        gcoll_status_t st = gcoll_randomk_indices(h->key, count, nnz, idx, NULL);
        for (size_t j = 0; st == GCOLL_OK && j < nnz; j += GCOLL_WIRE_IDX_BLOCK) {
            size_t m = GCOLL_MIN(nnz - j, (size_t)GCOLL_WIRE_IDX_BLOCK);
            gcoll_vsec_apply_range(&h->vs, pl, nnz, j, m, vb, GCOLL_DECODE_SET);
            for (size_t t = 0; t < m; t++)
                out[idx[j + t]] += sign * vb[t];
        }
        free(idx);
        return st;
    }
    gcoll_idx_iter_t it;
    gcoll_idx_iter_init(&it, pl, h->flags, nnz);
    size_t j = 0, m;
    while ((m = gcoll_idx_iter_next(&it, ib)) > 0) {
        gcoll_vsec_apply_range(&h->vs, pl + isz, nnz, j, m, vb, GCOLL_DECODE_SET);
        for (size_t t = 0; t < m; t++)
            out[ib[t]] += sign * vb[t];
        j += m;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_codec_decode(const gcoll_compressor_t *c, const void *in, size_t len,
                                  float *out, size_t count, gcoll_dmode_t mode)
{
    gcoll_wire_hdr_t h;
    size_t isz;
    if ((count > 0 && !out) || (unsigned)mode > GCOLL_DECODE_SUB) {
        GCOLL_WARN("compress: decode: NULL output or bad mode");
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_codec_parse(c, in, len, count, &h, &isz));
    return gcoll_codec_apply(&h, (const uint8_t *)in + GCOLL_WIRE_HDR, isz, out, mode);
}

/* One source's read position for the merged sums: a block of decoded pairs, from one
 * message (gcoll_codec_sum), from a chain of messages filtered by a trim rule (src), or
 * from plain arrays (pi/pv with pleft pairs left). */
typedef struct {
    gcoll_wire_hdr_t h;
    const uint8_t *vals; /* the value section */
    gcoll_idx_iter_t it;
    const gcoll_sum_src_t *src;
    const size_t *isz; /* src: index section bytes of each message */
    size_t msg;        /* src: the message being read */
    size_t ties;       /* src: pairs at the threshold still to keep */
    const uint32_t *pi;
    const float *pv;
    size_t pleft;
    size_t pos, len, done; /* next pair in ib/vb, pairs in them, values decoded before */
    uint32_t ib[GCOLL_WIRE_IDX_BLOCK];
    float vb[GCOLL_WIRE_IDX_BLOCK];
} sum_cursor_t;

static void cursor_open(sum_cursor_t *q, const uint8_t *msg, size_t isz)
{
    const uint8_t *pl = msg + GCOLL_WIRE_HDR;
    gcoll_wire_parse_hdr(msg, GCOLL_WIRE_HDR + (size_t)gcoll_get_u64(msg + 24), SIZE_MAX, &q->h);
    gcoll_idx_iter_init(&q->it, pl, q->h.flags, q->h.nnz);
    q->vals = pl + isz;
    q->done = 0;
}

/* Keeps the pairs of the block that pass src's rule, in order. */
static size_t cursor_filter(sum_cursor_t *q)
{
    const uint32_t thr = q->src->thr;
    size_t o = 0;
    for (size_t j = 0; j < q->len; j++) {
        uint32_t a;
        memcpy(&a, &q->vb[j], 4);
        a &= 0x7fffffffu;
        if (a > thr || (a == thr && q->ties > 0 && q->ties--)) {
            q->ib[o] = q->ib[j];
            q->vb[o++] = q->vb[j];
        }
    }
    return o;
}

static void cursor_fill(sum_cursor_t *q)
{
    q->pos = 0;
    if (q->pi) {
        q->len = GCOLL_MIN(q->pleft, (size_t)GCOLL_WIRE_IDX_BLOCK);
        memcpy(q->ib, q->pi, q->len * sizeof(uint32_t));
        memcpy(q->vb, q->pv, q->len * sizeof(float));
        q->pi += q->len;
        q->pv += q->len;
        q->pleft -= q->len;
        return;
    }
    for (;;) {
        q->len = gcoll_idx_iter_next(&q->it, q->ib);
        if (q->len) {
            gcoll_vsec_apply_range(&q->h.vs, q->vals, (size_t)q->h.nnz, q->done, q->len, q->vb,
                                   GCOLL_DECODE_SET);
            q->done += q->len;
            if (q->src && q->src->filter)
                q->len = cursor_filter(q);
            if (q->len)
                return;
        } else if (q->src && q->msg + 1 < q->src->nmsg) {
            q->msg++;
            cursor_open(q, q->src->msgs[q->msg], q->isz[q->msg]);
        } else {
            return; /* len 0: the source is exhausted */
        }
    }
}

/* Offsets in the output block that streamed sums remember, to clear only those after
 * the block went out (a power of two: the index wraps once there are more, and then the
 * whole block is cleared). */
#define SUM_TOUCH 512

/* Adds q's next pairs with index in [base, end) to blk[index - base] (indices ascend, so
 * none is below base), noting each offset in tl[nt++ % SUM_TOUCH]; returns nt. */
static inline size_t cursor_add_below(sum_cursor_t *q, float *blk, size_t base, size_t end,
                                      uint16_t *tl, size_t nt)
{
    while (q->len) {
        while (q->pos < q->len && q->ib[q->pos] < end) {
            size_t o = q->ib[q->pos] - base;
            blk[o] += q->vb[q->pos];
            tl[nt++ % SUM_TOUCH] = (uint16_t)o;
            q->pos++;
        }
        if (q->pos < q->len)
            return nt;
        cursor_fill(q);
    }
    return nt;
}

/* Output block of the merged decode: 8 KiB, so it stays in L1 while every message adds
 * its pairs to it. Outputs of SUM_STREAM elements or more are built block by block in a
 * buffer and streamed out with cache-bypassing stores: no read for ownership of output
 * lines that are written whole (26M floats, 4 messages, one core: 11 -> 8 ms); the buffer
 * is then cleared where pairs landed rather than whole (sparse blocks: a tenth of a 0.1%
 * top-k's sum was clearing it). */
#define SUM_BLOCK 2048
#define SUM_STREAM ((size_t)1 << 20)

/* Sorted pairs: one sequential pass over out, block by block, each block zeroed then
 * added to by every cursor in the given order (so every element sums its contributions
 * in the same order as memset + one ADD decode per message). */
static void sum_merged(sum_cursor_t *q, int m, float *out, size_t count, float div)
{
    for (int i = 0; i < m; i++)
        cursor_fill(&q[i]);
    float blk[SUM_BLOCK], quo[SUM_BLOCK]; /* quo: a sparse block's quotients (avg) */
    uint16_t tl[SUM_TOUCH];
    const int stream = count >= SUM_STREAM;
    if (stream) {
        memset(blk, 0, sizeof(blk));
        memset(quo, 0, sizeof(quo));
    }
    for (size_t b = 0; b < count; b += SUM_BLOCK) {
        size_t end = GCOLL_MIN(b + SUM_BLOCK, count), nt = 0;
        float *o = stream ? blk : out + b; /* this block */
        if (!stream)
            memset(o, 0, (end - b) * sizeof(float));
        for (int i = 0; i < m; i++)
            nt = cursor_add_below(&q[i], o, b, end, tl, nt);
        if (!stream || nt > SUM_TOUCH) { /* a block in place, or a dense one */
            if (div != 1.0f)
                for (size_t k = 0; k < end - b; k++)
                    o[k] /= div;
        }
        if (!stream)
            continue;
        if (nt > SUM_TOUCH) {
            gcoll_kernels()->stream_copy(out + b, blk, end - b);
            memset(blk, 0, sizeof(blk));
        } else if (div != 1.0f) {
            /* a sparse block averaged: divide only where pairs landed (the rest is +0, and
             * 0 / div is +0), into quo, so that an offset noted twice is divided once: the
             * same quotients as dividing the whole block (a full pass was a third of the
             * merged sum of a 1% top-k) */
            for (size_t t = 0; t < nt; t++)
                quo[tl[t]] = blk[tl[t]] / div;
            gcoll_kernels()->stream_copy(out + b, quo, end - b);
            for (size_t t = 0; t < nt; t++)
                blk[tl[t]] = quo[tl[t]] = 0.0f;
        } else {
            gcoll_kernels()->stream_copy(out + b, blk, end - b);
            for (size_t t = 0; t < nt; t++)
                blk[tl[t]] = 0.0f;
        }
    }
}

gcoll_status_t gcoll_codec_sum(const gcoll_compressor_t *c, const uint8_t *const *msgs,
                               const size_t *lens, int m, float *out, size_t count, float div,
                               int *bad_p)
{
    if (m < 0 || (count > 0 && !out) || (m > 0 && (!msgs || !lens))) {
        GCOLL_WARN("compress: sum: bad arguments");
        return GCOLL_ERR_INVALID;
    }
    sum_cursor_t *q = calloc((size_t)m + 1, sizeof(*q));
    if (!q)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int merge = 1;
    for (int i = 0; i < m; i++) {
        size_t isz;
        st = gcoll_codec_parse(c, msgs[i], lens[i], count, &q[i].h, &isz);
        if (st != GCOLL_OK) {
            if (bad_p)
                *bad_p = i;
            goto out;
        }
        const gcoll_wire_hdr_t *h = &q[i].h;
        merge &= h->codec == GCOLL_WIRE_SPARSE && !(h->flags & GCOLL_WIRE_F_DENSE) &&
                 (h->flags & (GCOLL_WIRE_F_DELTA | GCOLL_WIRE_F_SORTED)) != 0;
        cursor_open(&q[i], msgs[i], isz);
    }
    if (!merge) { /* dense, random-k or unsorted messages: the plain way */
        memset(out, 0, count * sizeof(float));
        for (int i = 0; i < m && st == GCOLL_OK; i++) {
            const uint8_t *pl = msgs[i] + GCOLL_WIRE_HDR;
            st = gcoll_codec_apply(&q[i].h, pl, (size_t)(q[i].vals - pl), out, GCOLL_DECODE_ADD);
        }
        if (div != 1.0f)
            for (size_t k = 0; k < count; k++)
                out[k] /= div;
        goto out;
    }
    sum_merged(q, m, out, count, div);
out:
    free(q);
    return st;
}

/* Validates source i's messages: sorted sparse messages of c, message j's indices in
 * [j * seg, (j + 1) * seg) when seg is set; the filter's counts against want. */
static gcoll_status_t check_source(const gcoll_compressor_t *c, const gcoll_sum_src_t *src,
                                   size_t count, size_t *isz)
{
    size_t kept = 0, at_thr = 0, total = 0;
    for (size_t j = 0; j < src->nmsg; j++) {
        const uint8_t *msg = src->msgs[j], *pl = msg + GCOLL_WIRE_HDR;
        uint64_t lo = src->seg ? (uint64_t)j * src->seg : 0;
        uint64_t hi = src->seg ? GCOLL_MIN(lo + src->seg, (uint64_t)count) : count;
        gcoll_wire_hdr_t h;
        GCOLL_CHECK(gcoll_wire_parse_hdr(msg, src->lens[j], count, &h));
        GCOLL_CHECK(match_codec(c, &h));
        if (h.codec != GCOLL_WIRE_SPARSE || (h.flags & GCOLL_WIRE_F_DENSE) ||
            !(h.flags & (GCOLL_WIRE_F_DELTA | GCOLL_WIRE_F_SORTED)) || h.vs.fmt != GCOLL_VF_F32) {
            GCOLL_WARN("compress: sum: message %zu of a source is not a sorted f32 sparse "
                       "message",
                       j);
            return GCOLL_ERR_INVALID;
        }
        GCOLL_CHECK(check_payload_below(&h, pl, hi, &isz[j]));
        if (h.nnz) {
            gcoll_idx_iter_t it;
            uint32_t first[GCOLL_WIRE_IDX_BLOCK];
            gcoll_idx_iter_init(&it, pl, h.flags, h.nnz);
            gcoll_idx_iter_next(&it, first);
            if (first[0] < lo) {
                GCOLL_WARN("compress: sum: message %zu starts at index %u, below %llu", j, first[0],
                           (unsigned long long)lo);
                return GCOLL_ERR_INVALID;
            }
        }
        total += (size_t)h.nnz;
        const uint8_t *v = pl + isz[j];
        for (uint64_t q = 0; src->filter && q < h.nnz; q++) {
            uint32_t a = gcoll_get_u32(v + 4 * q) & 0x7fffffffu;
            kept += a > src->thr;
            at_thr += a == src->thr;
        }
        if (!src->filter)
            kept += (size_t)h.nnz;
    }
    if (src->filter && total != src->cand) {
        GCOLL_WARN("compress: sum: a source's messages hold %zu pairs, %zu announced", total,
                   src->cand);
        return GCOLL_ERR_INVALID;
    }
    if (src->filter)
        kept += GCOLL_MIN(at_thr, src->ties);
    if (kept != src->want) {
        GCOLL_WARN("compress: sum: a source yields %zu pairs, %zu announced", kept, src->want);
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_sum_sources(const gcoll_compressor_t *c, const gcoll_sum_src_t *src, int m,
                                 float *out, size_t count, float div, int *bad_p)
{
    size_t nisz = 0;
    for (int i = 0; i < m; i++)
        nisz += src[i].msgs ? src[i].nmsg : 0;
    sum_cursor_t *q = calloc((size_t)(m > 0 ? m : 0) + 1, sizeof(*q));
    size_t *isz = calloc(nisz + 1, sizeof(size_t));
    gcoll_status_t st = q && isz ? GCOLL_OK : GCOLL_ERR_NOMEM;
    nisz = 0;
    for (int i = 0; i < m && st == GCOLL_OK; i++) {
        static const uint32_t none; /* a non-NULL pi marks plain arrays, even empty ones */
        if (!src[i].msgs) {
            q[i].pi = src[i].n ? src[i].idx : &none;
            q[i].pv = src[i].val;
            q[i].pleft = src[i].n;
            continue;
        }
        size_t *mine = isz + nisz;
        nisz += src[i].nmsg;
        q[i].src = &src[i];
        q[i].isz = mine;
        q[i].ties = src[i].ties;
        st = check_source(c, &src[i], count, mine);
        if (st != GCOLL_OK) {
            if (bad_p)
                *bad_p = i;
            break; /* its messages are not to be read */
        }
        if (src[i].nmsg)
            cursor_open(&q[i], src[i].msgs[0], mine[0]);
        else
            q[i].pi = &none; /* nothing to read */
    }
    if (st == GCOLL_OK)
        sum_merged(q, m, out, count, div);
    free(isz);
    free(q);
    return st;
}

gcoll_status_t gcoll_codec_decode_pairs(const gcoll_compressor_t *c, const void *in, size_t len,
                                        size_t count, uint32_t *idx, float *val, size_t cap,
                                        size_t *nnz_p)
{
    gcoll_wire_hdr_t h;
    size_t isz;
    if (!nnz_p) {
        GCOLL_WARN("compress: decode_pairs: NULL nnz pointer");
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_codec_parse(c, in, len, count, &h, &isz));
    size_t nnz = (size_t)h.nnz;
    if (nnz > cap || (nnz && (!idx || !val))) {
        GCOLL_WARN("compress: decode_pairs: message holds %zu pairs, room for %zu", nnz, cap);
        return GCOLL_ERR_INVALID;
    }
    const uint8_t *pl = (const uint8_t *)in + GCOLL_WIRE_HDR;
    if (h.codec == GCOLL_WIRE_DENSE || (h.flags & GCOLL_WIRE_F_DENSE)) {
        for (size_t i = 0; i < nnz; i++)
            idx[i] = (uint32_t)i;
    } else if (h.codec == GCOLL_WIRE_RANDOMK) {
        GCOLL_CHECK(gcoll_randomk_indices(h.key, count, nnz, idx, NULL));
    } else {
        gcoll_idx_read(pl, h.flags, nnz, idx);
        pl += isz;
    }
    gcoll_vsec_apply_range(&h.vs, pl, nnz, 0, nnz, val, GCOLL_DECODE_SET);
    *nnz_p = nnz;
    return GCOLL_OK;
}
