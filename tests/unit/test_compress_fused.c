/* test_compress_fused.c: the fused error-feedback kernels (scan, axpy, selection, QSGD
 * codes, put) give the same bits as the unfused passes, and their NaN/Inf checks. Split from
 * test_compress_ef.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress.h"
#include "compress/kernels.h"
#include "compress/rng.h"
#include "compress/values.h"
#include "compress/wire.h"
#include "base/half.h"

#include "compress_test_util.h"

/* --- fused feedback kernels: the same bits as the unfused passes ------------------------ */

/* Sizes around the fused block (4096), the eight lanes and the 64-element runs. */
static const size_t fused_sizes[] = {0, 1, 2, 7, 8, 9, 63, 65, 1000, 4095, 4097, 8200, 20011};
#define N_FUSED_SIZES (sizeof(fused_sizes) / sizeof(*fused_sizes))
static const float fused_a[] = {1.0f, 0.37f};

static void fill_state(float *e, float *g, size_t n, uint64_t seed)
{
    fill(g, n, seed);
    fill(e, n, seed + 1000);
    for (size_t i = 0; i < n; i++)
        e[i] *= 0.25f;
}

static void test_fused_axpy_collect_ge(void **unused)
{
    (void)unused;
    const size_t nmax = 20011;
    float *g = malloc(nmax * 4), *e0 = malloc(nmax * 4), *er = malloc(nmax * 4);
    float *ef = malloc(nmax * 4);
    uint32_t *ir = malloc(nmax * 4), *iff = malloc(nmax * 4), *igen = malloc(nmax * 4);
    float *vr = malloc(nmax * 4), *vf = malloc(nmax * 4), *vz = malloc(nmax * 4);
    float *ez = malloc(nmax * 4), *eo = malloc(nmax * 4), *vo = malloc(nmax * 4);
    float *od = aligned_alloc(64, GCOLL_DIV_UP((nmax + 16) * 4, 64) * 64);
    uint32_t *iz = malloc(nmax * 4), *io = malloc(nmax * 4);
    const uint32_t thrs[] = {1u, 0x3c000000u /* 2^-7 */, 0x3f000000u /* 0.5 */};
    for (size_t zi = 0; zi < N_FUSED_SIZES; zi++)
        for (int ai = 0; ai < 2; ai++)
            for (int ti = 0; ti < 3; ti++) {
                size_t n = fused_sizes[zi], cgen = 0;
                fill_state(e0, g, n, 23 + zi);
                FOR_EACH_SIMD(lvl)
                {
                    const gcoll_kernels_t *k = gcoll_kernels();
                    size_t cap = ti == 1 ? n / 3 : n; /* also when the room runs out */
                    int badr = 0, badf = 0;
                    memcpy(er, e0, n * 4);
                    k->axpy(er, g, n, fused_a[ai]);
                    size_t cr = k->collect_ge(er, n, thrs[ti], ir, vr, cap, &badr);
                    memcpy(ef, e0, n * 4);
                    size_t cf = k->axpy_collect_ge(ef, ef, g, n, fused_a[ai], thrs[ti], iff, vf,
                                                   cap, &badf, 0);
                    assert_int_equal(cr, cf);
                    assert_int_equal(badr, badf);
                    assert_memory_equal(er, ef, n * 4);
                    assert_memory_equal(ir, iff, GCOLL_MIN(cr, cap) * 4);
                    /* the values come with the indices: what the updated e holds there */
                    size_t ns = 0;
                    for (size_t i = 0; i < n; i++) {
                        uint32_t a;
                        memcpy(&a, &ef[i], 4);
                        if ((a & 0x7fffffffu) < thrs[ti])
                            continue;
                        assert_true(ns >= cap || iff[ns] == i);
                        if (ns < cap)
                            assert_memory_equal(&vf[ns], &ef[i], 4);
                        ns++;
                    }
                    assert_int_equal(ns, cf);
                    assert_memory_equal(vr, vf, GCOLL_MIN(cr, cap) * 4);
                    /* zero: the same, and e = 0 exactly where an index was stored */
                    memcpy(ez, e0, n * 4);
                    int badz = 0;
                    size_t cz = k->axpy_collect_ge(ez, ez, g, n, fused_a[ai], thrs[ti], iz, vz, cap,
                                                   &badz, 1);
                    assert_int_equal(cz, cf);
                    assert_memory_equal(iz, iff, GCOLL_MIN(cf, cap) * 4);
                    assert_memory_equal(vz, vf, GCOLL_MIN(cf, cap) * 4);
                    for (size_t j = 0; j < GCOLL_MIN(cf, cap); j++) {
                        assert_true(ez[iz[j]] == 0.0f && !signbit(ez[iz[j]]));
                        ez[iz[j]] = vz[j];
                    }
                    assert_memory_equal(ez, ef, n * 4);
                    /* out of place (the folded check's spare; streaming stores from dst's
                     * first 32-byte boundary, so every misalignment): dst as e was in
                     * place, e only read */
                    for (int zero = 0; zero < 2; zero++) {
                        float *dst = od + (zi + (size_t)ai + (size_t)ti + (size_t)zero) % 8;
                        int bado = 0;
                        memcpy(eo, e0, n * 4);
                        size_t co = k->axpy_collect_ge(dst, eo, g, n, fused_a[ai], thrs[ti], io, vo,
                                                       cap, &bado, zero);
                        assert_int_equal(co, cf);
                        assert_int_equal(bado, badf);
                        assert_memory_equal(io, iff, GCOLL_MIN(cf, cap) * 4);
                        assert_memory_equal(vo, vf, GCOLL_MIN(cf, cap) * 4);
                        assert_memory_equal(eo, e0, n * 4);
                        if (zero)
                            for (size_t j = 0; j < GCOLL_MIN(co, cap); j++) {
                                assert_true(dst[io[j]] == 0.0f && !signbit(dst[io[j]]));
                                dst[io[j]] = vo[j];
                            }
                        assert_memory_equal(dst, ef, n * 4);
                    }
                    if (lvl_i == 0) {
                        cgen = cf;
                        memcpy(igen, iff, GCOLL_MIN(cf, cap) * 4);
                    } else {
                        assert_int_equal(cgen, cf);
                        assert_memory_equal(igen, iff, GCOLL_MIN(cf, cap) * 4);
                    }
                }
            }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(e0), free(er), free(ef), free(ir), free(iff), free(igen), free(vr), free(vf);
    free(vz), free(ez), free(iz), free(eo), free(vo), free(od), free(io);
}

/* NaN/Inf reaching the fused pass (in the gradient, or from e + g overflowing), in place
 * and out of place at every misalignment, in the first elements (the streaming form's
 * scalar head), a vector block and the tail: flagged, taken like any hit, e only read out
 * of place; with only non-finite values at the threshold and no room (random-k's check),
 * counted without a store. */
static void test_fused_nonfinite(void **unused)
{
    (void)unused;
    const size_t n = 1037, pos[] = {0, 3, 520, 1036};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    float *g = malloc(n * 4), *e0 = malloc(n * 4), *e = malloc(n * 4), *val = malloc(n * 4);
    float *od = aligned_alloc(64, GCOLL_DIV_UP((n + 8) * 4, 64) * 64);
    uint32_t *idx = malloc(n * 4);
    FOR_EACH_SIMD(lvl)
    {
        const gcoll_kernels_t *k = gcoll_kernels();
        for (size_t pi = 0; pi < 4; pi++)
            for (int bi = 0; bi < 4; bi++)
                for (size_t mis = 0; mis < 9; mis++) { /* 8: in place */
                    fill_state(e0, g, n, 77 + pi);
                    if (bi < 3)
                        g[pos[pi]] = bad[bi];
                    else { /* finite, but the sum overflows */
                        e0[pos[pi]] = 3e38f;
                        g[pos[pi]] = 3e38f;
                    }
                    memcpy(e, e0, n * 4);
                    float *dst = mis == 8 ? e : od + mis;
                    int badf = 0;
                    size_t c =
                        k->axpy_collect_ge(dst, e, g, n, 1.0f, 0x3f000000u, idx, val, n, &badf, 1);
                    assert_true(badf);
                    size_t j = 0;
                    while (j < c && idx[j] != pos[pi])
                        j++;
                    assert_true(j < c);
                    assert_true(isinf(val[j]) || isnan(val[j]));
                    if (mis < 8)
                        assert_memory_equal(e, e0, n * 4);
                    /* random-k's check: non-finite only, nothing stored */
                    memcpy(e, e0, n * 4);
                    badf = 0;
                    dst = mis == 8 ? e : od + mis;
                    c = k->axpy_collect_ge(dst, e, g, n, 1.0f, 0x7f800000u, NULL, NULL, 0, &badf,
                                           0);
                    assert_int_equal(c, 1);
                    assert_true(badf);
                    if (mis < 8)
                        assert_memory_equal(e, e0, n * 4);
                }
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(e0), free(e), free(val), free(od), free(idx);
}

/* The input check folded into top-k's and random-k's feedback pass (GCOLL_NANCHECK_FOLD, as the
 * compressed allreduce asks): the same bytes and residual as the scan-first encode, step after step
 * (the residual then lives in the other buffer: the swap), and on NaN/Inf anywhere an
 * error with the residual as it was, in place. */
static void test_folded_check(void **unused)
{
    (void)unused;
    static const char *specs[] = {"topk:density=0.01",
                                  "topk:density=0.01,select=sample",
                                  "topk:density=0.001+q8",
                                  "topk:density=0.3",
                                  "topk:density=0.01+fp16",
                                  "randomk:density=0.01,seed=5,feedback=ef",
                                  "randomk:density=0.02,seed=5,feedback=ef+q8"};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const size_t n = 200003, pos[] = {0, 7, 100001, n - 1};
    float *x = malloc(n * 4), *e = malloc(n * 4);
    const gcoll_encode_opts_t fold = {.check = GCOLL_NANCHECK_FOLD};
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *sf, *sp_;
        assert_int_equal(gcoll_state_create(c, n, &sf), GCOLL_OK);
        assert_int_equal(gcoll_state_create(c, n, &sp_), GCOLL_OK);
        assert_true(gcoll_codec_folds_check(c, sf, n));
        size_t cap = gcoll_compressor_bound(c, n), lf, lp;
        uint8_t *bf = malloc(cap), *bp = malloc(cap);
        for (uint64_t step = 0; step < 3; step++) {
            fill(x, n, 40 + step);
            const float *before = gcoll_state_residual(sf);
            assert_int_equal(gcoll_codec_encode_range(c, sf, 0, x, n, step, &fold, bf, cap, &lf),
                             GCOLL_OK);
            assert_int_equal(gcoll_codec_encode_range(c, sp_, 0, x, n, step, NULL, bp, cap, &lp),
                             GCOLL_OK);
            assert_int_equal(lf, lp);
            assert_memory_equal(bf, bp, lf);
            assert_ptr_not_equal(gcoll_state_residual(sf), before);
            assert_memory_equal(gcoll_state_residual(sf), gcoll_state_residual(sp_), n * 4);
        }
        for (int bi = 0; bi < 3; bi++)
            for (size_t pi = 0; pi < sizeof(pos) / sizeof(*pos); pi++) {
                fill(x, n, 50);
                x[pos[pi]] = bad[bi];
                const float *before = gcoll_state_residual(sf);
                memcpy(e, before, n * 4);
                assert_int_equal(gcoll_codec_encode_range(c, sf, 0, x, n, 3, &fold, bf, cap, &lf),
                                 GCOLL_ERR_INVALID);
                assert_ptr_equal(gcoll_state_residual(sf), before);
                assert_memory_equal(e, before, n * 4);
            }
        /* part of the tensor (a chunk): no folding, the scan-first path */
        assert_false(gcoll_codec_folds_check(c, sf, n - 1));
        free(bf);
        free(bp);
        gcoll_state_destroy(sf);
        gcoll_state_destroy(sp_);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
    free(e);
}

/* The sign scale's sum from the fused pass, split at multiples of 8 as chunks are, equals
 * the sum sign_put returns over the updated residual. */
static void test_fused_axpy_abssum(void **unused)
{
    (void)unused;
    const size_t nmax = 20011;
    float *g = malloc(nmax * 4), *e0 = malloc(nmax * 4), *er = malloc(nmax * 4);
    float *ef = malloc(nmax * 4);
    uint8_t *bits = malloc(nmax / 8 + 1);
    for (size_t zi = 0; zi < N_FUSED_SIZES; zi++)
        for (int ai = 0; ai < 2; ai++)
            for (int l2 = 0; l2 < 2; l2++) {
                size_t n = fused_sizes[zi];
                fill_state(e0, g, n, 17 + zi);
                float sgen = 0;
                FOR_EACH_SIMD(lvl)
                {
                    const gcoll_kernels_t *k = gcoll_kernels();
                    memcpy(er, e0, n * 4);
                    k->axpy(er, g, n, fused_a[ai]);
                    float want = k->sign_put(er, n, bits, l2);
                    memcpy(ef, e0, n * 4);
                    float acc[8] = {0};
                    size_t split = n / 3 / 8 * 8;
                    k->axpy_abssum(ef, g, split, fused_a[ai], l2, acc);
                    k->axpy_abssum(ef + split, g + split, n - split, fused_a[ai], l2, acc);
                    float got = gcoll_lanes8_sum(acc);
                    assert_memory_equal(er, ef, n * 4);
                    assert_memory_equal(&want, &got, 4);
                    if (lvl_i == 0)
                        sgen = got;
                    else
                        assert_memory_equal(&sgen, &got, 4);
                }
            }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(e0), free(er), free(ef), free(bits);
}

/* QSGD's rounding as values.c wrote it before it was vectorized (the reference). */
static uint8_t qsgd_ref_code(float x, float f, uint32_t s, uint32_t i, uint32_t klo, uint32_t khi)
{
    float r = fabsf(x) * f;
    uint32_t l = (uint32_t)r;
    float frac = r - (float)l;
    uint32_t h = gcoll_hash32(gcoll_hash32(i + klo) ^ khi);
    l += gcoll_u01(h) < frac;
    l = l > s ? s : l;
    return (uint8_t)(x < 0 ? s - l : s + l);
}

static void test_qsgd_kernels(void **unused)
{
    (void)unused;
    const size_t nmax = 20011;
    float *x = malloc(nmax * 4), *e = malloc(nmax * 4), *er = malloc(nmax * 4);
    uint8_t *codes = malloc(nmax), *ref = malloc(nmax);
    for (size_t zi = 0; zi < N_FUSED_SIZES; zi++)
        for (unsigned bits = 2; bits <= 8; bits += 3) {
            size_t n = fused_sizes[zi];
            const uint32_t s = (1u << (bits - 1)) - 1u;
            fill(x, n, 31 + zi);
            x[0 % (n ? n : 1)] = n ? -0.0f : 0.0f;
            float norm = sqrtf(gcoll_kernels()->sumsq(x, n));
            float f = norm > 0 ? (float)s / norm : 0.0f;
            uint32_t base = 0xfffffff0u - (uint32_t)zi, klo = rnd32(), khi = rnd32();
            for (size_t i = 0; i < n; i++)
                ref[i] = qsgd_ref_code(x[i], f, s, base + (uint32_t)i, klo, khi);
            for (size_t i = 0; i < n; i++)
                er[i] = x[i] - (float)((int32_t)ref[i] - (int32_t)s) * (norm / (float)s);
            FOR_EACH_SIMD(lvl)
            {
                const gcoll_kernels_t *k = gcoll_kernels();
                memset(codes, 0xee, n);
                k->qsgd_codes(x, n, f, s, base, klo, khi, codes);
                assert_memory_equal(codes, ref, n);
                memcpy(e, x, n * 4);
                k->qsgd_sub(codes, n, s, norm / (float)s, e);
                assert_memory_equal(e, er, n * 4);
            }
        }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x), free(e), free(er), free(codes), free(ref);
}

/* gcoll_vsec_put_ef == axpy, gcoll_vsec_put, apply(SUB): the same message bytes and the
 * same residual, for every dense format, bucket sizes that do not divide the block. */
static void test_fused_vsec_put_ef(void **unused)
{
    (void)unused;
    static const char *specs[] = {
        "none",
        "fp16",
        "bf16",
        "q8",
        "q8:bucket=100",
        "q8:bucket=3",
        "q8:bucket=5000",
        "qsgd:bits=4,bucket=512",
        "qsgd:bits=3,bucket=7",
        "qsgd:bits=8,bucket=13",
        "qsgd:bits=5,bucket=4100",
        "qsgd:bits=2,bucket=300000",
        "sign",
        "sign:scale=l2",
        "sign:chunk=8",
        "sign:scale=l2,chunk=1032",
        "q8:bucket=300000",
    };
    const size_t nmax = 20011;
    float *g = malloc(nmax * 4), *e0 = malloc(nmax * 4), *er = malloc(nmax * 4);
    float *ef = malloc(nmax * 4), *egen = malloc(nmax * 4);
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        size_t cap = gcoll_vsec_size(&c->vs, nmax);
        uint8_t *mr = malloc(cap + 8), *mf = malloc(cap + 8), *mgen = malloc(cap + 8);
        for (size_t zi = 0; zi < N_FUSED_SIZES; zi++)
            for (int ai = 0; ai < 2; ai++) {
                size_t n = fused_sizes[zi], vsz = gcoll_vsec_size(&c->vs, n);
                uint64_t key = 0x1234567890abcdefull + zi;
                fill_state(e0, g, n, 41 + zi);
                FOR_EACH_SIMD(lvl)
                {
                    const gcoll_kernels_t *k = gcoll_kernels();
                    memcpy(er, e0, n * 4);
                    memset(mr, 0x5a, cap + 8);
                    k->axpy(er, g, n, fused_a[ai]);
                    assert_int_equal(gcoll_vsec_put(&c->vs, er, n, key, mr), GCOLL_OK);
                    gcoll_vsec_apply_range(&c->vs, mr, n, 0, n, er, GCOLL_DECODE_SUB);
                    memcpy(ef, e0, n * 4);
                    memset(mf, 0xa5, cap + 8);
                    assert_int_equal(gcoll_vsec_put_ef(&c->vs, ef, g, fused_a[ai], n, key, mf),
                                     GCOLL_OK);
                    if (memcmp(mr, mf, vsz) || memcmp(er, ef, n * 4))
                        fail_msg("%s n=%zu a=%g simd %d: fused differs", specs[sp], n,
                                 (double)fused_a[ai], (int)lvl_i);
                    assert_int_equal(mf[vsz], 0xa5); /* nothing written past the section */
                    if (lvl_i == 0) {
                        memcpy(egen, ef, n * 4);
                        memcpy(mgen, mf, vsz);
                    } else {
                        assert_memory_equal(egen, ef, n * 4);
                        assert_memory_equal(mgen, mf, vsz);
                    }
                }
            }
        free(mr), free(mf), free(mgen);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(e0), free(er), free(ef), free(egen);
}

/* Exact top-k with feedback selects from the histogram built in the axpy pass, threshold
 * collects in it: message and residual equal a stateless encode of e_old + g followed by
 * the subtraction. */
static void test_fused_topk_ef(void **unused)
{
    (void)unused;
    static const char *specs[] = {"topk:density=0.01",
                                  "topk:density=0.001+q8",
                                  "topk:k=100+fp16",
                                  "topk:density=0.4",
                                  "threshold:tau=0.3",
                                  "threshold:tau=0.001+q8",
                                  "topk:density=0.01,select=sample",
                                  "topk:density=0.002,select=sample+q8"};
    static const size_t sizes[] = {16384, 16385, 40009};
    float *g = malloc(40009 * 4), *er = malloc(40009 * 4), *d = malloc(40009 * 4);
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++)
        for (size_t zi = 0; zi < 3; zi++) {
            size_t n = sizes[zi], lr, lf;
            gcoll_compressor_t *c = mk(specs[sp]);
            /* sampled selection keys its sample by step: the stateless reference encodes
             * at step 0, so compare sampled specs at their first step only */
            int steps = strstr(specs[sp], "sample") ? 1 : 3;
            gcoll_tensor_state_t *s;
            assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
            memset(er, 0, n * 4);
            for (int step = 0; step < steps; step++) {
                fill(g, n, 60 + (uint64_t)step);
                for (size_t i = 0; i < n; i++)
                    er[i] += g[i];
                uint8_t *mr = encode_alloc(c, NULL, er, n, &lr);
                assert_int_equal(gcoll_decode(c, mr, lr, d, n, 0), GCOLL_OK);
                for (size_t i = 0; i < n; i++)
                    er[i] -= d[i];
                uint8_t *mf = encode_alloc(c, s, g, n, &lf);
                assert_int_equal(lr, lf);
                assert_memory_equal(mr, mf, lr);
                assert_memory_equal(er, gcoll_state_residual(s), n * 4);
                gcoll_state_advance(s);
                free(mr);
                free(mf);
            }
            gcoll_state_destroy(s);
            gcoll_compressor_destroy(c);
        }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(er), free(d);
}

/* A finite gradient whose sum with the residual overflows in a late block: an error, and
 * the residual handed back as e_old + g (the blocks already encoded restored). */
static void test_fused_overflow(void **unused)
{
    (void)unused;
    static const char *specs[] = {
        "none", "fp16", "bf16", "q8", "sign", "sign:scale=l2,chunk=64", "qsgd:bits=4,bucket=64"};
    const size_t n = 10007;
    float *g = malloc(n * 4), *e0 = malloc(n * 4), *want = malloc(n * 4);
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        fill(g, n, 70);
        size_t cap = gcoll_compressor_bound(c, n), len;
        uint8_t *b = malloc(cap);
        assert_int_equal(gcoll_encode(c, s, g, n, b, cap, &len), GCOLL_OK);
        s->e[9000] = 3e38f;
        g[9000] = 3e38f;
        memcpy(e0, s->e, n * 4);
        for (size_t i = 0; i < n; i++)
            want[i] = e0[i] + g[i];
        assert_int_equal(gcoll_encode(c, s, g, n, b, cap, &len), GCOLL_ERR_INVALID);
        /* rounding to nearest, x - D(x) is exact; QSGD's stochastic levels may round it,
         * by at most an ulp of the bucket's largest value */
        int exact = c->vs.fmt != GCOLL_VF_QSGD;
        for (size_t i = 0; i < n; i++) {
            float got = s->e[i], big = 0;
            for (size_t j = i / 64 * 64; j < GCOLL_MIN(n, i / 64 * 64 + 64); j++)
                big = fabsf(want[j]) > big ? fabsf(want[j]) : big;
            if (exact || !isfinite(big) ? memcmp(&got, &want[i], 4) != 0
                                        : !(fabsf(got - want[i]) <= 1.2e-7f * big))
                fail_msg("%s element %zu: %g, want %g", specs[sp], i, (double)got, (double)want[i]);
        }
        free(b);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g), free(e0), free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_folded_check),          cmocka_unit_test(test_fused_nonfinite),
        cmocka_unit_test(test_fused_axpy_collect_ge), cmocka_unit_test(test_fused_axpy_abssum),
        cmocka_unit_test(test_qsgd_kernels),          cmocka_unit_test(test_fused_vsec_put_ef),
        cmocka_unit_test(test_fused_topk_ef),         cmocka_unit_test(test_fused_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
