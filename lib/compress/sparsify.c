/* sparsify.c: choosing what a sparsifier sends: exact and sampled top-k and threshold
 * (random-k draws its indices in randomk.c). */
#include "compress/sparsify.h"

#include <stdlib.h>
#include <string.h>

#include "compress/kernels.h"
#include "compress/rng.h"

#define ABS_MASK 0x7fffffffu
#define NONFINITE_BIN (0x7f800000u >> 15)
#define HIST_BINS 65536u

/* --- scratch ------------------------------------------------------------------------ */

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    size_t n = want + want / 4 + 64, bytes;
    if (gcoll_mul_size(n, elem, &bytes))
        return -1;
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

gcoll_status_t gcoll_scratch_pairs(gcoll_scratch_t *sc, size_t n)
{
    if (n <= sc->cap_pairs)
        return GCOLL_OK;
    size_t c1 = sc->cap_pairs, c2 = sc->cap_pairs;
    if (grow((void **)&sc->idx, &c1, n, sizeof(uint32_t)) ||
        grow((void **)&sc->val, &c2, n, sizeof(float))) {
        GCOLL_WARN("compress: cannot allocate scratch for %zu pairs", n);
        return GCOLL_ERR_NOMEM;
    }
    sc->cap_pairs = GCOLL_MIN(c1, c2);
    return GCOLL_OK;
}

gcoll_status_t gcoll_scratch_tmp(gcoll_scratch_t *sc, size_t n)
{
    if (grow((void **)&sc->tmp, &sc->cap_tmp, n, sizeof(float))) {
        GCOLL_WARN("compress: cannot allocate %zu scratch floats", n);
        return GCOLL_ERR_NOMEM;
    }
    return GCOLL_OK;
}

static gcoll_status_t scratch_hist(gcoll_scratch_t *sc)
{
    if (!sc->hist && !(sc->hist = malloc(2 * HIST_BINS * sizeof(uint32_t))))
        return GCOLL_ERR_NOMEM;
    return GCOLL_OK;
}

void gcoll_scratch_free(gcoll_scratch_t *sc)
{
    if (sc->layer) {
        gcoll_scratch_free(sc->layer);
        free(sc->layer);
    }
    free(sc->idx);
    free(sc->val);
    free(sc->hist);
    free(sc->samp);
    free(sc->bitmap);
    free(sc->tmp);
    memset(sc, 0, sizeof(*sc));
}

static inline uint32_t absbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & ABS_MASK;
}

static gcoll_status_t report_nonfinite(const float *x, size_t n)
{
    size_t i = gcoll_kernels()->first_bad(x, n);
    GCOLL_WARN("compress: non-finite input %g at element %zu (NaN/Inf cannot be compressed)",
               i < n ? (double)x[i] : 0.0, i);
    return GCOLL_ERR_INVALID;
}

/* --- exact top-k by two-level radix selection ---------------------------------------- */

/*
 * For non-negative floats the order of the bit patterns is the order of the values, so
 * the k-th largest |x| is found by radix selection on |x|'s bits: one histogram of the
 * top 16 bits over the whole tensor finds the bin holding the k-th value, a collection
 * pass keeps everything at or above that bin, and a second histogram of the low 15 bits
 * over that (small) list settles the exact threshold. O(n), no sort. Ties at the
 * threshold go to the lowest indices, so the result is deterministic.
 */
static void topr_in_list(uint32_t *L, float *V, size_t *m_p, size_t r, uint32_t *hist, uint32_t *ab,
                         float *restore, gcoll_select_stream_t *rule)
{
    size_t m = *m_p;
    if (m <= r)
        return;
    /* the candidates' values came with them from the collecting pass: compact passes */
    for (size_t j = 0; j < m; j++)
        ab[j] = absbits(V[j]);
    memset(hist, 0, HIST_BINS * sizeof(uint32_t));
    for (size_t j = 0; j < m; j++)
        hist[ab[j] >> 15]++;
    size_t cum = 0, b = HIST_BINS;
    while (b > 0) {
        b--;
        if (cum + hist[b] >= r)
            break;
        cum += hist[b];
    }
    size_t r1 = r - cum; /* still needed from bin b */
    memset(hist, 0, 32768 * sizeof(uint32_t));
    for (size_t j = 0; j < m; j++)
        if ((ab[j] >> 15) == b)
            hist[ab[j] & 0x7fffu]++;
    size_t cum2 = 0, b2 = 32768;
    while (b2 > 0) {
        b2--;
        if (cum2 + hist[b2] >= r1)
            break;
        cum2 += hist[b2];
    }
    size_t ties = r1 - cum2, out = 0;
    if (rule) { /* keep a > thr, or a == thr while ties last: the test below */
        rule->thr = (uint32_t)(b << 15 | b2);
        rule->ties = ties;
    }
    for (size_t j = 0; j < m; j++) {
        uint32_t a = ab[j];
        uint32_t hi = a >> 15, lo = a & 0x7fffu;
        int keep = hi > b || (hi == b && (lo > b2 || (lo == b2 && ties > 0 && ties--)));
        if (keep) {
            L[out] = L[j];
            V[out++] = V[j];
        } else if (restore) {
            restore[L[j]] = V[j]; /* zeroed by the collecting pass, not sent after all */
        }
    }
    *m_p = out;
}

/* topr_in_list over the scratch's pairs, its |x| buffer from the scratch (the sample
 * buffer, grown to m); restore: the array the collecting pass zeroed, or NULL. */
static gcoll_status_t topr(gcoll_scratch_t *sc, size_t *m_p, size_t r, float *restore,
                           gcoll_select_stream_t *rule)
{
    if (*m_p <= r)
        return GCOLL_OK;
    if (grow((void **)&sc->samp, &sc->cap_samp, *m_p, sizeof(uint32_t)))
        return GCOLL_ERR_NOMEM;
    topr_in_list(sc->idx, sc->val, m_p, r, sc->hist, sc->samp, restore, rule);
    return GCOLL_OK;
}

/* r-th largest (1-based) of a[0..m), reordering a. Hoare quickselect, median of three. */
static uint32_t kth_largest(uint32_t *a, size_t m, size_t r)
{
    size_t lo = 0, hi = m - 1, want = r - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t x = a[lo], y = a[mid], z = a[hi];
        uint32_t piv = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        size_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv)
                i++;
            while (a[j] < piv)
                j--;
            if (i <= j) {
                uint32_t t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return a[want];
    }
    return a[want];
}

/* Small tensors: quickselect on a copy of |x| bits, then one collection pass; avoids
 * clearing the 512 KiB of histograms the radix path needs. */
#define SMALL_N 16384
static gcoll_status_t topk_small(const float *x, size_t n, size_t k, gcoll_scratch_t *sc,
                                 size_t *nnz_p)
{
    if (grow((void **)&sc->samp, &sc->cap_samp, n, sizeof(uint32_t)))
        return GCOLL_ERR_NOMEM;
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        sc->samp[i] = absbits(x[i]);
        mx = sc->samp[i] > mx ? sc->samp[i] : mx;
    }
    if (mx >= 0x7f800000u)
        return report_nonfinite(x, n);
    uint32_t t = kth_largest(sc->samp, n, k);
    GCOLL_CHECK(gcoll_scratch_pairs(sc, n));
    int bad = 0;
    size_t cnt = gcoll_kernels()->collect_ge(x, n, t ? t : 1u, sc->idx, sc->val, n, &bad);
    size_t gt = 0;
    for (size_t j = 0; j < cnt; j++)
        gt += absbits(sc->val[j]) > t;
    size_t ties = k > gt ? k - gt : 0, out = 0;
    for (size_t j = 0; j < cnt; j++) {
        uint32_t a = absbits(sc->val[j]);
        if (a > t || (a == t && ties > 0 && ties--)) {
            sc->idx[out] = sc->idx[j];
            sc->val[out++] = sc->val[j];
        }
    }
    *nnz_p = out;
    return GCOLL_OK;
}

/* Exact top-k by the histogram of the top 16 bits (one pass), a collection pass and the
 * exact trim of the collected list. */
static gcoll_status_t topk_hist(const float *x, size_t n, size_t k, gcoll_scratch_t *sc,
                                size_t *nnz_p)
{
    if (k == 0 || n == 0) {
        *nnz_p = 0;
        return GCOLL_OK;
    }
    if (n <= SMALL_N)
        return topk_small(x, n, k, sc, nnz_p);
    GCOLL_CHECK(scratch_hist(sc));
    uint32_t *hist = sc->hist;
    memset(hist, 0, 2 * HIST_BINS * sizeof(uint32_t));
    const gcoll_kernels_t *kn = gcoll_kernels();
    kn->hist16(x, n, hist);
    for (uint32_t b = NONFINITE_BIN; b < HIST_BINS; b++)
        if (hist[b])
            return report_nonfinite(x, n);
    size_t cum = 0;
    uint32_t b = NONFINITE_BIN;
    while (b > 0) {
        b--;
        cum += hist[b];
        if (cum >= k)
            break;
    }
    uint32_t thr = b << 15;
    thr = thr ? thr : 1u; /* zeros are never sent */
    GCOLL_CHECK(gcoll_scratch_pairs(sc, cum));
    int bad = 0;
    size_t cnt = kn->collect_ge(x, n, thr, sc->idx, sc->val, cum, &bad);
    if (cnt > cum || bad)
        return GCOLL_ERR_INTERNAL; /* the histogram said otherwise */
    GCOLL_CHECK(topr(sc, &cnt, k, NULL, NULL));
    *nnz_p = cnt;
    return GCOLL_OK;
}

/* --- sampled top-k (DGC) -------------------------------------------------------------- */

/* The fused update-and-collect pass (zeroing what it stores) segment by segment, handing
 * each segment's candidates to rule->emit; the same stores and count as one kernel call. */
static size_t collect_streamed(float *dst, const float *e, const float *g, size_t n, float a,
                               uint32_t thr, gcoll_scratch_t *sc, size_t cap, int *bad,
                               gcoll_select_stream_t *rule)
{
    const gcoll_kernels_t *kn = gcoll_kernels();
    size_t cnt = 0, seg = rule->seg ? rule->seg : n;
    for (size_t off = 0, s = 0; off < n; off += seg, s++) {
        size_t len = GCOLL_MIN(seg, n - off), at = GCOLL_MIN(cnt, cap), room = cap - at;
        size_t got = kn->axpy_collect_ge(dst + off, e + off, g + off, len, a, thr, sc->idx + at,
                                         sc->val + at, room, bad, 1);
        size_t kept = GCOLL_MIN(got, room);
        for (size_t j = at; j < at + kept; j++)
            sc->idx[j] += (uint32_t)off;
        rule->emit(rule->arg, s, sc->idx + at, sc->val + at, kept);
        cnt += got;
    }
    return cnt;
}

/*
 * DGC's sampled threshold (Lin et al. 2018, sec. 4.4 "sampling"): estimate the k-th
 * largest |x| from a 0.25% stratified sample (at least 4096 elements; DGC samples
 * 0.1-1%), collect everything above it in one streaming pass, and if that overshoots run
 * the exact selection on the (small) candidate list, whose values the collecting pass
 * kept. The sample rank is padded by 10% and three standard deviations, so undershooting
 * (which would need a second pass) is rare; when it happens by more than 10% the
 * histogram path runs. The padding costs only candidates: the trim keeps the same top k.
 * A 1% sample with 30% padding measured 27 ms against 19-20 ms for 26M floats on one core
 * (the sample's scattered reads cost more than the larger candidate list).
 *
 * Exact top-k runs the same way: whenever at least k values were collected, every value
 * at or above the k-th largest is among them, so the trim returns exactly the top k (ties
 * to the lowest indices, as the histogram path); only when fewer than k were collected
 * does it take the histogram path. One streaming pass instead of two (the histogram pass
 * costs a scalar increment per element: 17 ms for 26M floats here, more than the
 * collecting pass).
 */
#define SAMPLE_PF 16

/* dst = e + a*g (dst == e: in place) */
static void axpy_to(float *dst, const float *e, const float *g, size_t n, float a)
{
    if (dst != e)
        memcpy(dst, e, n * sizeof(float));
    gcoll_kernels()->axpy(dst, g, n, a);
}

/* Top-k by a sampled threshold, trimmed to exactly k (exact: the histogram path whenever
 * fewer than k were collected; else down to 0.9k accepted), of x, or, with g != NULL, of
 * e + a*g with the update fused into the collecting pass, which stores it in dst (dst == e:
 * in place; the sample is computed on the fly from e and g: e + a*g rounds as the axpy
 * kernels do, no contraction, so both forms select the same indices; x is then dst). With
 * dst != e, e is only read: a NaN/Inf in the sum fails the call with e as it was. */
static gcoll_status_t topk_sample(const float *x, float *dst, const float *e, const float *g,
                                  float a, size_t n, size_t k, uint64_t key, int exact, int zero,
                                  gcoll_scratch_t *sc, size_t *nnz_p)
{
    if (g)
        x = dst;
    sc->zeroed = 0;
    if (sc->stream)
        sc->stream->streamed = 0;
    size_t m = GCOLL_MAX(n / 400, GCOLL_MIN(n, (size_t)4096));
    if (k == 0 || n == 0 || k * 4 >= n || m >= n) {
        if (g)
            axpy_to(dst, e, g, n, a);
        return topk_hist(x, n, k, sc, nnz_p);
    }
    if (grow((void **)&sc->samp, &sc->cap_samp, m, sizeof(uint32_t)))
        return GCOLL_ERR_NOMEM;
    size_t stride = n / m;
    uint64_t rs = key;
    /* the positions first (n < 2^32), then the scattered reads with the ones SAMPLE_PF
     * ahead prefetched: each is a cache miss, and only a few overlap otherwise */
    for (size_t j = 0; j < m; j++)
        sc->samp[j] = (uint32_t)(j * stride + (size_t)gcoll_rng_below(&rs, stride));
    const float *xs = g ? e : x; /* what the sample reads (with g + a*g) */
    for (size_t j = 0; j < m; j++) {
        if (j + SAMPLE_PF < m) {
            __builtin_prefetch(xs + sc->samp[j + SAMPLE_PF]);
            if (g)
                __builtin_prefetch(g + sc->samp[j + SAMPLE_PF]);
        }
        size_t i = sc->samp[j];
        sc->samp[j] = absbits(g ? e[i] + a * g[i] : xs[i]);
    }
    double ks = (double)k * (double)m / (double)n;
    size_t rank = (size_t)(ks * 1.1 + 3.0 * __builtin_sqrt(ks) + 2.0);
    rank = GCOLL_MIN(rank, m);
    uint32_t thr = kth_largest(sc->samp, m, rank);
    if (thr >= 0x7f800000u) {
        if (!g)
            return report_nonfinite(x, n);
        /* e is untouched: the culprit is in the sum */
        GCOLL_WARN("compress: non-finite value in the residual plus the input (NaN/Inf "
                   "cannot be compressed)");
        return GCOLL_ERR_INVALID;
    }
    thr = thr ? thr : 1u;
    size_t cap = gcoll_select_cand_cap(k);
    GCOLL_CHECK(gcoll_scratch_pairs(sc, cap));
    int bad = 0;
    zero = zero && g;
    gcoll_select_stream_t *rule = zero ? sc->stream : NULL;
    size_t cnt = rule ? collect_streamed(dst, e, g, n, a, thr, sc, cap, &bad, rule)
                 : g ? gcoll_kernels()->axpy_collect_ge(dst, e, g, n, a, thr, sc->idx, sc->val, cap,
                                                        &bad, zero)
                     : gcoll_kernels()->collect_ge(x, n, thr, sc->idx, sc->val, cap, &bad);
    int fallback = cnt > cap || (cnt < (exact ? k : k - k / 10) && thr > 1);
    gcoll_status_t st = GCOLL_OK;
    if (!bad && !fallback) { /* the trim's buffers, so that it cannot fail once it starts */
        st = scratch_hist(sc);
        if (st == GCOLL_OK && grow((void **)&sc->samp, &sc->cap_samp, cnt, sizeof(uint32_t)))
            st = GCOLL_ERR_NOMEM;
    }
    if (zero && (bad || fallback || st != GCOLL_OK)) /* x back to e + a*g everywhere */
        for (size_t j = 0; j < GCOLL_MIN(cnt, cap); j++)
            dst[sc->idx[j]] = sc->val[j];
    if (bad)
        return report_nonfinite(x, n);
    if (fallback) {
        GCOLL_DEBUG(GCOLL_SUBSYS_COMPRESS,
                    "compress: sampled threshold collected %zu for "
                    "k = %zu: histogram pass",
                    cnt, k);
        return topk_hist(x, n, k, sc, nnz_p);
    }
    GCOLL_CHECK(st);
    if (rule) { /* no trim: keep every candidate */
        rule->thr = 0;
        rule->ties = 0;
    }
    GCOLL_CHECK(topr(sc, &cnt, k, zero ? dst : NULL, rule));
    if (rule)
        rule->streamed = 1;
    sc->zeroed = zero;
    *nnz_p = cnt;
    return GCOLL_OK;
}

gcoll_status_t gcoll_select_topk_sample(const float *x, size_t n, size_t k, uint64_t key,
                                        gcoll_scratch_t *sc, size_t *nnz_p)
{
    /* without g, x is only read */
    return topk_sample(x, NULL, NULL, NULL, 0, n, k, key, 0, 0, sc, nnz_p);
}

gcoll_status_t gcoll_select_topk_sample_axpy(float *dst, const float *e, const float *g, float a,
                                             size_t n, size_t k, uint64_t key, int zero,
                                             gcoll_scratch_t *sc, size_t *nnz_p)
{
    return topk_sample(NULL, dst, e, g, a, n, k, key, 0, zero, sc, nnz_p);
}

/* The sample only guides the work in the exact forms: any fixed key will do. */
#define EXACT_KEY 0x6578616374ull

gcoll_status_t gcoll_select_topk_exact(const float *x, size_t n, size_t k, gcoll_scratch_t *sc,
                                       size_t *nnz_p)
{
    return topk_sample(x, NULL, NULL, NULL, 0, n, k, EXACT_KEY, 1, 0, sc, nnz_p);
}

gcoll_status_t gcoll_select_topk_exact_axpy(float *dst, const float *e, const float *g, float a,
                                            size_t n, size_t k, int zero, gcoll_scratch_t *sc,
                                            size_t *nnz_p)
{
    return topk_sample(NULL, dst, e, g, a, n, k, EXACT_KEY, 1, zero, sc, nnz_p);
}

/* --- per layer ------------------------------------------------------------------------ */

/*
 * Selection per layer inside a fused bucket: DGC "performs the selection independently
 * per layer" (Lin et al. 2018); one top-k across layers of different gradient scales
 * starves the small ones (a bias or a late layer can go for many steps with nothing
 * sent). Each layer's part of x takes k = density x its length (at least 1) by the
 * compressor's own selector (sampled or exact; select=reuse selects exactly, its
 * threshold being one per tensor); the bucket still travels as one message.
 */
gcoll_status_t gcoll_select_layers(const gcoll_compressor_t *c, const float *x, size_t off,
                                   size_t n, uint64_t step, size_t ktot, gcoll_scratch_t *sc,
                                   size_t *nnz_p)
{
    if (!sc->layer && !(sc->layer = calloc(1, sizeof(*sc->layer))))
        return GCOLL_ERR_NOMEM;
    gcoll_scratch_t *sub = sc->layer;
    GCOLL_CHECK(gcoll_scratch_pairs(sc, ktot));
    size_t nnz = 0, a, b;
    for (size_t j = 0; j < c->nlayers; j++) {
        if (!gcoll_codec_layer_part(c, j, off, n, &a, &b))
            continue;
        size_t len = b - a, k = gcoll_codec_k(c, len, step), got = 0;
        const float *xl = x + (a - off);
        /* the sample keyed as a tensor of its own would key it (offset in the layer), so a
         * fused bucket selects what one bucket per tensor selects */
        size_t lo = j ? c->layer_end[j - 1] : 0;
        if (c->select == GCOLL_SELECT_SAMPLE)
            GCOLL_CHECK(gcoll_select_topk_sample(xl, len, k, gcoll_mix64(step + (a - lo) * 31 + 7),
                                                 sub, &got));
        else
            GCOLL_CHECK(gcoll_select_topk_exact(xl, len, k, sub, &got));
        if (got > k || nnz + got > sc->cap_pairs)
            return GCOLL_ERR_INTERNAL;
        for (size_t q = 0; q < got; q++) {
            sc->idx[nnz + q] = sub->idx[q] + (uint32_t)(a - off);
            sc->val[nnz + q] = sub->val[q];
        }
        nnz += got;
    }
    sc->zeroed = 0;
    *nnz_p = nnz;
    return GCOLL_OK;
}

/* --- threshold and reuse ------------------------------------------------------------- */

gcoll_status_t gcoll_select_ge(const float *x, size_t n, uint32_t thr, size_t cap,
                               gcoll_scratch_t *sc, size_t *cnt_p)
{
    GCOLL_CHECK(gcoll_scratch_pairs(sc, cap));
    int bad = 0;
    size_t cnt = gcoll_kernels()->collect_ge(x, n, thr ? thr : 1u, sc->idx, sc->val, cap, &bad);
    if (bad)
        return report_nonfinite(x, n);
    *cnt_p = cnt;
    return GCOLL_OK;
}

gcoll_status_t gcoll_select_ge_axpy(float *e, const float *g, float a, size_t n, uint32_t thr,
                                    size_t cap, gcoll_scratch_t *sc, size_t *cnt_p)
{
    GCOLL_CHECK(gcoll_scratch_pairs(sc, cap));
    int bad = 0;
    size_t cnt = gcoll_kernels()->axpy_collect_ge(e, e, g, n, a, thr ? thr : 1u, sc->idx, sc->val,
                                                  cap, &bad, 0);
    if (bad)
        return report_nonfinite(e, n);
    *cnt_p = cnt;
    return GCOLL_OK;
}

uint32_t gcoll_select_min_abs(const float *val, size_t nnz)
{
    uint32_t mn = 0xffffffffu;
    for (size_t j = 0; j < nnz; j++) {
        uint32_t a = absbits(val[j]);
        mn = a < mn ? a : mn;
    }
    return mn;
}

gcoll_status_t gcoll_scratch_bitmap(gcoll_scratch_t *sc, size_t n)
{
    if (grow((void **)&sc->bitmap, &sc->cap_bitmap, (n + 63) / 64, sizeof(uint64_t)))
        return GCOLL_ERR_NOMEM;
    return GCOLL_OK;
}
