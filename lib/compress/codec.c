/* codec.c: message encode for every codec: sparsify, pack values, write the wire format
 * (decode.c reads it back). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/sparsify.h"
#include "compress/values.h"
#include "compress/wire.h"

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
    if (c->vs.fmt == GCOLL_VF_QSGD || c->vs.round == GCOLL_ROUND_STOCHASTIC)
        f |= GCOLL_CODEC_STOCHASTIC;
    if (c->sparsify == GCOLL_SPARSIFY_NONE && c->vs.fmt == GCOLL_VF_F32 && c->clip == 0 &&
        c->clip_value == 0)
        f |= GCOLL_CODEC_LOSSLESS;
    /* a sum of decoded messages is the decoding of nothing in particular, but adding
     * decodes is always meaningful: every codec here decodes to a linear image */
    return f;
}

int gcoll_codec_reduce_fp32(const gcoll_compressor_t *c)
{
    return c->sparsify == GCOLL_SPARSIFY_NONE && gcoll_vsec_is_float_lowp(&c->vs);
}

/* Most values a message of n elements may carry. */
static size_t kmax_for(const gcoll_compressor_t *c, size_t n)
{
    switch (c->sparsify) {
    case GCOLL_SPARSIFY_NONE:
    case GCOLL_SPARSIFY_THRESHOLD:
    case GCOLL_SPARSIFY_ROWS:
        return n;
    default: {
        double d = c->density;
        if (c->warmup_steps && c->sched != GCOLL_SCHED_NONE)
            d = d > c->warmup_start ? d : c->warmup_start;
        /* per-layer selection rounds each layer's k up and takes at least one */
        size_t k = GCOLL_MIN(n, gcoll_codec_k_of(c, n, d) + (c->nlayers > 1 ? c->nlayers : 0));
        if (c->select == GCOLL_SELECT_REUSE && c->sparsify != GCOLL_SPARSIFY_RANDOMK)
            k = GCOLL_MIN(n, 2 * k);
        return k;
    }
    }
}

/* Whether a sparse message may fall back to a dense one: not for sign, which has no zero
 * (the unsent elements would decode as +scale, and under error feedback their residuals
 * would drift without bound). */
static int dense_fallback_ok(const gcoll_vspec_t *vs)
{
    return vs->fmt != GCOLL_VF_SIGN;
}

static size_t sparse_size(const gcoll_vspec_t *vs, size_t nnz, size_t n)
{
    size_t dense = gcoll_vsec_size(vs, n), vals = gcoll_vsec_size(vs, nnz);
    if (dense == SIZE_MAX || vals == SIZE_MAX)
        return SIZE_MAX;
    size_t sp = 4 * nnz + vals;
    return GCOLL_WIRE_HDR + (sp < dense || !dense_fallback_ok(vs) ? sp : dense);
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
    gcoll_vspec_t f32 = {.fmt = GCOLL_VF_F32};
    if (count > GCOLL_WIRE_MAX_COUNT || nnz > count)
        return 0;
    size_t sz = sparse_size(c ? &c->vs : &f32, nnz, count);
    return sz == SIZE_MAX ? 0 : sz;
}

/* --- encoding ------------------------------------------------------------------------ */

/* rowsparse's row length (its messages are row-coded when that is smaller), 0 otherwise. */
static uint32_t row_dim(const gcoll_compressor_t *c)
{
    return c->sparsify == GCOLL_SPARSIFY_ROWS ? c->row_dim : 0;
}

static gcoll_status_t too_small(size_t need, size_t cap)
{
    GCOLL_WARN("compress: output buffer of %zu bytes, message needs %zu", cap, need);
    return GCOLL_ERR_INVALID;
}

/* Writes a sparse message for the pairs (idx[j], vals[j]). Picks the smallest of raw,
 * delta-bitpacked and (rowdim: rowsparse's rows of rowdim values, when the indices are
 * whole rows) row-coded indices, and a dense message when that is smaller still. */
static gcoll_status_t emit_sparse(const gcoll_vspec_t *vs, uint32_t rowdim, const uint32_t *idx,
                                  const float *vals, size_t nnz, size_t n, uint64_t qkey,
                                  gcoll_scratch_t *sc, uint8_t *out, size_t cap, size_t *len_p)
{
    size_t dense = gcoll_vsec_size(vs, n), vsz = gcoll_vsec_size(vs, nnz);
    size_t delta = gcoll_idx_delta_size(idx, nnz);
    int use_delta = delta < 4 * nnz;
    size_t isz = use_delta ? delta : 4 * nnz;
    uint32_t *rows = NULL;
    size_t nrows = 0, rsz = 0;
    if (rowdim && nnz) {
        rows = malloc((nnz / rowdim + 1) * sizeof(uint32_t));
        if (!rows)
            return GCOLL_ERR_NOMEM;
        rsz = gcoll_idx_rows_size(idx, nnz, n, rowdim, rows, &nrows);
    }
    const int use_rows = rsz && rsz < isz;
    if (use_rows)
        isz = rsz;
    gcoll_wire_hdr_t h = {GCOLL_WIRE_SPARSE, GCOLL_WIRE_F_SORTED, n, nnz, 0, *vs, 0};
    if (isz + vsz > dense && dense_fallback_ok(vs)) {
        free(rows);
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
    if (GCOLL_WIRE_HDR + h.payload_len > cap) {
        free(rows);
        return too_small(GCOLL_WIRE_HDR + h.payload_len, cap);
    }
    if (use_rows) {
        h.flags |= GCOLL_WIRE_F_ROWS;
        gcoll_idx_rows_write(rows, nrows, nnz, rowdim, out + GCOLL_WIRE_HDR);
    } else if (use_delta) {
        h.flags |= GCOLL_WIRE_F_DELTA;
        gcoll_idx_delta_write(idx, nnz, out + GCOLL_WIRE_HDR);
    } else {
        for (size_t j = 0; j < nnz; j++)
            gcoll_put_u32(out + GCOLL_WIRE_HDR + 4 * j, idx[j]);
    }
    free(rows);
    gcoll_wire_put_hdr(out, &h);
    GCOLL_CHECK(gcoll_vsec_put(vs, vals, nnz, qkey, out + GCOLL_WIRE_HDR + isz));
    *len_p = GCOLL_WIRE_HDR + h.payload_len;
    return GCOLL_OK;
}

uint64_t gcoll_codec_noise_key(uint64_t salt, uint64_t step, size_t off, int stateless)
{
    static uint64_t calls; /* stateless encodes must not repeat their rounding noise */
    uint64_t extra = stateless ? __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) : 0;
    return gcoll_mix64(gcoll_mix64(salt ^ 0x71736764ull) + step * 0x9e3779b97f4a7c15ull +
                       (uint64_t)off * 0xd1b54a32d192ed03ull + extra * 0xbf58476d1ce4e5b9ull);
}

static gcoll_status_t bad_nonfinite(const float *x, size_t n, size_t i)
{
    GCOLL_WARN("compress: non-finite input %g at element %zu of %zu (NaN/Inf cannot be "
               "compressed)",
               (double)x[i], i, n);
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
    int zero; /* values go out as f32: top-k may zero dst where it selects (sparsify.h) */
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

static gcoll_status_t select_ge(const float *x, size_t n, uint32_t thr, size_t cap, pending_t *p,
                                gcoll_scratch_t *sc, size_t *cnt_p)
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
 * the residual): k values (the call's, gcoll_codec_call_k; the layers' sum when layered);
 * leaves ascending indices in sc->idx. */
static gcoll_status_t sparsify(const gcoll_compressor_t *c, gcoll_tensor_state_t *s, const float *x,
                               size_t n, uint64_t step, size_t off, size_t k, int layered,
                               pending_t *p, gcoll_scratch_t *sc, size_t *nnz_p)
{
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
            size_t nb = gcoll_kernels()->axpy_collect_ge(p->dst, p->e, p->g, n, p->a, 0x7f800000u,
                                                         NULL, NULL, 0, &bad, 0);
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
        GCOLL_CHECK(
            gcoll_randomk_indices(gcoll_randomk_key(c, step, off), n, k, sc->idx, sc->bitmap));
        *nnz_p = k;
        return GCOLL_OK;
    }
    case GCOLL_SPARSIFY_ROWS:
        pending_flush(p, n); /* x is the residual now */
        return gcoll_select_rows(c, x, n, sc, nnz_p);
    default:
        break;
    }
    if (layered) {
        pending_flush(p, n); /* x is the residual now; the layers' selectors only read it */
        return gcoll_select_layers(c, x, off, n, step, k, sc, nnz_p);
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

int gcoll_codec_folds_check(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                            size_t count)
{
    return c && s && s->c == c && s->e && s->mode == GCOLL_STATE_WORKER &&
           ((c->sparsify == GCOLL_SPARSIFY_TOPK && c->select != GCOLL_SELECT_REUSE) ||
            (c->sparsify == GCOLL_SPARSIFY_RANDOMK && !c->ef21)) &&
           !(c->clip > 0) && !(c->clip_value > 0) && count == s->count &&
           !gcoll_codec_layered(c, 0, count);
}

static size_t spare_bytes(const gcoll_tensor_state_t *s)
{
    return GCOLL_DIV_UP((s->count ? s->count : 1) * sizeof(float), 64) * 64;
}

/* Bytes of spare residuals reserved in this process: the budget bounds their sum, so a
 * large model keeps one residual per tensor plus O(k) scratch (docs/compressors.md). */
static size_t spare_used;

int gcoll_codec_spare_reserve(gcoll_tensor_state_t *s, size_t budget)
{
    if (s->spare_reserved)
        return 1;
    size_t need = spare_bytes(s), cur = __atomic_load_n(&spare_used, __ATOMIC_RELAXED);
    do {
        if (need > budget || cur > budget - need) {
            if (!s->spare_refused)
                GCOLL_INFO(GCOLL_SUBSYS_COMPRESS,
                           "compress: a tensor of %zu floats keeps one "
                           "residual: its spare (%zu bytes) exceeds what is left of "
                           "GCOLL_EF_SPARE_MAX (%zu of %zu bytes in use); the gradient is "
                           "scanned before the feedback pass",
                           s->count, need, cur, budget);
            s->spare_refused = 1;
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&spare_used, &cur, cur + need, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    s->spare_reserved = need;
    return 1;
}

void gcoll_codec_spare_release(gcoll_tensor_state_t *s)
{
    if (s->spare_reserved)
        __atomic_fetch_sub(&spare_used, s->spare_reserved, __ATOMIC_RELAXED);
    s->spare_reserved = 0;
}

/* The spare residual of a folded check: written whole by the feedback pass before it is
 * read, so not cleared; 64-byte aligned for the pass's streaming stores. */
static float *spare_get(gcoll_tensor_state_t *s)
{
    if (!s->spare) {
        void *p = NULL;
        size_t bytes = spare_bytes(s);
        if (posix_memalign(&p, 64, bytes) != 0)
            return NULL;
        s->spare = p;
    }
    return s->spare;
}

/* Elementwise clamp to [-v, v] (NaN was refused before). */
static void clamp_copy(float *dst, const float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = x[i] > v ? v : (x[i] < -v ? -v : x[i]);
}

/* The state's buffer for the clamped input of clip_value, of the tensor's size. */
static float *clamp_buf(gcoll_tensor_state_t *s)
{
    if (!s->clamped)
        s->clamped = malloc((s->count ? s->count : 1) * sizeof(float));
    return s->clamped;
}

float gcoll_codec_clip_factor(const gcoll_compressor_t *c, const float *g, size_t n, int clamp,
                              int nranks)
{
    if (!(c->clip > 0))
        return 1.0f;
    double ss = 0;
    if (clamp && c->clip_value > 0) {
        const float v = (float)c->clip_value; /* as the encoder clamps */
        for (size_t i = 0; i < n; i++) {
            double x = g[i] > v ? v : (g[i] < -v ? -v : g[i]);
            ss += x * x;
        }
    } else {
        ss = gcoll_kernels()->sumsq_d(g, n);
    }
    double norm = sqrt(ss), lim = c->clip;
    /* DGC clips each rank's gradient to the threshold scaled by N^-1/2 (Lin et al. 2018,
     * sec. 3.3): N such gradients sum to about sqrt(N) times one's norm */
    if (c->sparsify == GCOLL_SPARSIFY_DGC && nranks > 1)
        lim /= sqrt((double)nranks);
    return norm > lim ? (float)(lim / norm) : 1.0f;
}

/* The call's NaN/Inf policy (opt->check; NULL: scan), decided here and nowhere else in
 * the codec. *fold_p: the check folded into top-k's and random-k's feedback pass (the
 * caller's GCOLL_NANCHECK_FOLD, made with the same gcoll_codec_folds_check; can_fold:
 * error feedback, not DGC): the pass writes e + a*g into the spare buffer, made ready
 * here, and catches NaN/Inf in the sum as it goes (top-k's compare above any threshold;
 * random-k's pass collects only them), so e is as it was on any failure; on success the
 * two buffers swap. One read of the input instead of two. Otherwise the input is scanned
 * here where something reads it into the state or scales it (needs_finite), unless the
 * caller verified it (GCOLL_NANCHECK_DONE). Nothing is touched when this fails. */
static gcoll_status_t nan_policy(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                 const gcoll_encode_opts_t *opt, size_t off, const float *in,
                                 size_t n, int can_fold, int needs_finite, int *fold_p)
{
    const gcoll_nancheck_t check = opt ? opt->check : GCOLL_NANCHECK_SCAN;
    *fold_p =
        can_fold && check == GCOLL_NANCHECK_FOLD && off == 0 && gcoll_codec_folds_check(c, s, n);
    if (*fold_p && !spare_get(s)) {
        GCOLL_WARN("compress: cannot allocate the spare residual (%zu elements)", s->count);
        return GCOLL_ERR_NOMEM;
    }
    if (needs_finite && check != GCOLL_NANCHECK_DONE && !*fold_p) {
        /* check before touching the state: a NaN in the residual would never leave */
        size_t i = gcoll_kernels()->first_bad(in, n);
        if (i < n)
            return bad_nonfinite(in, n, i);
    }
    return GCOLL_OK;
}

/* One encode's working state, shared by the steps of gcoll_codec_encode_range. */
typedef struct {
    const gcoll_compressor_t *c;
    gcoll_tensor_state_t *s; /* NULL: stateless */
    size_t off, n;
    uint64_t step;
    size_t k;    /* sparsifiers with a density: what the selection keeps (gcoll_codec_call_k) */
    int layered; /* the selection goes layer by layer */
    gcoll_scratch_t *sc;
    gcoll_vspec_t vs;  /* the value form of this call */
    int dgc;           /* DGC's worker: momentum and accumulation in the state */
    int feedback;      /* error feedback: the state has a residual */
    int fused_dense;   /* dense codec with feedback: the update runs inside the encoder */
    int fold;          /* the NaN/Inf check folded into the feedback pass (nan_policy) */
    float a;           /* gradient clipping's factor (1: none) */
    const float *in;   /* the input (the clamped copy under value clipping) */
    const float *work; /* what the value encoder or the selection reads */
    float *ew;         /* where the new residual goes */
    float *clamped;    /* value clipping's copy (the state's buffer, or ours) */
    pending_t pend;    /* the feedback update left to the selection's first pass */
    uint64_t qkey;
} encode_t;

/* The arguments of an encode (nothing touched). */
static gcoll_status_t encode_check(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                                   size_t off, const float *in, size_t n, const void *out,
                                   const size_t *len_p)
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
    if (c->sparsify == GCOLL_SPARSIFY_DGC && !s) {
        GCOLL_WARN("compress: dgc keeps momentum and accumulation: it needs a tensor state");
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

/* Clipping, DGC's momentum and accumulation, and where the feedback update goes: leaves in
 * E->work what the encoder reads (clip: clipping applies to this call). */
static gcoll_status_t encode_input(encode_t *E, const gcoll_encode_opts_t *opt, int clip)
{
    const gcoll_compressor_t *c = E->c;
    gcoll_tensor_state_t *s = E->s;
    const gcoll_kernels_t *k = gcoll_kernels();
    const size_t off = E->off, n = E->n;
    if (clip && c->clip_value > 0) {
        /* value clipping: the encoders read the input more than once, so a clamped copy */
        E->clamped = s ? clamp_buf(s) : malloc((n ? n : 1) * sizeof(float));
        if (!E->clamped)
            return GCOLL_ERR_NOMEM;
        clamp_copy(E->clamped, E->in, n, (float)c->clip_value);
        E->in = E->work = E->clamped;
    }
    if (clip && c->clip > 0) {
        /* gradient clipping by l2 norm, as DGC applies before accumulation: by the factor
         * the collective computed over the whole tensor when it cuts it into chunks */
        E->a = opt && opt->clip_preset ? opt->clip_factor
                                       : gcoll_codec_clip_factor(c, E->in, n, 0, s ? s->nranks : 0);
    }
    if (E->feedback && c->sparsify == GCOLL_SPARSIFY_RANDOMK && c->momentum > 0 &&
        s->mode == GCOLL_STATE_WORKER) {
        /* randomk:momentum=M stands in for the optimizer's momentum M. Its error feedback is
         * already a heavy-ball momentum of 1-k/n in expectation (docs/compressors.md), so no
         * second velocity (that diverged, masked as in DGC or not): the residual takes g
         * times a velocity's long-run gain 1/(1-M), and the caller runs plain SGD. */
        E->a *= 1.0f / (1.0f - c->momentum);
    }
    if (E->dgc) {
        k->dgc(s->u + off, s->e + off, E->in, n, c->momentum, E->a);
        E->work = s->e + off;
    } else if (E->feedback && !E->fused_dense) {
        /* the selection applies e += a*g in its first pass over e */
        E->pend = (pending_t){s->e + off, E->ew, E->in, E->a, c->vs.fmt == GCOLL_VF_F32};
        E->work = E->ew;
    } else if (E->a != 1.0f && !E->fused_dense) {
        GCOLL_CHECK(gcoll_scratch_tmp(E->sc, n));
        memset(E->sc->tmp, 0, n * sizeof(float));
        k->axpy(E->sc->tmp, E->in, n, E->a);
        E->work = E->sc->tmp;
    }
    return GCOLL_OK;
}

/* Dense codecs: one value section. With feedback fused, the update and e -= D(c) happen in
 * the encoder and *done_p is set (nothing left to subtract). */
static gcoll_status_t encode_dense(encode_t *E, uint8_t *o, size_t cap, size_t *len_p, int *done_p)
{
    const size_t n = E->n;
    size_t vsz = gcoll_vsec_size(&E->vs, n);
    if (GCOLL_WIRE_HDR + vsz > cap)
        return too_small(GCOLL_WIRE_HDR + vsz, cap);
    gcoll_wire_hdr_t h = {GCOLL_WIRE_DENSE, 0, n, n, vsz, E->vs, 0};
    gcoll_wire_put_hdr(o, &h);
    if (E->fused_dense) {
        /* e += a*g, encode, e -= D(c): the same bytes and residual as the passes below */
        GCOLL_CHECK(gcoll_vsec_put_ef(&E->vs, E->s->e + E->off, E->in, E->a, n, E->qkey,
                                      o + GCOLL_WIRE_HDR));
        *done_p = 1;
    } else if (E->vs.fmt == GCOLL_VF_VQ) {
        pending_flush(&E->pend, n); /* the feedback update, if any: x = e + a*g */
        GCOLL_CHECK(
            gcoll_vq_put(&E->vs, E->work, n, E->s ? &E->s->vq_book : NULL, o + GCOLL_WIRE_HDR));
    } else {
        GCOLL_CHECK(gcoll_vsec_put(&E->vs, E->work, n, E->qkey, o + GCOLL_WIRE_HDR));
    }
    *len_p = GCOLL_WIRE_HDR + vsz;
    return GCOLL_OK;
}

/* Sparsifiers: the selection, then random-k's values or the pairs; DGC's momentum masking.
 * *zeroed_p: the selected elements of e the selection zeroed (restored on a failure). */
static gcoll_status_t encode_sparse(encode_t *E, uint8_t *o, size_t cap, size_t *len_p,
                                    size_t *zeroed_p)
{
    const gcoll_compressor_t *c = E->c;
    gcoll_scratch_t *sc = E->sc;
    const size_t n = E->n;
    size_t nnz = 0;
    GCOLL_CHECK(
        sparsify(c, E->s, E->work, n, E->step, E->off, E->k, E->layered, &E->pend, sc, &nnz));
    *zeroed_p = sc->zeroed ? nnz : 0;
    pending_flush(&E->pend, n); /* every selector has applied it; kept for safety */
    GCOLL_CHECK(gcoll_scratch_pairs(sc, nnz));
    if (c->sparsify == GCOLL_SPARSIFY_RANDOMK) {
        /* random-k draws indices only; the others collected the values with them */
        float scale = 1.0f;
        if (c->unbiased && nnz)
            scale = (float)((double)n / (double)nnz);
        for (size_t j = 0; j < nnz; j++)
            sc->val[j] = E->work[sc->idx[j]] * scale;
        size_t vsz = gcoll_vsec_size(&E->vs, nnz);
        if (GCOLL_WIRE_HDR + vsz > cap)
            return too_small(GCOLL_WIRE_HDR + vsz, cap);
        gcoll_wire_hdr_t h = {
            GCOLL_WIRE_RANDOMK, 0, n, nnz, vsz, E->vs, gcoll_randomk_key(c, E->step, E->off)};
        gcoll_wire_put_hdr(o, &h);
        GCOLL_CHECK(gcoll_vsec_put(&E->vs, sc->val, nnz, E->qkey, o + GCOLL_WIRE_HDR));
        *len_p = GCOLL_WIRE_HDR + vsz;
    } else {
        GCOLL_CHECK(
            emit_sparse(&E->vs, row_dim(c), sc->idx, sc->val, nnz, n, E->qkey, sc, o, cap, len_p));
    }
    /* momentum factor masking (Lin et al. 2018, sec. 3.2): the sent elements' momentum
     * is stale once applied. A selection of every element (a dense warm-up stage) is
     * momentum SGD itself, with nothing delayed to mask. */
    if (E->dgc && E->k < n)
        for (size_t j = 0; j < nnz; j++)
            E->s->u[E->off + sc->idx[j]] = 0.0f;
    return GCOLL_OK;
}

/* e -= D(c): subtract exactly what the receiver will decode, so that D(c) + e_new ==
 * e_old + g (bit-exact when D(c)_i == e_i, as for sparsifiers; top-k with f32 values
 * zeroed those e_i in its collecting pass already). */
static gcoll_status_t feedback_sub(const encode_t *E, const uint8_t *o, size_t len)
{
    gcoll_wire_hdr_t h;
    size_t isz = 0;
    GCOLL_CHECK(gcoll_wire_parse_hdr(o, len, E->n, &h));
    if (h.codec == GCOLL_WIRE_SPARSE && !(h.flags & GCOLL_WIRE_F_DENSE))
        GCOLL_CHECK(gcoll_idx_check(o + GCOLL_WIRE_HDR, (size_t)h.payload_len, h.flags, h.nnz,
                                    h.count, &isz));
    return gcoll_codec_apply(&h, o + GCOLL_WIRE_HDR, isz, E->ew, GCOLL_DECODE_SUB);
}

gcoll_status_t gcoll_codec_encode_range(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                        size_t off, const float *in, size_t n, uint64_t step,
                                        const gcoll_encode_opts_t *opt, void *out, size_t cap,
                                        size_t *len_p)
{
    GCOLL_CHECK(encode_check(c, s, off, in, n, out, len_p));
    if (c->sparsify == GCOLL_SPARSIFY_RANDOMK && c->ef21 && s && s->e)
        return gcoll_randomk_ef21_encode(c, s, off, in, n, step, opt, out, cap, len_p);
    gcoll_scratch_t local = {0};
    encode_t E = {.c = c,
                  .s = s,
                  .off = off,
                  .n = n,
                  .step = step,
                  .sc = s ? &s->sc : &local,
                  .vs = c->vs,
                  .a = 1.0f,
                  .in = in,
                  .work = in,
                  .pend = {NULL, NULL, NULL, 1.0f, 0}};
    E.dgc = c->sparsify == GCOLL_SPARSIFY_DGC && s && s->mode == GCOLL_STATE_WORKER;
    /* a server state's tensor is one chunk: the layers' offsets are not its own */
    E.layered = !(s && s->mode == GCOLL_STATE_SERVER) && gcoll_codec_layered(c, off, n);
    if (c->sparsify == GCOLL_SPARSIFY_TOPK || c->sparsify == GCOLL_SPARSIFY_RANDOMK ||
        c->sparsify == GCOLL_SPARSIFY_DGC)
        E.k = gcoll_codec_call_k(c, s, opt, off, n, step);
    E.feedback = s && s->e;
    /* the value form: contractive where the residual takes the error back, unbiased
     * (as published) where nothing does (docs/compressors.md, "Error feedback") */
    E.vs.contract = E.feedback;
    int clip = (c->clip > 0 || c->clip_value > 0) && !(s && s->mode == GCOLL_STATE_SERVER);
    /* dense codecs run the feedback update inside the value encoder, block by block */
    E.fused_dense = E.feedback && !E.dgc && c->sparsify == GCOLL_SPARSIFY_NONE &&
                    c->vs.fmt != GCOLL_VF_VQ; /* vq keeps a codebook in the state */
    size_t zeroed_n = 0;
    E.sc->zeroed = 0;
    GCOLL_CHECK(
        nan_policy(c, s, opt, off, in, n, E.feedback && !E.dgc, E.feedback || clip, &E.fold));
    E.sc->stream = opt ? opt->stream : NULL; /* for this call only (sparsify.h); reset below */
    E.ew = E.fold ? s->spare : E.feedback ? s->e + off : NULL;

    uint8_t *o = out;
    size_t len = 0;
    int done = 0;
    gcoll_status_t st = encode_input(&E, opt, clip);
    E.qkey = gcoll_codec_noise_key(s ? s->salt : 0, step, off, s == NULL);
    if (st == GCOLL_OK && c->sparsify == GCOLL_SPARSIFY_NONE)
        st = encode_dense(&E, o, cap, &len, &done);
    else if (st == GCOLL_OK)
        st = encode_sparse(&E, o, cap, &len, &zeroed_n);
    if (st == GCOLL_OK && !done && E.feedback && !E.sc->zeroed)
        st = feedback_sub(&E, o, len);
    if (st == GCOLL_OK) {
        *len_p = len;
        if (E.fold && !done) { /* the new residual is the spare's; the old one the next spare */
            s->spare = s->e;
            s->e = E.ew;
        }
    }
    E.sc->stream = NULL;
    if (st != GCOLL_OK && zeroed_n && !E.fold) /* nothing sent: e back to e_old + g (above) */
        for (size_t j = 0; j < zeroed_n; j++)
            E.ew[E.sc->idx[j]] = E.sc->val[j];
    if (!s) {
        gcoll_scratch_free(&local);
        free(E.clamped);
    }
    return st;
}

gcoll_status_t gcoll_codec_encode_pairs(const gcoll_compressor_t *c, const uint32_t *idx,
                                        const float *val, size_t nnz, size_t count, void *out,
                                        size_t cap, size_t *len_p)
{
    gcoll_vspec_t f32 = {.fmt = GCOLL_VF_F32};
    if (!out || !len_p || (nnz && (!idx || !val)) || nnz > count || count > GCOLL_WIRE_MAX_COUNT) {
        GCOLL_WARN("compress: encode_pairs: bad arguments (nnz %zu, count %zu)", nnz, count);
        return GCOLL_ERR_INVALID;
    }
    for (size_t j = 0; j < nnz; j++)
        if (idx[j] >= count || (j > 0 && idx[j] <= idx[j - 1])) {
            GCOLL_WARN("compress: encode_pairs: index %u at %zu not ascending or >= %zu", idx[j], j,
                       count);
            return GCOLL_ERR_INVALID;
        }
    gcoll_scratch_t sc = {0};
    gcoll_status_t st = emit_sparse(c ? &c->vs : &f32, c ? row_dim(c) : 0, idx, val, nnz, count,
                                    gcoll_codec_noise_key(0, 0, 0, 1), &sc, out, cap, len_p);
    gcoll_scratch_free(&sc);
    return st;
}
