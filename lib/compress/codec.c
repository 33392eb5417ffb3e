/* codec.c: message encode and decode for every codec: sparsify, pack values, write the wire format. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress.h"
#include "kernels.h"
#include "rng.h"
#include "select.h"
#include "values.h"
#include "wire.h"

/* --- properties and sizes ------------------------------------------------------------ */

unsigned gcoll_codec_flags(const gcoll_compressor_t *c)
{
    unsigned f = 0;
    switch (c->sparsify) {
    case GCOLL_SPARSIFY_NONE:
        break;
    case GCOLL_SPARSIFY_RANDOMK:
        f |= GCOLL_CODEC_SPARSE | GCOLL_CODEC_RANDOMK;
        break;
    case GCOLL_SPARSIFY_DGC:
        f |= GCOLL_CODEC_SPARSE | GCOLL_CODEC_NEEDS_STATE;
        break;
    default:
        f |= GCOLL_CODEC_SPARSE;
    }
    if (c->vs.fmt != GCOLL_VF_F32)
        f |= GCOLL_CODEC_QUANTIZED;
    if (c->vs.fmt == GCOLL_VF_QSGD)
        f |= GCOLL_CODEC_STOCHASTIC;
    if (c->sparsify == GCOLL_SPARSIFY_NONE && c->vs.fmt == GCOLL_VF_F32 && c->clip == 0)
        f |= GCOLL_CODEC_LOSSLESS;
    /* a sum of decoded messages is the decoding of nothing in particular, but adding
     * decodes is always meaningful: every codec here decodes to a linear image */
    return f;
}

/* DGC's warm-up (Lin et al. 2018, sec. 3.4): sparsity 75%, 93.75%, 98.4375%, 99.6% over
 * the first epochs, then the target. warmup_steps is split into four equal stages. */
static const double exp_stages[4] = {0.25, 0.0625, 0.015625, 0.004};

double gcoll_codec_density(const gcoll_compressor_t *c, uint64_t step)
{
    if (c->sparsify == GCOLL_SPARSIFY_NONE || c->sparsify == GCOLL_SPARSIFY_THRESHOLD)
        return 1.0;
    double d = c->density;
    if (c->k_fixed || c->warmup_steps == 0 || step >= c->warmup_steps)
        return d;
    double w;
    switch (c->sched) {
    case GCOLL_SCHED_EXP:
        w = exp_stages[(size_t)((__uint128_t)step * 4 / c->warmup_steps)];
        break;
    case GCOLL_SCHED_LINEAR:
        w = 0.25 + (d - 0.25) * ((double)step / (double)c->warmup_steps);
        break;
    case GCOLL_SCHED_STEP:
        w = 0.25;
        break;
    default:
        return d;
    }
    return w > d ? w : d;
}

static size_t k_for(const gcoll_compressor_t *c, size_t n, double d)
{
    if (n == 0)
        return 0;
    if (c->k_fixed)
        return (size_t)GCOLL_MIN((uint64_t)n, c->k_fixed);
    double kf = ceil(d * (double)n * (1.0 - 1e-12));
    size_t k = kf < 1.0 ? 1 : (kf >= (double)n ? n : (size_t)kf);
    return k;
}

size_t gcoll_codec_k(const gcoll_compressor_t *c, size_t n, uint64_t step)
{
    return k_for(c, n, gcoll_codec_density(c, step));
}

/* Most values a message of n elements may carry. */
static size_t kmax_for(const gcoll_compressor_t *c, size_t n)
{
    switch (c->sparsify) {
    case GCOLL_SPARSIFY_NONE:
    case GCOLL_SPARSIFY_THRESHOLD:
        return n;
    default: {
        double d = c->density;
        if (c->warmup_steps && c->sched != GCOLL_SCHED_NONE)
            d = d > 0.25 ? d : 0.25;
        size_t k = k_for(c, n, d);
        if (c->select == GCOLL_SELECT_REUSE && c->sparsify != GCOLL_SPARSIFY_RANDOMK)
            k = GCOLL_MIN(n, 2 * k);
        return k;
    }
    }
}

static size_t sparse_size(const gcoll_vspec_t *vs, size_t nnz, size_t n)
{
    size_t dense = gcoll_vsec_size(vs, n), vals = gcoll_vsec_size(vs, nnz);
    if (dense == SIZE_MAX || vals == SIZE_MAX)
        return SIZE_MAX;
    size_t sp = 4 * nnz + vals;
    return GCOLL_WIRE_HDR + (sp < dense ? sp : dense);
}

size_t gcoll_codec_bound(const gcoll_compressor_t *c, size_t n)
{
    if (c == NULL || n > GCOLL_WIRE_MAX_COUNT)
        return 0;
    size_t sz;
    if (c->sparsify == GCOLL_SPARSIFY_NONE || c->sparsify == GCOLL_SPARSIFY_RANDOMK) {
        sz = gcoll_vsec_size(&c->vs, kmax_for(c, n));
        return sz == SIZE_MAX ? 0 : GCOLL_WIRE_HDR + sz;
    }
    sz = sparse_size(&c->vs, kmax_for(c, n), n);
    return sz == SIZE_MAX ? 0 : sz;
}

size_t gcoll_codec_pairs_bound(const gcoll_compressor_t *c, size_t nnz, size_t count)
{
    gcoll_vspec_t f32 = {GCOLL_VF_F32, 0, 0, 0};
    if (count > GCOLL_WIRE_MAX_COUNT || nnz > count)
        return 0;
    size_t sz = sparse_size(c ? &c->vs : &f32, nnz, count);
    return sz == SIZE_MAX ? 0 : sz;
}

/* --- encoding ------------------------------------------------------------------------ */

static gcoll_status_t too_small(size_t need, size_t cap)
{
    GCOLL_WARN("compress: output buffer of %zu bytes, message needs %zu", cap, need);
    return GCOLL_ERR_INVALID;
}

/* Writes a sparse message for the pairs (idx[j], vals[j]). Picks the smaller of raw and
 * delta-bitpacked indices, and a dense message when that is smaller still. */
static gcoll_status_t emit_sparse(const gcoll_vspec_t *vs, const uint32_t *idx,
                                  const float *vals, size_t nnz, size_t n, uint64_t qkey,
                                  gcoll_scratch_t *sc, uint8_t *out, size_t cap, size_t *len_p)
{
    size_t dense = gcoll_vsec_size(vs, n), vsz = gcoll_vsec_size(vs, nnz);
    size_t delta = gcoll_idx_delta_size(idx, nnz);
    int use_delta = delta < 4 * nnz;
    size_t isz = use_delta ? delta : 4 * nnz;
    gcoll_wire_hdr_t h = {GCOLL_WIRE_SPARSE, GCOLL_WIRE_F_SORTED, n, nnz, 0, *vs, 0};
    if (isz + vsz > dense) {
        if (GCOLL_WIRE_HDR + dense > cap)
            return too_small(GCOLL_WIRE_HDR + dense, cap);
        GCOLL_CHECK(gcoll_scratch_tmp(sc, n));
        memset(sc->tmp, 0, n * sizeof(float));
        for (size_t j = 0; j < nnz; j++)
            sc->tmp[idx[j]] = vals[j];
        h.flags = GCOLL_WIRE_F_DENSE;
        h.nnz = n;
        h.payload_len = dense;
        gcoll_wire_put_hdr(out, &h);
        GCOLL_CHECK(gcoll_vsec_put(vs, sc->tmp, n, qkey, out + GCOLL_WIRE_HDR));
        *len_p = GCOLL_WIRE_HDR + dense;
        return GCOLL_OK;
    }
    h.payload_len = isz + vsz;
    if (GCOLL_WIRE_HDR + h.payload_len > cap)
        return too_small(GCOLL_WIRE_HDR + h.payload_len, cap);
    if (use_delta) {
        h.flags |= GCOLL_WIRE_F_DELTA;
        gcoll_idx_delta_write(idx, nnz, out + GCOLL_WIRE_HDR);
    } else {
        for (size_t j = 0; j < nnz; j++)
            gcoll_put_u32(out + GCOLL_WIRE_HDR + 4 * j, idx[j]);
    }
    gcoll_wire_put_hdr(out, &h);
    GCOLL_CHECK(gcoll_vsec_put(vs, vals, nnz, qkey, out + GCOLL_WIRE_HDR + isz));
    *len_p = GCOLL_WIRE_HDR + h.payload_len;
    return GCOLL_OK;
}

static uint64_t qsgd_key(uint64_t salt, uint64_t step, size_t off, int stateless)
{
    static uint64_t calls; /* stateless encodes must not repeat their rounding noise */
    uint64_t extra = stateless ? __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) : 0;
    return gcoll_mix64(gcoll_mix64(salt ^ 0x71736764ull) + step * 0x9e3779b97f4a7c15ull +
                       (uint64_t)off * 0xd1b54a32d192ed03ull + extra * 0xbf58476d1ce4e5b9ull);
}

static gcoll_status_t bad_nonfinite(const float *x, size_t n, size_t i)
{
    GCOLL_WARN("compress: non-finite input %g at element %zu of %zu (NaN/Inf cannot be "
               "compressed)", (double)x[i], i, n);
    return GCOLL_ERR_INVALID;
}

/* A feedback update dst = e + a*g that selection has yet to apply (g NULL: none; dst is
 * e, or the state's spare when the input scan is folded into the pass). The first pass
 * over e does it: fused with the collection of a (sampled) threshold, otherwise as a plain
 * axpy before the selector runs. */
typedef struct {
    const float *e;
    float *dst;
    const float *g;
    float a;
    int zero; /* values go out as f32: top-k may zero dst where it selects (select.h) */
} pending_t;

static void pending_flush(pending_t *p, size_t n)
{
    if (p->g) {
        if (p->dst != p->e)
            memcpy(p->dst, p->e, n * sizeof(float));
        gcoll_kernels()->axpy(p->dst, p->g, n, p->a);
        p->g = NULL;
    }
}

static gcoll_status_t topk_exact(const float *x, size_t n, size_t k, pending_t *p,
                                 gcoll_scratch_t *sc, size_t *nnz_p)
{
    if (p->g) { /* the update fused into the collecting pass */
        const float *g = p->g;
        p->g = NULL;
        return gcoll_select_topk_exact_axpy(p->dst, p->e, g, p->a, n, k, p->zero, sc, nnz_p);
    }
    return gcoll_select_topk_exact(x, n, k, sc, nnz_p);
}

static gcoll_status_t select_ge(const float *x, size_t n, uint32_t thr, size_t cap,
                                pending_t *p, gcoll_scratch_t *sc, size_t *cnt_p)
{
    if (p->g && p->dst == p->e) {
        const float *g = p->g;
        p->g = NULL;
        return gcoll_select_ge_axpy(p->dst, g, p->a, n, thr, cap, sc, cnt_p);
    }
    pending_flush(p, n);
    return gcoll_select_ge(x, n, thr, cap, sc, cnt_p);
}

/* Selects what a sparsifier sends from x[0..n) (after the pending update p, when x is
 * the residual); leaves ascending indices in sc->idx. */
static gcoll_status_t sparsify(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                               const float *x, size_t n, uint64_t step, size_t off,
                               pending_t *p, gcoll_scratch_t *sc, size_t *nnz_p)
{
    size_t k = gcoll_codec_k(c, n, step);
    switch (c->sparsify) {
    case GCOLL_SPARSIFY_THRESHOLD: {
        uint32_t thr;
        memcpy(&thr, &c->tau, 4);
        return select_ge(x, n, thr, n, p, sc, nnz_p);
    }
    case GCOLL_SPARSIFY_RANDOMK: {
        if (p->g) {
            /* the update with the check for NaN/Inf (the gradient's, or an overflow) in one
             * pass: the collecting kernel with only non-finite values at its threshold */
            int bad = 0;
            size_t nb = gcoll_kernels()->axpy_collect_ge(p->dst, p->e, p->g, n, p->a,
                                                         0x7f800000u, NULL, NULL, 0, &bad, 0);
            p->g = NULL;
            if (nb)
                return bad_nonfinite(x, n, gcoll_kernels()->first_bad(x, n));
        } else {
            size_t i = gcoll_kernels()->first_bad(x, n);
            if (i < n)
                return bad_nonfinite(x, n, i);
        }
        GCOLL_CHECK(gcoll_scratch_pairs(sc, k));
        GCOLL_CHECK(gcoll_scratch_bitmap(sc, n));
        GCOLL_CHECK(gcoll_randomk_indices(gcoll_randomk_key(c, step, off), n, k, sc->idx,
                                          sc->bitmap));
        *nnz_p = k;
        return GCOLL_OK;
    }
    default:
        break;
    }
    if (c->select == GCOLL_SELECT_SAMPLE) {
        uint64_t key = gcoll_mix64(step + off * 31 + 7);
        if (p->g) { /* sample e + a*g on the fly, then one fused update-and-collect pass */
            const float *g = p->g;
            p->g = NULL;
            return gcoll_select_topk_sample_axpy(p->dst, p->e, g, p->a, n, k, key, p->zero, sc,
                                                 nnz_p);
        }
        return gcoll_select_topk_sample(x, n, k, key, sc, nnz_p);
    }
    if (c->select == GCOLL_SELECT_REUSE && s && off == 0 && n == s->count) {
        /* Ok-Topk (Li & Hoefler 2022): thresholds drift slowly, so reuse the last exact
         * one for reuse_steps steps; re-select exactly when the count leaves [k/4, 2k]. */
        if (s->reuse_valid && step - s->reuse_at < c->reuse_steps) {
            size_t cnt;
            GCOLL_CHECK(select_ge(x, n, s->reuse_thr, 2 * k, p, sc, &cnt));
            if (cnt <= 2 * k && cnt >= k / 4) {
                *nnz_p = cnt;
                return GCOLL_OK;
            }
        }
        GCOLL_CHECK(topk_exact(x, n, k, p, sc, nnz_p));
        s->reuse_thr = *nnz_p ? gcoll_select_min_abs(sc->val, *nnz_p) : 1u;
        s->reuse_at = step;
        s->reuse_valid = 1;
        return GCOLL_OK;
    }
    return topk_exact(x, n, k, p, sc, nnz_p);
}

static gcoll_status_t apply_checked(const gcoll_wire_hdr_t *h, const uint8_t *payload,
                                    size_t isz, float *out, gcoll_dmode_t mode);

int gcoll_codec_folds_check(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                            size_t count)
{
    return c && s && s->c == c && s->e && s->mode == GCOLL_STATE_WORKER &&
           ((c->sparsify == GCOLL_SPARSIFY_TOPK && c->select != GCOLL_SELECT_REUSE) ||
            c->sparsify == GCOLL_SPARSIFY_RANDOMK) &&
           !(c->clip > 0) && count == s->count;
}

/* The spare residual of a folded check: written whole by the feedback pass before it is
 * read, so not cleared; 64-byte aligned for the pass's streaming stores. */
static float *spare_get(gcoll_tensor_state_t *s)
{
    if (!s->spare) {
        void *p = NULL;
        size_t bytes = GCOLL_DIV_UP((s->count ? s->count : 1) * sizeof(float), 64) * 64;
        if (posix_memalign(&p, 64, bytes) != 0)
            return NULL;
        s->spare = p;
    }
    return s->spare;
}

gcoll_status_t gcoll_codec_encode_range(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                        size_t off, const float *in, size_t n, uint64_t step,
                                        void *out, size_t cap, size_t *len_p)
{
    if (!c || !out || !len_p || (n > 0 && !in)) {
        GCOLL_WARN("compress: encode: NULL compressor, input, output or length pointer");
        return GCOLL_ERR_INVALID;
    }
    if (n > GCOLL_WIRE_MAX_COUNT) {
        GCOLL_WARN("compress: encode: %zu elements exceed the 32-bit index range", n);
        return GCOLL_ERR_INVALID;
    }
    if (s && (s->c != c || off > s->count || n > s->count - off)) {
        GCOLL_WARN("compress: encode: elements [%zu, %zu) do not fit the state (%zu elements%s)",
                   off, off + n, s->count, s->c != c ? ", other compressor" : "");
        return GCOLL_ERR_INVALID;
    }
    int dgc = c->sparsify == GCOLL_SPARSIFY_DGC && s && s->mode == GCOLL_STATE_WORKER;
    if (c->sparsify == GCOLL_SPARSIFY_DGC && !s) {
        GCOLL_WARN("compress: dgc keeps momentum and accumulation: it needs a tensor state");
        return GCOLL_ERR_INVALID;
    }
    const gcoll_kernels_t *k = gcoll_kernels();
    gcoll_scratch_t local = {0}, *sc = s ? &s->sc : &local;
    gcoll_status_t st = GCOLL_OK;
    int feedback = s && s->e;
    int clip = c->clip > 0 && !(s && s->mode == GCOLL_STATE_SERVER);
    float a = 1.0f;
    const float *work = in;
    /* dense codecs run the feedback update inside the value encoder, block by block */
    int fused_dense = feedback && !dgc && c->sparsify == GCOLL_SPARSIFY_NONE;
    pending_t pend = {NULL, NULL, NULL, 1.0f, 0};
    size_t zeroed_n = 0; /* selected elements of e the selection zeroed (restored on error) */
    sc->zeroed = 0;
    /* The input scan folded into top-k's and random-k's feedback pass (the caller's
     * choice, s->fold_check, made with the same gcoll_codec_folds_check): the pass writes
     * e + a*g into the spare buffer and catches NaN/Inf in the sum as it goes (top-k's
     * compare above any threshold; random-k's pass collects only them), so e is as it was
     * on any failure; on success the two buffers swap. One read of the input instead of
     * two. */
    int fold = feedback && !dgc && !s->input_checked && s->fold_check && off == 0 &&
               gcoll_codec_folds_check(c, s, n);
    if (fold && !spare_get(s)) {
        GCOLL_WARN("compress: cannot allocate the spare residual (%zu elements)", s->count);
        return GCOLL_ERR_NOMEM; /* nothing touched yet */
    }
    float *ew = fold ? s->spare : feedback ? s->e + off : NULL; /* where e_new goes */

    if ((feedback || clip) && !(s && s->input_checked) && !fold) {
        /* check before touching the state: a NaN in the residual would never leave */
        size_t i = k->first_bad(in, n);
        if (i < n) {
            st = bad_nonfinite(in, n, i);
            goto out_free;
        }
    }
    if (clip) {
        /* gradient clipping by l2 norm, as DGC applies before accumulation */
        double norm = sqrt(k->sumsq_d(in, n));
        if (norm > c->clip)
            a = (float)(c->clip / norm);
    }
    if (dgc) {
        k->dgc(s->u + off, s->e + off, in, n, c->momentum, a);
        work = s->e + off;
    } else if (feedback && !fused_dense) {
        /* the selection applies e += a*g in its first pass over e */
        pend = (pending_t){s->e + off, ew, in, a, c->vs.fmt == GCOLL_VF_F32};
        work = ew;
    } else if (a != 1.0f && !fused_dense) {
        GCOLL_CHECK_GOTO(gcoll_scratch_tmp(sc, n), st, out_free);
        memset(sc->tmp, 0, n * sizeof(float));
        k->axpy(sc->tmp, in, n, a);
        work = sc->tmp;
    }

    uint8_t *o = out;
    uint64_t qkey = qsgd_key(s ? s->salt : 0, step, off, s == NULL);
    size_t len = 0;
    if (c->sparsify == GCOLL_SPARSIFY_NONE) {
        size_t vsz = gcoll_vsec_size(&c->vs, n);
        if (GCOLL_WIRE_HDR + vsz > cap) {
            st = too_small(GCOLL_WIRE_HDR + vsz, cap);
            goto out_free;
        }
        gcoll_wire_hdr_t h = {GCOLL_WIRE_DENSE, 0, n, n, vsz, c->vs, 0};
        gcoll_wire_put_hdr(o, &h);
        if (fused_dense) {
            /* e += a*g, encode, e -= D(c): the same bytes and residual as the passes below */
            GCOLL_CHECK_GOTO(gcoll_vsec_put_ef(&c->vs, s->e + off, in, a, n, qkey,
                                               o + GCOLL_WIRE_HDR), st, out_free);
            *len_p = GCOLL_WIRE_HDR + vsz;
            goto out_free;
        }
        GCOLL_CHECK_GOTO(gcoll_vsec_put(&c->vs, work, n, qkey, o + GCOLL_WIRE_HDR), st, out_free);
        len = GCOLL_WIRE_HDR + vsz;
    } else {
        size_t nnz = 0;
        GCOLL_CHECK_GOTO(sparsify(c, s, work, n, step, off, &pend, sc, &nnz), st, out_free);
        zeroed_n = sc->zeroed ? nnz : 0;
        pending_flush(&pend, n); /* every selector has applied it; kept for safety */
        GCOLL_CHECK_GOTO(gcoll_scratch_pairs(sc, nnz), st, out_free);
        if (c->sparsify == GCOLL_SPARSIFY_RANDOMK) {
            /* random-k draws indices only; the others collected the values with them */
            float scale = 1.0f;
            if (c->unbiased && nnz)
                scale = (float)((double)n / (double)nnz);
            for (size_t j = 0; j < nnz; j++)
                sc->val[j] = work[sc->idx[j]] * scale;
            size_t vsz = gcoll_vsec_size(&c->vs, nnz);
            if (GCOLL_WIRE_HDR + vsz > cap) {
                st = too_small(GCOLL_WIRE_HDR + vsz, cap);
                goto out_free;
            }
            gcoll_wire_hdr_t h = {GCOLL_WIRE_RANDOMK, 0, n, nnz, vsz, c->vs,
                                  gcoll_randomk_key(c, step, off)};
            gcoll_wire_put_hdr(o, &h);
            GCOLL_CHECK_GOTO(gcoll_vsec_put(&c->vs, sc->val, nnz, qkey, o + GCOLL_WIRE_HDR), st,
                             out_free);
            len = GCOLL_WIRE_HDR + vsz;
        } else {
            GCOLL_CHECK_GOTO(emit_sparse(&c->vs, sc->idx, sc->val, nnz, n, qkey, sc, o, cap,
                                         &len), st, out_free);
        }
        if (dgc) /* momentum factor masking (Lin et al. 2018, sec. 3.2) */
            for (size_t j = 0; j < nnz; j++)
                s->u[off + sc->idx[j]] = 0.0f;
    }
    if (feedback && !sc->zeroed) {
        /* e -= D(c): subtract exactly what the receiver will decode, so that
         * D(c) + e_new == e_old + g (bit-exact when D(c)_i == e_i, as for sparsifiers;
         * top-k with f32 values zeroed those e_i in its collecting pass already) */
        gcoll_wire_hdr_t h;
        size_t isz = 0;
        GCOLL_CHECK_GOTO(gcoll_wire_parse_hdr(o, len, n, &h), st, out_free);
        if (h.codec == GCOLL_WIRE_SPARSE && !(h.flags & GCOLL_WIRE_F_DENSE))
            GCOLL_CHECK_GOTO(gcoll_idx_check(o + GCOLL_WIRE_HDR, (size_t)h.payload_len,
                                             h.flags, h.nnz, h.count, &isz), st, out_free);
        GCOLL_CHECK_GOTO(apply_checked(&h, o + GCOLL_WIRE_HDR, isz, ew, GCOLL_DECODE_SUB), st,
                         out_free);
    }
    *len_p = len;
    if (fold) { /* the new residual is the spare's; the old one is the next spare */
        s->spare = s->e;
        s->e = ew;
    }
out_free:
    if (st != GCOLL_OK && zeroed_n && !fold) /* nothing sent: e back to e_old + g (above) */
        for (size_t j = 0; j < zeroed_n; j++)
            ew[sc->idx[j]] = sc->val[j];
    if (!s)
        gcoll_scratch_free(&local);
    return st;
}

gcoll_status_t gcoll_codec_encode_pairs(const gcoll_compressor_t *c, const uint32_t *idx,
                                        const float *val, size_t nnz, size_t count, void *out,
                                        size_t cap, size_t *len_p)
{
    gcoll_vspec_t f32 = {GCOLL_VF_F32, 0, 0, 0};
    if (!out || !len_p || (nnz && (!idx || !val)) || nnz > count ||
        count > GCOLL_WIRE_MAX_COUNT) {
        GCOLL_WARN("compress: encode_pairs: bad arguments (nnz %zu, count %zu)", nnz, count);
        return GCOLL_ERR_INVALID;
    }
    for (size_t j = 0; j < nnz; j++)
        if (idx[j] >= count || (j > 0 && idx[j] <= idx[j - 1])) {
            GCOLL_WARN("compress: encode_pairs: index %u at %zu not ascending or >= %zu",
                       idx[j], j, count);
            return GCOLL_ERR_INVALID;
        }
    gcoll_scratch_t sc = {0};
    gcoll_status_t st = emit_sparse(c ? &c->vs : &f32, idx, val, nnz, count,
                                    qsgd_key(0, 0, 0, 1), &sc, out, cap, len_p);
    gcoll_scratch_free(&sc);
    return st;
}

/* --- decoding ------------------------------------------------------------------------ */

/* Full validation of the payload against the (already parsed) header. */
static gcoll_status_t check_payload_below(const gcoll_wire_hdr_t *h, const uint8_t *pl,
                                          uint64_t bound, size_t *isz_p)
{
    size_t isz = 0;
    uint64_t nvals = h->codec == GCOLL_WIRE_DENSE ? h->count : h->nnz;
    if (h->codec == GCOLL_WIRE_SPARSE && !(h->flags & GCOLL_WIRE_F_DENSE))
        GCOLL_CHECK(gcoll_idx_check(pl, (size_t)h->payload_len, h->flags, h->nnz, bound,
                                    &isz));
    size_t vsz = gcoll_vsec_size(&h->vs, nvals);
    if (vsz == SIZE_MAX || (uint64_t)vsz != h->payload_len - isz) {
        GCOLL_WARN("compress: malformed message: %llu value bytes for %llu values, "
                   "expected %zu", (unsigned long long)(h->payload_len - isz),
                   (unsigned long long)nvals, vsz);
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(gcoll_vsec_check(&h->vs, pl + isz, nvals));
    *isz_p = isz;
    return GCOLL_OK;
}

static gcoll_status_t check_payload(const gcoll_wire_hdr_t *h, const uint8_t *pl,
                                    size_t *isz_p)
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
                   "'%s'", h->codec, (int)h->vs.fmt, h->vs.bits, h->vs.bucket, c->spec);
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

static gcoll_status_t parse_full(const gcoll_compressor_t *c, const void *in, size_t len,
                                 size_t count, gcoll_wire_hdr_t *h, size_t *isz_p)
{
    GCOLL_CHECK(gcoll_wire_parse_hdr(in, len, count, h));
    GCOLL_CHECK(match_codec(c, h));
    return check_payload(h, (const uint8_t *)in + GCOLL_WIRE_HDR, isz_p);
}

/* Applies a validated message; sparse ADD/SUB touch only the nnz targets. */
static gcoll_status_t apply_checked(const gcoll_wire_hdr_t *h, const uint8_t *pl, size_t isz,
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
    GCOLL_CHECK(parse_full(c, in, len, count, &h, &isz));
    return apply_checked(&h, (const uint8_t *)in + GCOLL_WIRE_HDR, isz, out, mode);
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
    float blk[SUM_BLOCK];
    uint16_t tl[SUM_TOUCH];
    const int stream = count >= SUM_STREAM;
    if (stream)
        memset(blk, 0, sizeof(blk));
    for (size_t b = 0; b < count; b += SUM_BLOCK) {
        size_t end = GCOLL_MIN(b + SUM_BLOCK, count), nt = 0;
        float *o = stream ? blk : out + b; /* this block */
        if (!stream)
            memset(o, 0, (end - b) * sizeof(float));
        for (int i = 0; i < m; i++)
            nt = cursor_add_below(&q[i], o, b, end, tl, nt);
        if (div != 1.0f)
            for (size_t k = 0; k < end - b; k++)
                o[k] /= div;
        if (!stream)
            continue;
        gcoll_kernels()->stream_copy(out + b, blk, end - b);
        if (nt > SUM_TOUCH)
            memset(blk, 0, sizeof(blk));
        else
            for (size_t t = 0; t < nt; t++)
                blk[tl[t]] = 0.0f;
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
        st = parse_full(c, msgs[i], lens[i], count, &q[i].h, &isz);
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
            st = apply_checked(&q[i].h, pl, (size_t)(q[i].vals - pl), out, GCOLL_DECODE_ADD);
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
            !(h.flags & (GCOLL_WIRE_F_DELTA | GCOLL_WIRE_F_SORTED)) ||
            h.vs.fmt != GCOLL_VF_F32) {
            GCOLL_WARN("compress: sum: message %zu of a source is not a sorted f32 sparse "
                       "message", j);
            return GCOLL_ERR_INVALID;
        }
        GCOLL_CHECK(check_payload_below(&h, pl, hi, &isz[j]));
        if (h.nnz) {
            gcoll_idx_iter_t it;
            uint32_t first[GCOLL_WIRE_IDX_BLOCK];
            gcoll_idx_iter_init(&it, pl, h.flags, h.nnz);
            gcoll_idx_iter_next(&it, first);
            if (first[0] < lo) {
                GCOLL_WARN("compress: sum: message %zu starts at index %u, below %llu", j,
                           first[0], (unsigned long long)lo);
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

gcoll_status_t gcoll_sum_sources(const gcoll_compressor_t *c, const gcoll_sum_src_t *src,
                                 int m, float *out, size_t count, float div, int *bad_p)
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

gcoll_status_t gcoll_codec_decode_pairs(const gcoll_compressor_t *c, const void *in,
                                        size_t len, size_t count, uint32_t *idx, float *val,
                                        size_t cap, size_t *nnz_p)
{
    gcoll_wire_hdr_t h;
    size_t isz;
    if (!nnz_p) {
        GCOLL_WARN("compress: decode_pairs: NULL nnz pointer");
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(parse_full(c, in, len, count, &h, &isz));
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
