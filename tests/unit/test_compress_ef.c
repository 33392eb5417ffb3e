/* test_compress_ef.c: error feedback (bit-exact invariants), DGC state, NaN/Inf, clipping,
 * chunks. The fused feedback kernels are test_compress_fused.c's. */
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

/* --- error feedback -------------------------------------------------------------------- */

/* decode(c) + e_new == e_old + g, bit for bit, for every sparsifier over several steps. */
static void test_ef_invariant_sparsifiers(void **unused)
{
    (void)unused;
    static const char *specs[] = {
        "topk:density=0.01",
        "topk:density=0.01,select=sample",
        "topk:density=0.005,select=reuse,reuse_steps=3",
        "topk:k=17",
        "threshold:tau=0.02",
        "randomk:density=0.05,seed=3,feedback=ef",
        "topk:density=0.6",
        "topk:density=0.02+fp16",
        "dgc:density=0.01,momentum=0.9,warmup_steps=4",
        "dgc:density=0.01,momentum=0.5,select=exact,clip=1000000",
    };
    const size_t n = 30011;
    float *g = malloc(n * 4), *d = malloc(n * 4), *eold = malloc(n * 4), *uold = malloc(n * 4);
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        int dgc = c->sparsify == GCOLL_SPARSIFY_DGC;
        for (int step = 0; step < 6; step++) {
            fill(g, n, 100 + (uint64_t)step);
            memcpy(eold, gcoll_state_residual(s), n * 4);
            if (dgc)
                memcpy(uold, s->u, n * 4);
            size_t len;
            uint8_t *b = encode_alloc(c, s, g, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            const float *enew = gcoll_state_residual(s);
            size_t sent = 0;
            for (size_t i = 0; i < n; i++) {
                float want;
                if (dgc) {
                    float u = c->momentum * uold[i] + g[i]; /* the clip bound never binds here */
                    want = eold[i] + u;
                    /* momentum factor masking, except at a dense warm-up stage */
                    if (d[i] != 0 && gcoll_codec_k(c, n, (uint64_t)step) < n)
                        assert_true(s->u[i] == 0.0f);
                    else
                        assert_true(s->u[i] == u);
                } else {
                    want = eold[i] + g[i];
                }
                float got = d[i] + enew[i];
                sent += d[i] != 0;
                if (memcmp(&got, &want, 4))
                    fail_msg("%s step %d element %zu: decode %a + residual %a = %a, want %a",
                             specs[sp], step, i, (double)d[i], (double)enew[i], (double)got,
                             (double)want);
            }
            assert_true(sent > 0);
            free(b);
        }
        assert_int_equal(gcoll_state_step(s), 6);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g);
    free(d);
    free(eold);
    free(uold);
}

/* Quantizers: the invariant holds up to one rounding of the subtraction. */
static void test_ef_invariant_quantizers(void **unused)
{
    (void)unused;
    static const char *specs[] = {"fp16",
                                  "bf16",
                                  "q8",
                                  "sign",
                                  "sign:scale=l2,chunk=64",
                                  "qsgd:bits=4,bucket=64",
                                  "topk:density=0.05+q8",
                                  "topk:density=0.05+qsgd:bits=3,bucket=32"};
    const size_t n = 5001;
    float *g = malloc(n * 4), *d = malloc(n * 4), *eold = malloc(n * 4);
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        for (int step = 0; step < 4; step++) {
            fill(g, n, 200 + (uint64_t)step);
            memcpy(eold, gcoll_state_residual(s), n * 4);
            size_t len;
            uint8_t *b = encode_alloc(c, s, g, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            const float *enew = gcoll_state_residual(s);
            for (size_t i = 0; i < n; i++) {
                float want = eold[i] + g[i];
                float got = d[i] + enew[i];
                float tol = 2.0f * 1.2e-7f * (fabsf(want) + fabsf(d[i]) + fabsf(enew[i]));
                if (!(fabsf(got - want) <= tol))
                    fail_msg("%s step %d element %zu: %g + %g != %g", specs[sp], step, i,
                             (double)d[i], (double)enew[i], (double)want);
            }
            free(b);
        }
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    free(g);
    free(d);
    free(eold);
}

static void test_ef_off_and_state_checks(void **unused)
{
    (void)unused;
    const size_t n = 100;
    float x[100], d[100];
    fill(x, n, 5);
    gcoll_compressor_t *c = mk("topk:density=0.1,ef=0");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    assert_null(gcoll_state_residual(s));
    size_t cap = gcoll_compressor_bound(c, n), len = 0;
    uint8_t *b = malloc(cap);
    assert_int_equal(gcoll_encode(c, s, x, n, b, cap, &len), GCOLL_OK);
    assert_int_equal(gcoll_state_step(s), 1);
    /* count must match the state */
    assert_int_equal(gcoll_encode(c, s, x, n - 1, b, cap, &len), GCOLL_ERR_INVALID);
    /* cap too small: error, nothing advanced */
    assert_int_equal(gcoll_encode(c, s, x, n, b, 20, &len), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_encode(c, NULL, NULL, n, b, cap, &len), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_encode(c, NULL, x, n, NULL, cap, &len), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_decode(c, b, len, NULL, n, 0), GCOLL_ERR_INVALID);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    /* dgc refuses to run without its buffers */
    c = mk("dgc:density=0.1");
    assert_int_equal(gcoll_encode(c, NULL, x, n, b, cap, &len), GCOLL_ERR_INVALID);
    gcoll_compressor_destroy(c);
    /* zero-length tensors encode and decode */
    c = mk("topk:density=0.1+q8");
    assert_int_equal(gcoll_state_create(c, 0, &s), GCOLL_OK);
    assert_int_equal(gcoll_encode(c, s, x, 0, b, cap, &len), GCOLL_OK);
    assert_int_equal(len, 48);
    assert_int_equal(gcoll_decode(c, b, len, d, 0, 1), GCOLL_OK);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(b);
}

/* NaN/Inf input: a clear error from every codec, the state left as it was. */
static void test_nonfinite_input(void **unused)
{
    (void)unused;
    static const char *specs[] = {"none",
                                  "fp16",
                                  "bf16",
                                  "q8",
                                  "sign",
                                  "qsgd:bits=4",
                                  "topk:density=0.01",
                                  "topk:density=0.01,select=sample",
                                  "topk:density=0.01,select=reuse",
                                  "randomk:density=0.01,seed=1",
                                  "threshold:tau=0.1",
                                  "dgc:density=0.01",
                                  "fp16:clip=1",
                                  "topk:density=0.1+q8"};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const size_t n = 20000, pos[] = {0, 12345, 19999};
    float *x = malloc(n * 4), *e = malloc(n * 4);
    FOR_EACH_SIMD(lvl)
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++)
        for (int bi = 0; bi < 3; bi++)
            for (int pi = 0; pi < 3; pi++) {
                fill(x, n, 50);
                gcoll_compressor_t *c = mk(specs[sp]);
                gcoll_tensor_state_t *s;
                assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
                size_t cap = gcoll_compressor_bound(c, n), len;
                uint8_t *b = malloc(cap);
                assert_int_equal(gcoll_encode(c, s, x, n, b, cap, &len), GCOLL_OK);
                memcpy(e, gcoll_state_residual(s), n * 4);
                x[pos[pi]] = bad[bi];
                assert_int_equal(gcoll_encode(c, s, x, n, b, cap, &len), GCOLL_ERR_INVALID);
                assert_memory_equal(e, gcoll_state_residual(s), n * 4);
                assert_int_equal(gcoll_state_step(s), 1);
                if (!(gcoll_compressor_flags(c) & GCOLL_CODEC_NEEDS_STATE))
                    assert_int_equal(gcoll_encode(c, NULL, x, n, b, cap, &len), GCOLL_ERR_INVALID);
                free(b);
                gcoll_state_destroy(s);
                gcoll_compressor_destroy(c);
            }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(x);
    free(e);
}

static void test_clipping(void **unused)
{
    (void)unused;
    const size_t n = 1000;
    float *x = malloc(n * 4), *d = malloc(n * 4);
    fill(x, n, 60);
    double nrm = 0;
    for (size_t i = 0; i < n; i++)
        nrm += (double)x[i] * x[i];
    nrm = sqrt(nrm);
    char spec[64];
    snprintf(spec, sizeof(spec), "none:ef=0,clip=%.9g", nrm / 4);
    gcoll_compressor_t *c = mk(spec);
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, x, n, &len);
    assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
    double dn = 0;
    for (size_t i = 0; i < n; i++) {
        dn += (double)d[i] * d[i];
        assert_true(fabs(d[i] - x[i] * 0.25) <= 1e-6 * fabs(x[i]) + 1e-30);
    }
    assert_true(fabs(sqrt(dn) - nrm / 4) <= 1e-5 * nrm);
    free(b);
    gcoll_compressor_destroy(c);
    /* below the bound nothing changes */
    snprintf(spec, sizeof(spec), "none:clip=%.9g", nrm * 2);
    c = mk(spec);
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    b = encode_alloc(c, s, x, n, &len);
    assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
    assert_memory_equal(d, x, n * 4);
    free(b);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
}

/* --- DGC warm-up and chunked/streaming use -------------------------------------------- */

static void test_warmup_schedule(void **unused)
{
    (void)unused;
    /* the paper's stages from warmup_start=0.25 (geometric: within 1.3%; test_warmup.c
     * covers the schedules from dense) */
    gcoll_compressor_t *c = mk("dgc:density=0.001,momentum=0.9,warmup_steps=400,warmup_start=0.25");
    const double want[] = {0.25, 0.0625, 0.015625, 0.004};
    for (uint64_t t = 0; t < 400; t++)
        assert_true(fabs(gcoll_codec_density(c, t) - want[t / 100]) < 0.013 * want[t / 100]);
    assert_true(gcoll_codec_density(c, 400) == 0.001);
    assert_true(gcoll_codec_density(c, 1000000) == 0.001);
    gcoll_compressor_destroy(c);
    c = mk("dgc:density=0.05,warmup_steps=8,warmup_start=0.25"); /* never below the target */
    assert_true(gcoll_codec_density(c, 7) >= 0.05 && gcoll_codec_density(c, 8) == 0.05);
    assert_true(gcoll_codec_density(c, 0) == 0.25);
    gcoll_compressor_destroy(c);
    c = mk("dgc:density=0.01,warmup_steps=100,warmup_start=0.25,schedule=linear");
    assert_true(gcoll_codec_density(c, 0) == 0.25);
    assert_true(fabs(gcoll_codec_density(c, 50) - 0.13) < 1e-12);
    assert_true(gcoll_codec_density(c, 100) == 0.01);
    gcoll_compressor_destroy(c);
    c = mk("dgc:density=0.01,warmup_steps=10,schedule=step");
    assert_true(gcoll_codec_density(c, 9) == 1.0); /* from dense by default */
    assert_true(gcoll_codec_density(c, 10) == 0.01);
    gcoll_compressor_destroy(c);
    /* the messages follow the schedule */
    const size_t n = 40000;
    float *x = malloc(n * 4);
    c = mk("dgc:density=0.001,warmup_steps=8,warmup_start=0.25,select=exact");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    /* ceil(40000 x 0.25 x 0.004^(i/4)) */
    const size_t want_k[] = {10000, 10000, 2515, 2515, 633, 633, 160, 160, 40, 40};
    for (int t = 0; t < 10; t++) {
        fill(x, n, 70 + (uint64_t)t);
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] == 0 ? 1e-3f : x[i];
        size_t len, nnz;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode_info(b, len, NULL, &nnz), GCOLL_OK);
        assert_int_equal(nnz, want_k[t]);
        free(b);
    }
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
}

/* Chunks encoded separately with slices of one state decode to the same tensor a
 * reader expects, and the invariant holds chunk by chunk. */
static void test_encode_chunks(void **unused)
{
    (void)unused;
    const size_t n = 10000, chunk = 3000;
    float *x = malloc(n * 4), *d = malloc(n * 4), *e0 = malloc(n * 4);
    gcoll_compressor_t *c = mk("topk:density=0.01");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    for (int step = 0; step < 3; step++) {
        fill(x, n, 80 + (uint64_t)step);
        memcpy(e0, gcoll_state_residual(s), n * 4);
        memset(d, 0, n * 4);
        for (size_t off = 0; off < n; off += chunk) {
            size_t m = off + chunk > n ? n - off : chunk, len;
            size_t cap = gcoll_compressor_bound(c, m);
            uint8_t *b = malloc(cap);
            assert_int_equal(gcoll_encode_chunk(c, s, off, x + off, m, b, cap, &len), GCOLL_OK);
            assert_int_equal(gcoll_decode(c, b, len, d + off, m, 1), GCOLL_OK);
            free(b);
        }
        gcoll_state_advance(s);
        const float *e = gcoll_state_residual(s);
        for (size_t i = 0; i < n; i++) {
            float want = e0[i] + x[i], got = d[i] + e[i];
            assert_memory_equal(&want, &got, 4);
        }
    }
    assert_int_equal(gcoll_state_step(s), 3);
    size_t len;
    uint8_t b[256];
    assert_int_equal(gcoll_encode_chunk(c, s, n - 10, x, 11, b, sizeof(b), &len),
                     GCOLL_ERR_INVALID);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
    free(e0);
}

/* Server-side residual for re-compressing a reduced chunk: plain feedback, no momentum. */
static void test_server_state(void **unused)
{
    (void)unused;
    const size_t n = 4096;
    float *x = malloc(n * 4), *d = malloc(n * 4), *e0 = malloc(n * 4);
    gcoll_compressor_t *c = mk("dgc:density=0.01,momentum=0.9");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create_mode(c, n, GCOLL_STATE_SERVER, &s), GCOLL_OK);
    assert_null(s->u);
    gcoll_state_set_salt(s, 3);
    for (int step = 0; step < 3; step++) {
        fill(x, n, 95 + (uint64_t)step);
        memcpy(e0, s->e, n * 4);
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        for (size_t i = 0; i < n; i++) {
            float want = e0[i] + x[i], got = d[i] + s->e[i];
            assert_memory_equal(&want, &got, 4);
        }
        free(b);
    }
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
    free(e0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ef_invariant_sparsifiers),
        cmocka_unit_test(test_ef_invariant_quantizers),
        cmocka_unit_test(test_ef_off_and_state_checks),
        cmocka_unit_test(test_nonfinite_input),
        cmocka_unit_test(test_clipping),
        cmocka_unit_test(test_warmup_schedule),
        cmocka_unit_test(test_encode_chunks),
        cmocka_unit_test(test_server_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
