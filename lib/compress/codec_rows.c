/* codec_rows.c: the sparsifiers beside top-k: EF21 for random-k and embedding rows
 * (rowsparse). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress.h"
#include "kernels.h"
#include "rng.h"
#include "select.h"
#include "values.h"
#include "wire.h"

/* EF21 for random-k (Richtarik, Sokolov, Fatkhullin 2021, with the contractive unscaled
 * random-k): e holds g_i, the values last sent; the message carries c = x - g_i at the k
 * shared indices and g_i += D(c) there. The receivers' estimate G = mean_i g_i moves by the
 * mean of the messages (run_randomk keeps it). Unlike classic feedback nothing
 * accumulates: an unsent element's estimate is its last sent value, a stale gradient
 * rather than ~n/k steps of them released at once. */
gcoll_status_t gcoll_randomk_ef21_encode(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                         size_t off, const float *in, size_t n, uint64_t step,
                                         const gcoll_encode_opts_t *opt, void *out, size_t cap,
                                         size_t *len_p)
{
    const gcoll_kernels_t *k = gcoll_kernels();
    if (!(opt && opt->check == GCOLL_NANCHECK_DONE)) {
        size_t i = k->first_bad(in, n);
        if (i < n) {
            GCOLL_WARN("compress: non-finite input %g at element %zu of %zu", (double)in[i], i, n);
            return GCOLL_ERR_INVALID;
        }
    }
    float a = 1.0f;
    if (c->clip > 0 && s->mode == GCOLL_STATE_WORKER)
        a = opt && opt->clip_preset ? opt->clip_factor
                                    : gcoll_codec_clip_factor(c, in, n, 1, s->nranks);
    const float v =
        c->clip_value > 0 && s->mode == GCOLL_STATE_WORKER ? (float)c->clip_value : 0.0f;
    gcoll_scratch_t *sc = &s->sc;
    size_t kk = gcoll_codec_k(c, n, step);
    GCOLL_CHECK(gcoll_scratch_pairs(sc, kk));
    GCOLL_CHECK(gcoll_scratch_bitmap(sc, n));
    GCOLL_CHECK(gcoll_scratch_tmp(sc, kk));
    uint64_t key = gcoll_randomk_key(c, step, off);
    GCOLL_CHECK(gcoll_randomk_indices(key, n, kk, sc->idx, sc->bitmap));
    float *g = s->e + off;
    for (size_t j = 0; j < kk; j++) {
        float x = in[sc->idx[j]];
        if (v > 0)
            x = x > v ? v : (x < -v ? -v : x);
        sc->val[j] = a * x - g[sc->idx[j]];
    }
    size_t vsz = gcoll_vsec_size(&c->vs, kk);
    if (GCOLL_WIRE_HDR + vsz > cap) {
        GCOLL_WARN("compress: output buffer of %zu bytes, message needs %zu", cap,
                   GCOLL_WIRE_HDR + vsz);
        return GCOLL_ERR_INVALID;
    }
    uint8_t *o = out;
    gcoll_vspec_t vs = c->vs;
    vs.contract = 1;
    gcoll_wire_hdr_t h = {GCOLL_WIRE_RANDOMK, 0, n, kk, vsz, vs, key};
    gcoll_wire_put_hdr(o, &h);
    /* a difference that overflows is refused here, before g changes */
    GCOLL_CHECK(gcoll_vsec_put(&vs, sc->val, kk, gcoll_codec_noise_key(s->salt, step, off, 0),
                               o + GCOLL_WIRE_HDR));
    if (kk) { /* (an empty tensor has no scratch: a fuzzer found the memcpy of nothing) */
        gcoll_vsec_apply_range(&vs, o + GCOLL_WIRE_HDR, kk, 0, kk, sc->tmp, GCOLL_DECODE_SET);
        for (size_t j = 0; j < kk; j++)
            g[sc->idx[j]] += sc->tmp[j];
    }
    *len_p = GCOLL_WIRE_HDR + vsz;
    return GCOLL_OK;
}

/* --- rowsparse ------------------------------------------------------------------------ */

/*
 * Embedding gradients (the seed's "large vocabulary size and sparse gradient structure"):
 * a step touches few rows of the table, and those rows are dense. Rows with a non-zero
 * value travel whole as ordinary sparse pairs: their indices are runs of consecutive
 * elements, which the delta-bitpacked index section codes in about one byte per 128
 * values (gaps of 0), so a row costs its values plus a row index's worth. The sparse
 * allreduce merges them and switches to a dense ring where the merged rows make that
 * cheaper. With density=d only the rows of largest l2 norm go, the rest stays in the
 * residual: top-k applied to rows, a contraction with delta >= d for the same reason as
 * top-k's (Stich et al. 2018), since the kept rows hold at least that share of ||x||^2.
 * The row form of sparse gradients is the one embedding-aware data parallelism sends
 * (Parallax, Kim et al., EuroSys 2019; TensorFlow's IndexedSlices).
 */
typedef struct {
    double norm;
    size_t row;
} row_norm_t;

static int by_norm_desc(const void *a, const void *b)
{
    const row_norm_t *x = a, *y = b;
    if (x->norm != y->norm)
        return x->norm > y->norm ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

gcoll_status_t gcoll_select_rows(const gcoll_compressor_t *c, const float *x, size_t n,
                                 gcoll_scratch_t *sc, size_t *nnz_p)
{
    const size_t D = c->row_dim, nrows = n ? (n - 1) / D + 1 : 0;
    size_t touched = 0, i = gcoll_kernels()->first_bad(x, n);
    if (i < n) {
        GCOLL_WARN("compress: rowsparse: non-finite input %g at element %zu", (double)x[i], i);
        return GCOLL_ERR_INVALID;
    }
    row_norm_t *rn = malloc((nrows ? nrows : 1) * sizeof(*rn));
    if (!rn)
        return GCOLL_ERR_NOMEM;
    for (size_t r = 0; r < nrows; r++) {
        size_t lo = r * D, hi = GCOLL_MIN(n, lo + D);
        double ss = 0;
        int nz = 0;
        for (size_t j = lo; j < hi; j++) {
            nz |= x[j] != 0.0f;
            ss += (double)x[j] * x[j];
        }
        if (nz)
            rn[touched++] = (row_norm_t){ss, r};
    }
    size_t keep = touched;
    if (c->density > 0 && touched) {
        double kf = gcoll_density_k(c->density, (double)touched);
        keep = kf >= (double)touched ? touched : (size_t)kf;
        qsort(rn, touched, sizeof(*rn), by_norm_desc);
    }
    gcoll_status_t st = gcoll_scratch_bitmap(sc, nrows);
    if (st != GCOLL_OK) {
        free(rn);
        return st;
    }
    if (nrows) /* (an empty tensor has no bitmap: a fuzzer found the memset of nothing) */
        memset(sc->bitmap, 0, ((nrows + 63) / 64) * sizeof(uint64_t));
    size_t nnz = 0;
    for (size_t t = 0; t < keep; t++) {
        sc->bitmap[rn[t].row / 64] |= 1ull << (rn[t].row % 64);
        nnz += GCOLL_MIN(n, rn[t].row * D + D) - rn[t].row * D;
    }
    free(rn);
    GCOLL_CHECK(gcoll_scratch_pairs(sc, nnz));
    size_t o = 0;
    for (size_t r = 0; r < nrows; r++) {
        if (!(sc->bitmap[r / 64] >> (r % 64) & 1))
            continue;
        for (size_t j = r * D; j < GCOLL_MIN(n, r * D + D); j++) {
            sc->idx[o] = (uint32_t)j;
            sc->val[o++] = x[j];
        }
    }
    *nnz_p = nnz;
    return GCOLL_OK;
}
