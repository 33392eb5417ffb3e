/* codec_rows.c: embedding rows (rowsparse), the sparsifier beside top-k. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/sparsify.h"
#include "compress/values.h"
#include "compress/wire.h"

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
