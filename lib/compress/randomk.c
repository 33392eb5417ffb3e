/* randomk.c: random-k: the indices every rank draws from (seed, step, offset), and EF21's
 * encode for it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/sparsify.h"
#include "compress/values.h"
#include "compress/wire.h"

uint64_t gcoll_randomk_key(const gcoll_compressor_t *c, uint64_t step, size_t off)
{
    uint64_t k = gcoll_mix64(c->seed ^ 0x72616e646f6d6bull);
    k = gcoll_mix64(k + step * 0x9e3779b97f4a7c15ull);
    k = gcoll_mix64(k ^ ((uint64_t)off * 0xd1b54a32d192ed03ull));
    return k ? k : 1; /* 0 marks "no key" on the wire */
}

/* Floyd's algorithm (Bentley & Floyd 1987) draws k distinct indices with exactly k calls
 * to the generator; a bitmap makes membership O(1) and yields them in ascending order.
 * The draws do not depend on the bitmap, so they are made RK_BATCH at a time and the
 * bitmap words they touch prefetched before the batch is applied in order: each is a
 * cache miss otherwise (the bitmap of 25M elements is 3 MiB; 4 ranks, 25M floats,
 * random-k 1%: the draws were 28% of the step's CPU time). */
#define RK_BATCH 32
gcoll_status_t gcoll_randomk_indices(uint64_t key, size_t n, size_t k, uint32_t *idx,
                                     uint64_t *bitmap)
{
    if (k > n || n > 0xffffffffull)
        return GCOLL_ERR_INVALID;
    if (k == 0)
        return GCOLL_OK;
    size_t words = (n + 63) / 64;
    uint64_t *bm = bitmap;
    if (!bm) {
        bm = calloc(words, sizeof(uint64_t));
        if (!bm)
            return GCOLL_ERR_NOMEM;
    } else {
        memset(bm, 0, words * sizeof(uint64_t));
    }
    uint64_t rs = key;
    uint32_t draw[RK_BATCH];
    for (size_t j0 = n - k; j0 < n; j0 += RK_BATCH) {
        size_t m = GCOLL_MIN((size_t)RK_BATCH, n - j0);
        for (size_t q = 0; q < m; q++) {
            draw[q] = (uint32_t)gcoll_rng_below(&rs, (uint64_t)(j0 + q) + 1);
            __builtin_prefetch(&bm[draw[q] >> 6], 1);
        }
        for (size_t q = 0; q < m; q++) {
            size_t t = draw[q];
            if (bm[t >> 6] & (1ull << (t & 63)))
                t = j0 + q;
            bm[t >> 6] |= 1ull << (t & 63);
        }
    }
    size_t o = 0;
    for (size_t w = 0; w < words && o < k; w++) {
        uint64_t v = bm[w];
        while (v) {
            idx[o++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(v));
            v &= v - 1;
        }
    }
    if (!bitmap)
        free(bm);
    return GCOLL_OK;
}

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
    size_t kk = gcoll_codec_call_k(c, s, opt, off, n, step);
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
