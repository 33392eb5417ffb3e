/* sparsify.h: index selection for the sparsifiers (top-k exact/sampled, threshold, random-k). */
#ifndef GCOLL_COMPRESS_SELECT_H
#define GCOLL_COMPRESS_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"

/* Each selector leaves ascending indices in sc->idx[0..*nnz_p), their values x[i] in
 * sc->val[0..*nnz_p) (captured by the collecting pass, so nothing gathers them again from
 * the scattered positions), and rejects NaN/Inf input with a logged GCOLL_ERR_INVALID.
 * Exact zeros are never selected. */

/* The k largest |x| (fewer if x has fewer non-zeros); ties go to lower indices. */
gcoll_status_t gcoll_select_topk_exact(const float *x, size_t n, size_t k, gcoll_scratch_t *sc,
                                       size_t *nnz_p);
/* The same selection from e + a*g, the update dst = e + a*g fused into the collecting pass
 * (dst == e: in place; otherwise e is only read, and left as it was on a NaN/Inf).
 * zero: also leave dst = 0 at the returned indices (the residual after sending those
 * values exactly, as f32), setting sc->zeroed when it did (a fallback path may not); every
 * other element ends as e + a*g. */
gcoll_status_t gcoll_select_topk_exact_axpy(float *dst, const float *e, const float *g, float a,
                                            size_t n, size_t k, int zero, gcoll_scratch_t *sc,
                                            size_t *nnz_p);
/* DGC's sampled threshold; usually k, at least 0.9k unless x has fewer non-zeros. */
gcoll_status_t gcoll_select_topk_sample(const float *x, size_t n, size_t k, uint64_t key,
                                        gcoll_scratch_t *sc, size_t *nnz_p);
/* The same selection from e + a*g, with the update dst = e + a*g fused into the collecting
 * pass (the sample is computed from e and g; dst as for the exact form): one pass over e
 * instead of two. Returns the same indices as axpy followed by gcoll_select_topk_sample. */
gcoll_status_t gcoll_select_topk_sample_axpy(float *dst, const float *e, const float *g, float a,
                                             size_t n, size_t k, uint64_t key, int zero,
                                             gcoll_scratch_t *sc, size_t *nnz_p);
/* Top-k (c's selector) of each layer's part of x[0..n), which is elements [off, off + n)
 * of c's tensor (c->nlayers > 1): k = density at step x the part's length, at least 1;
 * ktot is their sum (gcoll_codec_k_range, the call's k). Indices ascending, relative to
 * off; x is only read. */
gcoll_status_t gcoll_select_layers(const gcoll_compressor_t *c, const float *x, size_t off,
                                   size_t n, uint64_t step, size_t ktot, gcoll_scratch_t *sc,
                                   size_t *nnz_p);
/* Every i with |x[i]| bits >= thr; stores at most cap and returns the full count. */
gcoll_status_t gcoll_select_ge(const float *x, size_t n, uint32_t thr, size_t cap,
                               gcoll_scratch_t *sc, size_t *cnt_p);
/* The same after e += a * g, done in the collecting pass. */
gcoll_status_t gcoll_select_ge_axpy(float *e, const float *g, float a, size_t n, uint32_t thr,
                                    size_t cap, gcoll_scratch_t *sc, size_t *cnt_p);
/* Streaming of top-k's collecting pass, for a collective that sends the candidates while
 * the pass goes on (the streamed top-k allreduce). With sc->stream set, the top-k axpy
 * selectors with zero set run their collecting pass over e + a*g in segments of seg
 * elements and call emit after each with the candidates collected there (ascending
 * indices into the whole tensor, their values), before any trim; at most
 * gcoll_select_cand_cap(k) candidates in all. On return, streamed says whether the
 * selection returned is exactly those candidates filtered by the trim rule: keep |v| bits
 * > thr, and of those with |v| bits == thr the first ties (thr 0: keep all). Otherwise
 * (histogram fallback, small tensors) the selection came another way. */
typedef struct gcoll_select_stream {
    size_t seg;
    void (*emit)(void *arg, size_t seg_no, const uint32_t *idx, const float *val, size_t n);
    void *arg;
    int streamed;
    uint32_t thr;
    size_t ties;
} gcoll_select_stream_t;

/* Most candidates the sampled collecting pass keeps for a top-k of k. */
static inline size_t gcoll_select_cand_cap(size_t k)
{
    return 4 * k + 1024;
}

/* Smallest |x| bit pattern among the selected (0xffffffff if none). */
uint32_t gcoll_select_min_abs(const float *val, size_t nnz);

gcoll_status_t gcoll_scratch_bitmap(gcoll_scratch_t *sc, size_t n);

/* codec_rows.c. EF21 encode of random-k (c->ef21, s with a residual): see there. And
 * gcoll_codec_noise_key (codec.c): the key of an encode's rounding noise, from the state's
 * salt, the step and the chunk offset (stateless: a fresh one per call). */
gcoll_status_t gcoll_randomk_ef21_encode(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                         size_t off, const float *in, size_t n, uint64_t step,
                                         const gcoll_encode_opts_t *opt, void *out, size_t cap,
                                         size_t *len_p);
/* rowsparse (codec_rows.c): the elements of x[0..n), viewed as rows of c->row_dim values,
 * that travel, ascending in sc->idx / sc->val: every row with a non-zero value, or with
 * c->density the top ceil(density R) of the R such rows by l2 norm (ties: the lower row).
 * GCOLL_ERR_INVALID on a non-finite value. */
gcoll_status_t gcoll_select_rows(const gcoll_compressor_t *c, const float *x, size_t n,
                                 gcoll_scratch_t *sc, size_t *nnz_p);
uint64_t gcoll_codec_noise_key(uint64_t salt, uint64_t step, size_t off, int stateless);

#endif /* GCOLL_COMPRESS_SELECT_H */
