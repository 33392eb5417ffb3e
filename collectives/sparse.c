/* sparse.c: sparse allreduce of (index, value) pairs into a dense result. Three plans,
 * chosen from the global pair counts by bytes on the wire: allgather of every rank's
 * message (SparCML's SSAR, Renggli et al. 2019), split-and-reduce by balanced index ranges
 * then allgather of the reduced pieces (SparCML's split-allgather with Ok-Topk's balanced
 * partition, Li & Hoefler 2022), or a dense ring once the merged density makes it cheaper.
 * Every rank decodes the same bytes in the same order, so results are bit-identical. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "compress/compress.h"
#include "compress/wire.h"
#include "collectives/sparse.h"
#include "base/util.h"

/* Tag ranges of the phases of one sparse allreduce. */
#define PHASE(n) ((uint32_t)(n) << 24)

const char *const gcoll_sparse_plan_names[] = {"allgather", "split", "dense"};

/* ---- local preparation --------------------------------------------------------------- */

/* Sorts pairs by index (LSD radix, two 16-bit passes) and sums repeats. Returns the new
 * count. tmp_idx/tmp_val have room for n. */
static size_t sort_merge(uint32_t *idx, float *val, size_t n, uint32_t *tmp_idx, float *tmp_val)
{
    size_t *cnt = malloc(65536 * sizeof(size_t));
    if (!cnt)
        return SIZE_MAX;
    uint32_t *si = idx, *di = tmp_idx;
    float *sv = val, *dv = tmp_val;
    for (int pass = 0; pass < 2; pass++) {
        int shift = 16 * pass;
        memset(cnt, 0, 65536 * sizeof(size_t));
        for (size_t i = 0; i < n; i++)
            cnt[(si[i] >> shift) & 0xffff]++;
        size_t sum = 0;
        for (size_t b = 0; b < 65536; b++) {
            size_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            size_t d = cnt[(si[i] >> shift) & 0xffff]++;
            di[d] = si[i];
            dv[d] = sv[i];
        }
        uint32_t *ti = si;
        si = di;
        di = ti;
        float *tv = sv;
        sv = dv;
        dv = tv;
    }
    free(cnt);
    /* two passes: the sorted data is back in idx/val */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && idx[m - 1] == idx[i]) {
            val[m - 1] += val[i];
        } else {
            idx[m] = idx[i];
            val[m] = val[i];
            m++;
        }
    }
    return m;
}

gcoll_status_t gcoll_sparse_prepare(const uint32_t *idx, const float *val, size_t nnz,
                                    gcoll_pairs_t *p)
{
    memset(p, 0, sizeof(*p));
    p->idx = malloc((nnz + 1) * sizeof(uint32_t));
    p->val = malloc((nnz + 1) * sizeof(float));
    uint32_t *ti = malloc((nnz + 1) * sizeof(uint32_t));
    float *tv = malloc((nnz + 1) * sizeof(float));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!p->idx || !p->val || !ti || !tv)
        goto out;
    memcpy(p->idx, idx, nnz * sizeof(uint32_t));
    memcpy(p->val, val, nnz * sizeof(float));
    p->n = sort_merge(p->idx, p->val, nnz, ti, tv);
    st = p->n == SIZE_MAX ? GCOLL_ERR_NOMEM : GCOLL_OK;
out:
    free(ti);
    free(tv);
    if (st != GCOLL_OK)
        gcoll_pairs_free(p);
    return st;
}

void gcoll_pairs_free(gcoll_pairs_t *p)
{
    free(p->idx);
    free(p->val);
    p->idx = NULL;
    p->val = NULL;
    p->n = 0;
}

/* ---- exchanges ----------------------------------------------------------------------------- */

/* Allgather of one 16-byte record per rank over the ring engine. */
static gcoll_status_t allgather_small(const gcoll_coll_t *ctx, uint8_t *all, size_t each,
                                      uint32_t sub0, uint32_t sig)
{
    const int P = ctx->size;
    gcoll_span_t *seg = calloc((size_t)P, sizeof(*seg));
    if (!seg)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < P; i++)
        seg[i] = (gcoll_span_t){(size_t)i * each, each};
    gcoll_ring_plan_t plan = {
        .buf = all, .seg = seg, .esz = 1, .ag_steps = (size_t)P - 1, .sig = sig, .sub0 = sub0};
    gcoll_status_t st = gcoll_ring_run(ctx, &plan);
    free(seg);
    return st;
}

/* ---- the three plans -------------------------------------------------------------------- */

typedef struct {
    uint64_t nnz, msglen;
} census_t;

/* out = the sum of every rank's message msg[i] (len[i] bytes, made by codec, NULL for
 * plain f32 pairs) in rank order, divided by P for AVG: the same bits on every rank. */
static gcoll_status_t sum_messages(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                   const gcoll_compressor_t *codec, const uint8_t *const *msg,
                                   const size_t *len, const char *what)
{
    uint64_t t0 = gcoll_time_ns();
    int bad = 0;
    gcoll_status_t st = gcoll_codec_sum(codec, msg, len, ctx->size, c->out, c->count,
                                        c->op == GCOLL_AVG ? (float)ctx->size : 1.0f, &bad);
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    if (st == GCOLL_ERR_INVALID)
        gcoll_channel_set_error(ctx->ch, "the %s of rank %d is malformed", what, bad);
    return st;
}

/* SSAR: everyone gathers every message and decodes them in rank order. */
static gcoll_status_t plan_allgather(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                     const census_t *cen, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    size_t total = 0;
    /* the spans, then the message pointers and lengths for sum_messages */
    gcoll_span_t *seg = calloc((size_t)P, sizeof(*seg) + sizeof(void *) + sizeof(size_t));
    if (!seg)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < P; i++) {
        seg[i] = (gcoll_span_t){total, (size_t)cen[i].msglen};
        total += (size_t)cen[i].msglen;
    }
    uint8_t *all = malloc(total + 1);
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!all)
        goto out;
    memcpy(all + seg[r].off, c->msg, c->msglen);
    gcoll_ring_plan_t plan = {
        .buf = all, .seg = seg, .esz = 1, .ag_steps = (size_t)P - 1, .sig = sig, .sub0 = PHASE(1)};
    GCOLL_CHECK_GOTO(gcoll_ring_run(ctx, &plan), st, out);
    const uint8_t **msg = (const uint8_t **)(seg + P);
    size_t *len = (size_t *)(msg + P);
    for (int i = 0; i < P; i++) {
        msg[i] = all + seg[i].off;
        len[i] = seg[i].len;
    }
    st = sum_messages(ctx, c, c->codec, msg, len, "sparse message");
out:
    free(all);
    free(seg);
    return st;
}

/* Balanced split points: P ranges of the index space holding about equal numbers of pairs
 * over all ranks, from a histogram allreduced over ranks (Ok-Topk's balanced partition). */
static gcoll_status_t partition(const gcoll_coll_t *ctx, const gcoll_pairs_t *pairs, size_t count,
                                uint32_t sig, size_t *bound)
{
    const int P = ctx->size;
    size_t nb = GCOLL_MIN((size_t)64 * (size_t)P, count), width = GCOLL_DIV_UP(count, nb);
    nb = GCOLL_DIV_UP(count, width);
    int64_t *hist = calloc(nb, sizeof(*hist));
    if (!hist)
        return GCOLL_ERR_NOMEM;
    for (size_t i = 0; i < pairs->n; i++)
        hist[pairs->idx[i] / width]++;
    gcoll_status_t st =
        gcoll_coll_ring_allreduce(ctx, hist, nb, GCOLL_INT64, GCOLL_SUM, sig, PHASE(2));
    if (st == GCOLL_OK) {
        int64_t total = 0, cum = 0;
        for (size_t b = 0; b < nb; b++)
            total += hist[b];
        int j = 1;
        bound[0] = 0;
        for (size_t b = 0; b < nb && j < P; b++) {
            cum += hist[b];
            while (j < P && cum * P >= total * j)
                bound[j++] = GCOLL_MIN((b + 1) * width, count);
        }
        while (j <= P)
            bound[j++] = count;
    }
    free(hist);
    return st;
}

static size_t lower_bound(const uint32_t *idx, size_t n, size_t key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Step 2 of plan_split: the pieces of range [lo, lo + span) in rbuf (this rank's own
 * among them) summed in rank order; the indices any of them touched, ascending, with their
 * sums into *pidx_p and *pval_p (*m_p of them; the caller frees both, set or not). */
static gcoll_status_t reduce_range(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                   const census_t *cen, size_t lo, size_t span,
                                   uint8_t *const *rbuf, const size_t *rlen, uint32_t **pidx_p,
                                   float **pval_p, size_t *m_p)
{
    const int P = ctx->size, r = ctx->rank;
    uint64_t t0 = gcoll_time_ns();
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    float *acc = calloc(span + 1, sizeof(float));
    if (!acc)
        return st;
    size_t maxn = 0;
    for (int i = 0; i < P; i++)
        maxn += GCOLL_MIN((size_t)cen[i].nnz, span);
    maxn = GCOLL_MIN(maxn, span);
    uint64_t *touched = calloc(GCOLL_DIV_UP(span, 64) + 1, sizeof(uint64_t));
    uint32_t *pidx = *pidx_p = malloc((maxn + 1) * sizeof(uint32_t));
    float *pval = *pval_p = malloc((maxn + 1) * sizeof(float));
    if (!touched || !pidx || !pval) {
        free(touched);
        free(acc);
        return st;
    }
    for (int i = 0; i < P && st != GCOLL_ERR_INVALID; i++) {
        gcoll_wire_hdr_t h;
        size_t n = 0;
        st = gcoll_wire_parse_hdr(rbuf[i], rlen[i], c->count, &h);
        if (st == GCOLL_OK && h.nnz <= maxn)
            st = gcoll_codec_decode_pairs(NULL, rbuf[i], rlen[i], c->count, pidx, pval, maxn, &n);
        else
            st = GCOLL_ERR_INVALID;
        for (size_t k = 0; st == GCOLL_OK && k < n; k++) {
            if (pidx[k] < lo || pidx[k] >= lo + span) {
                st = GCOLL_ERR_INVALID;
                break;
            }
            acc[pidx[k] - lo] += pval[k];
            touched[(pidx[k] - lo) / 64] |= 1ull << ((pidx[k] - lo) % 64);
        }
        if (st != GCOLL_OK) {
            gcoll_channel_set_error(ctx->ch,
                                    "rank %d sent a malformed piece or an index outside "
                                    "range [%zu, %zu) of rank %d",
                                    i, lo, lo + span, r);
            st = GCOLL_ERR_INVALID;
        }
    }
    if (st != GCOLL_OK) {
        free(touched);
        free(acc);
        return st;
    }
    size_t m = 0;
    for (size_t k = 0; k < span; k++)
        if (touched[k / 64] >> (k % 64) & 1) {
            pidx[m] = (uint32_t)(lo + k);
            pval[m++] = acc[k];
        }
    free(touched);
    free(acc);
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    *m_p = m;
    return GCOLL_OK;
}

/* Split and reduce: rank j reduces index range j, then everyone gathers the pieces. */
static gcoll_status_t plan_split(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                 const census_t *cen, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    const gcoll_pairs_t *pr = c->pairs;
    size_t *bound = calloc((size_t)P + 1, sizeof(size_t));
    size_t *slen = calloc(4 * (size_t)P, sizeof(size_t)), *rcap = slen + P, *rlen = rcap + P,
           *soff = rlen + P;
    uint8_t **sbuf = calloc(2 * (size_t)P, sizeof(uint8_t *)), **rbuf = sbuf ? sbuf + P : NULL;
    uint8_t *sstore = NULL, *rstore = NULL, *piece = NULL;
    uint32_t *pidx = NULL;
    float *pval = NULL;
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!bound || !slen || !sbuf)
        goto out;
    GCOLL_CHECK_GOTO(partition(ctx, pr, c->count, sig, bound), st, out);
    /* 1. my pairs of range j go to rank j, as f32 sparse messages with global indices */
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < P; j++) {
        size_t a = lower_bound(pr->idx, pr->n, bound[j]),
               b = lower_bound(pr->idx, pr->n, bound[j + 1]);
        soff[j] = stot;
        slen[j] = gcoll_codec_pairs_bound(NULL, b - a, c->count);
        stot += slen[j];
        rcap[j] = gcoll_codec_pairs_bound(
            NULL, GCOLL_MIN((size_t)cen[j].nnz, bound[r + 1] - bound[r]), c->count);
        rtot += rcap[j];
    }
    st = GCOLL_ERR_NOMEM;
    if (!(sstore = malloc(stot + 1)) || !(rstore = malloc(rtot + 1)))
        goto out;
    rtot = 0;
    for (int j = 0; j < P; j++) {
        size_t a = lower_bound(pr->idx, pr->n, bound[j]),
               b = lower_bound(pr->idx, pr->n, bound[j + 1]);
        sbuf[j] = sstore + soff[j];
        GCOLL_CHECK_GOTO(gcoll_codec_encode_pairs(NULL, pr->idx + a, pr->val + a, b - a, c->count,
                                                  sbuf[j], slen[j], &slen[j]),
                         st, out);
        rbuf[j] = rstore + rtot;
        rtot += rcap[j];
    }
    GCOLL_CHECK_GOTO(gcoll_exchange_anylen(ctx, PHASE(3), sig, sbuf, slen, rbuf, rcap, rlen), st,
                     out);
    rbuf[r] = sbuf[r];
    rlen[r] = slen[r];
    /* 2. reduce my range, contributions in rank order, then keep the touched indices */
    size_t m = 0;
    GCOLL_CHECK_GOTO(
        reduce_range(ctx, c, cen, bound[r], bound[r + 1] - bound[r], rbuf, rlen, &pidx, &pval, &m),
        st, out);
    /* 3. everyone gathers every reduced piece */
    size_t plen = gcoll_codec_pairs_bound(NULL, m, c->count);
    st = GCOLL_ERR_NOMEM;
    if (!(piece = malloc(plen)))
        goto out;
    GCOLL_CHECK_GOTO(gcoll_codec_encode_pairs(NULL, pidx, pval, m, c->count, piece, plen, &plen),
                     st, out);
    free(rstore);
    rtot = 0;
    for (int j = 0; j < P; j++) {
        sbuf[j] = j == r ? NULL : piece;
        slen[j] = plen;
        rcap[j] = gcoll_codec_pairs_bound(NULL, bound[j + 1] - bound[j], c->count);
        rtot += rcap[j];
    }
    st = GCOLL_ERR_NOMEM;
    if (!(rstore = malloc(rtot + 1)))
        goto out;
    rtot = 0;
    for (int j = 0; j < P; j++) {
        rbuf[j] = j == r ? NULL : rstore + rtot;
        rtot += rcap[j];
    }
    GCOLL_CHECK_GOTO(gcoll_exchange_anylen(ctx, PHASE(4), sig, sbuf, slen, rbuf, rcap, rlen), st,
                     out);
    rbuf[r] = piece;
    rlen[r] = plen;
    st = sum_messages(ctx, c, NULL, (const uint8_t *const *)rbuf, rlen, "reduced piece");
out:
    free(pidx);
    free(pval);
    free(piece);
    free(rstore);
    free(sstore);
    free(sbuf);
    free(slen);
    free(bound);
    return st;
}

/* Dense ring; AVG divides after the sum, as the other plans do while summing. */
static gcoll_status_t plan_dense(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                 uint32_t sig)
{
    uint64_t t0 = gcoll_time_ns();
    memset(c->out, 0, c->count * sizeof(float));
    for (size_t i = 0; i < c->pairs->n; i++)
        c->out[c->pairs->idx[i]] += c->pairs->val[i];
    ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    GCOLL_CHECK(
        gcoll_coll_ring_allreduce(ctx, c->out, c->count, GCOLL_FLOAT32, GCOLL_SUM, sig, PHASE(5)));
    if (c->op == GCOLL_AVG) {
        t0 = gcoll_time_ns();
        for (size_t i = 0; i < c->count; i++)
            c->out[i] /= (float)ctx->size;
        ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
    }
    return GCOLL_OK;
}

/* Bytes each rank receives under each plan, from the census every rank holds. */
static gcoll_sparse_plan_t choose(const gcoll_coll_t *ctx, const census_t *cen, size_t count,
                                  char *why, size_t len)
{
    const int P = ctx->size;
    double ntot = 0, mtot = 0;
    for (int i = 0; i < P; i++) {
        ntot += (double)cen[i].nnz;
        mtot += (double)cen[i].msglen;
    }
    double f = (double)(P - 1) / P, merged = ntot < (double)count ? ntot : (double)count;
    double b_all = mtot * f;                                /* everyone else's message */
    double b_split = 8.0 * ntot / P * f + 8.0 * merged * f; /* my share out, the pieces in */
    double b_dense = 2.0 * 4.0 * (double)count * f;
    gcoll_sparse_plan_t plan = GCOLL_SPARSE_ALLGATHER;
    double best = b_all;
    if (ctx->cfg->sparse_algo != GCOLL_SPARSE_AUTO) {
        plan = (gcoll_sparse_plan_t)(ctx->cfg->sparse_algo - 1);
    } else {
        /* split pays two extra latency-bound steps: it must win by more than that */
        if (b_split + 2.0 * P * 64 * 1024 < best) {
            plan = GCOLL_SPARSE_SPLIT;
            best = b_split;
        }
        if (b_dense < best)
            plan = GCOLL_SPARSE_DENSE;
    }
    snprintf(why, len,
             "%.0f pairs over %d ranks, dense size %zu: bytes per rank allgather "
             "%.0f, split %.0f, dense %.0f%s",
             ntot, P, count, b_all, b_split, b_dense,
             ctx->cfg->sparse_algo != GCOLL_SPARSE_AUTO ? " (forced by GCOLL_SPARSE_ALGO)" : "");
    return plan;
}

gcoll_status_t gcoll_sparse_run(const gcoll_coll_t *ctx, const gcoll_sparse_call_t *c,
                                gcoll_sparse_plan_t *plan_p)
{
    const int P = ctx->size, r = ctx->rank;
    uint32_t sig = c->sig
                       ? c->sig
                       : gcoll_call_sig(GCOLL_KIND_SPARSE, c->count, GCOLL_FLOAT32, c->op, c->kind);
    gcoll_pairs_t own = {0}; /* c->pairs decoded from c->msg, when needed */
    census_t *cen = calloc((size_t)P, sizeof(*cen));
    if (!cen)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st;
    uint8_t rec[16];
    gcoll_put_u64(rec, c->pairs->n);
    gcoll_put_u64(rec + 8, c->msglen);
    memcpy((uint8_t *)cen + (size_t)r * sizeof(census_t), rec, 16);
    GCOLL_CHECK_GOTO(allgather_small(ctx, (uint8_t *)cen, sizeof(census_t), PHASE(0), sig), st,
                     out);
    for (int i = 0; i < P; i++) {
        uint8_t *p = (uint8_t *)&cen[i];
        census_t v = {gcoll_get_u64(p), gcoll_get_u64(p + 8)};
        if (v.nnz > c->count || v.msglen > ((uint64_t)1 << 40)) {
            gcoll_channel_set_error(ctx->ch, "rank %d announced %llu pairs for a dense size of %zu",
                                    i, (unsigned long long)v.nnz, c->count);
            st = GCOLL_ERR_INVALID;
            goto out;
        }
        cen[i] = v;
    }
    char why[300];
    gcoll_sparse_plan_t plan = choose(ctx, cen, c->count, why, sizeof(why));
    GCOLL_INFO(GCOLL_SUBSYS_COLL, "sparse allreduce: %s plan: %s", gcoll_sparse_plan_names[plan],
               why);
    if (plan_p)
        *plan_p = plan;
    gcoll_sparse_call_t cc = *c;
    if (P > 1 && plan != GCOLL_SPARSE_ALLGATHER && !c->pairs->idx && c->pairs->n) {
        /* the caller sent only the message: the pairs, for the plans that need them */
        uint64_t t0 = gcoll_time_ns();
        own.idx = malloc((c->pairs->n + 1) * sizeof(uint32_t));
        own.val = malloc((c->pairs->n + 1) * sizeof(float));
        st = own.idx && own.val ? gcoll_codec_decode_pairs(c->codec, c->msg, c->msglen, c->count,
                                                           own.idx, own.val, c->pairs->n, &own.n)
                                : GCOLL_ERR_NOMEM;
        ctx->ch->counters.ns_compress += gcoll_time_ns() - t0;
        if (st != GCOLL_OK)
            goto out;
        cc.pairs = &own;
        c = &cc;
    }
    if (P == 1) {
        const uint8_t *msg = c->msg;
        st = sum_messages(ctx, c, c->codec, &msg, &c->msglen, "sparse message");
    } else if (plan == GCOLL_SPARSE_ALLGATHER) {
        st = plan_allgather(ctx, c, cen, sig);
    } else if (plan == GCOLL_SPARSE_SPLIT) {
        st = plan_split(ctx, c, cen, sig);
    } else {
        st = plan_dense(ctx, c, sig);
    }
out:
    gcoll_pairs_free(&own);
    free(cen);
    return st;
}
