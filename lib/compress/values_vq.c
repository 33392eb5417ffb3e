/* values_vq.c: vector quantization (vq:dim=D,bits=B): a per-tensor codebook of 2^B vectors
 * learned by Lloyd iterations on a sample, warm-started, sent with the message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/kernels.h"
#include "compress/values.h"
#include "compress/wire.h"

/*
 * The tensor is cut into vectors of D values (the last padded with zeros), each replaced
 * by the index of the nearest of K = 2^B codewords: B/D bits a value plus the codebook
 * (4 K D bytes). The codebook is learned per message by Lloyd's algorithm (k-means) on a
 * strided sample of at most VQ_SAMPLE vectors, started from the state's codebook of the
 * last step (warm start, VQ_WARM iterations) or from sample vectors (VQ_COLD iterations).
 * Codeword 0 is kept at zero, so every vector's error is at most its norm (nearest is never
 * further than zero): a contraction, and error feedback applies. This is the deterministic
 * vector quantizer of the VQ-SGD line (Gandikota, Kane, Maity, Mazumdar 2019, "vqSGD"),
 * which uses fixed codebooks; the learned, data-dependent codebook follows Lloyd (1982) /
 * the k-means of product-quantization practice (Jegou, Douze, Schmid 2011).
 */
#define VQ_SAMPLE 4096
#define VQ_COLD 6
#define VQ_WARM 2

static float vec_at(const float *x, size_t n, size_t v, size_t D, size_t j)
{
    size_t i = v * D + j;
    return i < n ? x[i] : 0.0f;
}

/* The codebook transposed to doubles, bt[j * K + k] = book[k * D + j], so that the
 * distances to all K codewords are computed together, a loop over k that the compiler
 * vectorises. */
static void transpose(const float *book, double *bt, size_t D, uint32_t K)
{
    for (uint32_t k = 0; k < K; k++)
        for (size_t j = 0; j < D; j++)
            bt[j * K + k] = book[(size_t)k * D + j];
}

/* Index of the codeword nearest to vector v: the first k whose squared distance, summed in
 * double over j in order, is below every earlier one's, codeword 0 (zero) first, so that no
 * vector is further from its codeword than from zero. dd: K doubles of scratch. */
static uint32_t nearest(const float *x, size_t n, size_t v, size_t D, const double *bt, uint32_t K,
                        double *restrict dd)
{
    for (uint32_t k = 0; k < K; k++)
        dd[k] = 0;
    const int whole = (v + 1) * D <= n;
    for (size_t j = 0; j < D; j++) {
        const double t = whole ? x[v * D + j] : vec_at(x, n, v, D, j);
        const double *restrict c = bt + j * K;
        for (uint32_t k = 0; k < K; k++) {
            const double e = t - c[k];
            dd[k] += e * e;
        }
    }
    uint32_t best = 0;
    double bd = dd[0];
    for (uint32_t k = 1; k < K; k++)
        if (dd[k] < bd) {
            bd = dd[k];
            best = k;
        }
    return best;
}

gcoll_status_t gcoll_vq_put(const gcoll_vspec_t *vs, const float *x, size_t n, float **book_p,
                            uint8_t *out)
{
    if (n == 0)
        return GCOLL_OK;
    size_t bad = gcoll_kernels()->first_bad(x, n);
    if (bad < n) {
        GCOLL_WARN("compress: vq: non-finite input %g at element %zu", (double)x[bad], bad);
        return GCOLL_ERR_INVALID;
    }
    const size_t D = vs->bucket, nvec = (n + D - 1) / D;
    const uint32_t K = 1u << vs->bits;
    const size_t S = nvec < VQ_SAMPLE ? nvec : VQ_SAMPLE;
    float *book = malloc((size_t)K * D * sizeof(float));
    double *sum = malloc((size_t)K * D * sizeof(double));
    double *bt = malloc((size_t)K * D * sizeof(double)), *dd = malloc(K * sizeof(double));
    size_t *cnt = malloc(K * sizeof(size_t));
    if (!book || !sum || !bt || !dd || !cnt) {
        free(book);
        free(sum);
        free(bt);
        free(dd);
        free(cnt);
        return GCOLL_ERR_NOMEM;
    }
    int warm = book_p && *book_p;
    if (warm) {
        memcpy(book, *book_p, (size_t)K * D * sizeof(float));
    } else { /* codewords from sample vectors spread over the tensor */
        for (uint32_t k = 1; k < K; k++)
            for (size_t j = 0; j < D; j++)
                book[(size_t)k * D + j] = vec_at(x, n, (size_t)k * nvec / K, D, j);
    }
    memset(book, 0, D * sizeof(float)); /* codeword 0: zero, the contraction's guarantee */
    for (int it = 0; it < (warm ? VQ_WARM : VQ_COLD); it++) {
        memset(sum, 0, (size_t)K * D * sizeof(double));
        memset(cnt, 0, K * sizeof(size_t));
        transpose(book, bt, D, K);
        for (size_t s = 0; s < S; s++) {
            size_t v = s * nvec / S;
            uint32_t k = nearest(x, n, v, D, bt, K, dd);
            cnt[k]++;
            for (size_t j = 0; j < D; j++)
                sum[(size_t)k * D + j] += vec_at(x, n, v, D, j);
        }
        for (uint32_t k = 1; k < K; k++) /* an empty cell keeps its codeword */
            if (cnt[k])
                for (size_t j = 0; j < D; j++)
                    book[(size_t)k * D + j] = (float)(sum[(size_t)k * D + j] / (double)cnt[k]);
    }
    memcpy(out, book, (size_t)K * D * sizeof(float));
    uint8_t *codes = out + (size_t)K * D * sizeof(float);
    memset(codes, 0, (nvec * vs->bits + 7) / 8);
    transpose(book, bt, D, K);
    for (size_t v = 0; v < nvec; v++) {
        uint32_t k = nearest(x, n, v, D, bt, K, dd);
        size_t bit = v * vs->bits;
        uint32_t w = k << (bit % 8);
        codes[bit / 8] |= (uint8_t)w;
        if (bit % 8 + vs->bits > 8)
            codes[bit / 8 + 1] |= (uint8_t)(w >> 8);
    }
    if (book_p) {
        if (!*book_p)
            *book_p = book;
        else {
            memcpy(*book_p, book, (size_t)K * D * sizeof(float));
            free(book);
        }
    } else {
        free(book);
    }
    free(sum);
    free(bt);
    free(dd);
    free(cnt);
    return GCOLL_OK;
}

static uint32_t code_at(const uint8_t *codes, unsigned B, size_t v)
{
    size_t bit = v * B;
    uint32_t w = codes[bit / 8];
    if (bit % 8 + B > 8)
        w |= (uint32_t)codes[bit / 8 + 1] << 8;
    return (w >> (bit % 8)) & ((1u << B) - 1u);
}

gcoll_status_t gcoll_vq_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n)
{
    if (n == 0)
        return GCOLL_OK;
    const size_t D = vs->bucket, nvec = (size_t)((n + D - 1) / D);
    const size_t nb = ((size_t)1 << vs->bits) * D;
    for (size_t i = 0; i < nb; i++) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        if (!isfinite(f)) {
            GCOLL_WARN("compress: malformed message: vq codebook value %zu is %g", i, (double)f);
            return GCOLL_ERR_INVALID;
        }
    }
    size_t bits = nvec * vs->bits;
    if (bits % 8 && (p[4 * nb + bits / 8] >> (bits % 8))) {
        GCOLL_WARN("compress: malformed message: vq padding bits set");
        return GCOLL_ERR_INVALID;
    }
    return GCOLL_OK;
}

void gcoll_vq_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n, size_t start,
                          size_t m, float *out, int mode)
{
    (void)n;
    const size_t D = vs->bucket, nb = ((size_t)1 << vs->bits) * D;
    const uint8_t *codes = p + 4 * nb;
    const size_t end = start + m;
    for (size_t i = start; i < end;) { /* one codeword per vector: its index read once */
        const size_t v = i / D, stop = (v + 1) * D < end ? (v + 1) * D : end;
        const uint8_t *cw = p + 4 * ((size_t)code_at(codes, vs->bits, v) * D);
        for (size_t j = i % D; i < stop; i++, j++) {
            float c;
            memcpy(&c, cw + 4 * j, 4);
            float *o = out + (i - start);
            if (mode == GCOLL_DECODE_SET)
                *o = c;
            else if (mode == GCOLL_DECODE_ADD)
                *o += c;
            else
                *o -= c;
        }
    }
}
