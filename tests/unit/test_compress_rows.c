/* test_compress_rows.c: rowsparse (embedding rows): lossless exactness, message size, the
 * top rows by l2 norm against an independent selection, error feedback, spec errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "compress_test_util.h"
#include "gcoll.h"

/* An embedding gradient: rows of D values, a few of them touched (dense), the rest zero. */
static void emb_grad(float *x, size_t rows, size_t D, size_t touched, uint64_t seed)
{
    memset(x, 0, rows * D * sizeof(float));
    rng_s = seed;
    for (size_t t = 0; t < touched; t++) {
        size_t r = rnd32() % rows;
        float scale = 0.01f + (float)(rnd32() % 1000) / 100.0f;
        for (size_t j = 0; j < D; j++)
            x[r * D + j] = rndf() * scale;
    }
}

static void test_lossless(void **unused)
{
    (void)unused;
    const size_t rows = 5000, D = 64, n = rows * D;
    float *x = malloc(n * 4), *d = malloc(n * 4);
    emb_grad(x, rows, D, 40, 3);
    x[n - 1] = 0.5f; /* the last row */
    FOR_EACH_SIMD(lvl)
    {
        gcoll_compressor_t *c = mk("rowsparse:dim=64");
        assert_string_equal(gcoll_compressor_spec(c), "rowsparse:dim=64,ef=1");
        assert_true(gcoll_compressor_flags(c) & GCOLL_CODEC_SPARSE);
        size_t touched = 0;
        for (size_t r = 0; r < rows; r++) {
            int nz = 0;
            for (size_t j = 0; j < D; j++)
                nz |= x[r * D + j] != 0.0f;
            touched += nz;
        }
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        assert_memory_equal(x, d, n * 4); /* lossless, bit for bit */
        size_t nnz = 0;
        assert_int_equal(gcoll_decode_info(b, len, NULL, &nnz), GCOLL_OK);
        assert_int_equal(nnz, touched * D);
        /* element indices, delta-bitpacked: a block of 128 gaps holding a row start is as
         * wide as that jump (here about 18 bits), so a 64-value row costs its values plus
         * ~2.2 bytes per value, within raw pairs (measured: 15005 bytes for 41 rows) */
        if (len > 48 + 8 * nnz)
            fail_msg("%zu rows of %zu: %zu bytes, more than raw pairs", touched, D, len);
        assert_true(len < 4 * n / 50); /* 1/85 of the dense tensor here */
        for (size_t i = 0; i < n; i++) /* nothing left behind */
            assert_true(gcoll_state_residual(s)[i] == 0.0f);
        free(b);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    /* D not dividing n: a short last row; dim larger than the tensor: one row */
    gcoll_compressor_t *c = mk("rowsparse:dim=7");
    float y[30] = {0};
    y[29] = 1.0f;
    y[3] = -2.0f;
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, y, 30, &len);
    float dy[30];
    assert_int_equal(gcoll_decode(c, b, len, dy, 30, 0), GCOLL_OK);
    assert_memory_equal(y, dy, sizeof(y));
    size_t nnz;
    assert_int_equal(gcoll_decode_info(b, len, NULL, &nnz), GCOLL_OK);
    assert_int_equal(nnz, 7 + 2); /* row 0 and the short row 4 (elements 28, 29) */
    free(b);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
}

/* density=d: the ceil(d R) touched rows of largest l2 norm, computed here by sorting, with
 * error feedback keeping the rest (D(c) + e_new == e_old + g, exactly: f32 values). */
static void test_top_rows(void **unused)
{
    (void)unused;
    const size_t rows = 2000, D = 16, n = rows * D;
    float *x = malloc(n * 4), *d = malloc(n * 4), *e0 = malloc(n * 4);
    double *norm = malloc(rows * 8);
    gcoll_compressor_t *c = mk("rowsparse:dim=16,density=0.25");
    assert_string_equal(gcoll_compressor_spec(c), "rowsparse:dim=16,density=0.25,ef=1");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    for (int step = 0; step < 5; step++) {
        emb_grad(x, rows, D, 100, 10 + (uint64_t)step);
        memcpy(e0, gcoll_state_residual(s), n * 4);
        size_t R = 0;
        for (size_t r = 0; r < rows; r++) {
            double ss = 0;
            int nz = 0;
            for (size_t j = 0; j < D; j++) {
                float v = e0[r * D + j] + x[r * D + j];
                ss += (double)v * v;
                nz |= v != 0.0f;
            }
            norm[r] = nz ? ss : -1;
            R += nz;
        }
        size_t keep = (size_t)ceil(0.25 * (double)R);
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        /* the rows sent: exactly those whose norm is among the keep largest */
        double thr_sent = INFINITY, max_unsent = -1;
        size_t sent = 0;
        for (size_t r = 0; r < rows; r++) {
            int any = 0;
            for (size_t j = 0; j < D; j++)
                any |= d[r * D + j] != 0.0f;
            if (any) {
                sent++;
                thr_sent = fmin(thr_sent, norm[r]);
            } else if (norm[r] >= 0) {
                max_unsent = fmax(max_unsent, norm[r]);
            }
        }
        assert_int_equal(sent, keep);
        assert_true(max_unsent <= thr_sent);
        const float *e = gcoll_state_residual(s);
        for (size_t i = 0; i < n; i++) {
            float want = e0[i] + x[i];
            assert_true(d[i] + e[i] == want);
        }
        free(b);
    }
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
    free(e0);
    free(norm);
}

static void test_spec_errors(void **unused)
{
    (void)unused;
    static const char *bad[] = {"rowsparse",
                                "rowsparse:dim=0",
                                "rowsparse:dim=8,density=0",
                                "rowsparse:dim=8,density=2",
                                "rowsparse:dim=8,dim=8",
                                "rowsparse:dim=8,k=3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        assert_int_equal(gcoll_compressor_check(bad[i], NULL, 0), GCOLL_ERR_INVALID);
    gcoll_compressor_t *c = mk("rowsparse:dim=8+fp16");
    assert_string_equal(gcoll_compressor_spec(c), "rowsparse:dim=8+fp16:ef=1");
    float x[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, d[16];
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, x, 16, &len);
    assert_int_equal(gcoll_decode(c, b, len, d, 16, 0), GCOLL_OK);
    assert_memory_equal(x, d, sizeof(x)); /* small integers are exact in fp16 */
    x[3] = NAN;
    assert_int_equal(gcoll_encode(c, NULL, x, 16, b, len, &len), GCOLL_ERR_INVALID);
    free(b);
    gcoll_compressor_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless),
        cmocka_unit_test(test_top_rows),
        cmocka_unit_test(test_spec_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
