/* test_compress_rows.c: the sparsifiers of codec_rows.c: rowsparse (embedding rows: lossless
 * exactness, message size, the top rows by l2 norm against an independent selection, error
 * feedback, spec errors) and EF21 random-k. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "compress_test_util.h"
#include "compress/compress.h"
#include "compress/wire.h"
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
        /* row-coded indices (wire.h): 12 bytes, then the row indices' delta block, its
         * width that of the largest row gap (below 5000 rows: at most 13 bits): 4 bytes a
         * value plus at most 1 + ceil(41 * 13 / 8) = 68 bytes. Element deltas cost 15005
         * bytes here (a block of 128 gaps holding a row start is as wide as that jump). */
        assert_int_equal(b[6], 1u | 8u); /* sorted, row-coded */
        printf("rowsparse:dim=64, %zu of %zu rows: %zu bytes, %.3f bytes a value\n", touched, rows,
               len, (double)len / (double)nnz);
        assert_true(len >= 48 + 12 + 1 + 4 * nnz && len <= 48 + 12 + 68 + 4 * nnz);
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

/* EF21 random-k (feedback=ef21): the message carries x - g at the k shared indices,
 * g there becomes x exactly (f32 values), the other elements of g stay; summing the
 * decoded messages of every step rebuilds g, the receivers' estimate. With q8 values g
 * moves by what was decoded. The spec warns of classic feedback at a low density. */
static void test_ef21_randomk(void **unused)
{
    (void)unused;
    const size_t n = 3000;
    float *x = malloc(n * 4), *d = malloc(n * 4), *G = calloc(n, 4), *g0 = malloc(n * 4);
    static const char *specs[] = {"randomk:density=0.01,feedback=ef21",
                                  "randomk:density=0.05,seed=2,feedback=ef21+q8"};
    for (size_t sp = 0; sp < 2; sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        assert_non_null(strstr(gcoll_compressor_spec(c), "feedback=ef21"));
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        memset(G, 0, n * 4);
        for (int step = 0; step < 30; step++) {
            fill(x, n, 500 + (uint64_t)step);
            memcpy(g0, gcoll_state_residual(s), n * 4);
            size_t len;
            uint8_t *b = encode_alloc(c, s, x, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            const float *g = gcoll_state_residual(s);
            size_t sent = 0;
            for (size_t i = 0; i < n; i++) {
                G[i] += d[i];
                if (d[i] != 0.0f || g[i] != g0[i]) {
                    sent++;
                    assert_true(g[i] == g0[i] + d[i]); /* g moves by what was decoded */
                    if (sp == 0) /* f32: the new value, to the rounding of g0 + (x - g0) */
                        assert_true(fabsf(g[i] - x[i]) <= 0x1p-23f * (fabsf(x[i]) + fabsf(g0[i])));
                } else {
                    assert_true(g[i] == g0[i]);
                }
                assert_true(fabsf(G[i] - g[i]) <= 1e-5f * (fabsf(g[i]) + 1e-3f));
            }
            assert_true(sent <= gcoll_codec_k(c, n, (uint64_t)step));
            free(b);
        }
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    gcoll_compressor_t *c = mk("randomk:density=0.01"); /* classic feedback by default */
    assert_non_null(strstr(gcoll_compressor_spec(c), "feedback=ef,"));
    assert_false(gcoll_codec_folds_check(c, NULL, 0));
    gcoll_compressor_destroy(c);
    assert_int_equal(gcoll_compressor_check("randomk:density=0.01,ef=0,feedback=ef21", NULL, 0),
                     GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_compressor_check("randomk:density=0.01,feedback=sgd", NULL, 0),
                     GCOLL_ERR_INVALID);
    free(x);
    free(d);
    free(G);
    free(g0);
}

static uint32_t u32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Expects gcoll_decode to refuse b (GCOLL_ERR_INVALID) and leave the output as it was. */
static void refused(gcoll_compressor_t *c, const uint8_t *b, size_t len, size_t n)
{
    float *d = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        d[i] = 7.0f;
    assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_ERR_INVALID);
    for (size_t i = 0; i < n; i++)
        assert_true(d[i] == 7.0f);
    free(d);
}

/* A row-coded message with the tensor's short last row (dim 7, 300 rows and 3 values),
 * decoded whole, as pairs and summed; then every corruption of its row section refused:
 * fields out of range, rows past the tensor, a short row that does not end the tensor,
 * the flag with delta, every truncation. */
static void test_row_coded(void **unused)
{
    (void)unused;
    const size_t D = 7, n = 300 * D + 3;
    const size_t touched[4] = {5, 100, 299, 300};
    float *x = calloc(n, 4), *d = malloc(n * 4);
    size_t nnz = 0;
    for (int t = 0; t < 4; t++)
        for (size_t i = touched[t] * D; i < n && i < (touched[t] + 1) * D; i++, nnz++)
            x[i] = (float)(i % 11) - 5.5f;
    gcoll_compressor_t *c = mk("rowsparse:dim=7");
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, x, n, &len);
    assert_int_equal(b[6], 1u | 8u);
    const uint8_t *sec = b + 48;
    assert_int_equal(u32_at(sec), 7);
    assert_int_equal(u32_at(sec + 4), 4);
    assert_int_equal(u32_at(sec + 8), 3); /* the tensor's last row: 3 values */
    assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
    assert_memory_equal(x, d, n * 4);
    uint32_t idx[64];
    float val[64];
    size_t got;
    assert_int_equal(gcoll_decode_pairs(c, b, len, n, idx, val, 64, &got), GCOLL_OK);
    assert_int_equal(got, nnz);
    for (size_t j = 0, t = 0; t < 4; t++)
        for (size_t i = touched[t] * D; i < n && i < (touched[t] + 1) * D; i++, j++) {
            assert_int_equal(idx[j], i);
            assert_true(val[j] == x[i]);
        }
    /* two messages summed (the merged path reads the rows too) */
    const uint8_t *const msgs[2] = {b, b};
    size_t lens[2] = {len, len};
    assert_int_equal(gcoll_codec_sum(c, msgs, lens, 2, d, n, 1.0f, NULL), GCOLL_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(d[i] == 2.0f * x[i]);

    uint8_t *bad = malloc(len);
    struct {
        size_t off;
        uint32_t v;
    } field[] = {
        {0, 0},    {0, 8},           {0, 6}, /* dim */
        {4, 0},    {4, 3},           {4, 5}, /* rows */
        {4, 1000},                           /* more rows than values */
        {8, 0},    {8, 4},           {8, 7}, /* the last row's length */
        {8, 8},    {0, 0xffffffffu},
    };
    for (size_t f = 0; f < sizeof(field) / sizeof(*field); f++) {
        memcpy(bad, b, len);
        put32(bad + 48 + field[f].off, field[f].v);
        refused(c, bad, len, n);
    }
    /* crafted sections (the writer of wire.c, any rows): a valid one decodes, then a row
     * past the tensor's 301 rows, rows out of order, and a short row that does not end
     * the tensor are refused */
    struct {
        uint32_t rows[3], last;
        int ok;
    } craft[] = {
        {{0, 150, 300}, 3, 1}, {{0, 150, 301}, 3, 0}, {{0, 150, 150}, 3, 0},
        {{0, 151, 150}, 3, 0}, {{0, 150, 290}, 2, 0}, {{0, 150, 300}, 7, 0},
    };
    for (size_t k = 0; k < sizeof(craft) / sizeof(*craft); k++) {
        size_t cn = 2 * D + craft[k].last;
        uint8_t msg[48 + 64 + 4 * 3 * 7];
        /* the delta writer needs ascending rows; out-of-order ones are packed by hand as
         * gaps that wrap: written as a valid section, then its gap bytes patched */
        uint32_t r[3] = {craft[k].rows[0], craft[k].rows[1], craft[k].rows[2]};
        int wrap = r[2] <= r[1];
        if (wrap)
            r[2] = r[1] + 1;
        size_t isz = gcoll_idx_rows_write(r, 3, cn, (uint32_t)D, msg + 48);
        if (wrap) { /* gaps 0, r1 - 1, g with width w: make the last gap 0xffff...: wrap */
            unsigned w = msg[48 + 12];
            assert_true(w >= 8);
            memset(msg + 48 + 13, 0xff, (3 * w + 7) / 8);
        }
        gcoll_wire_hdr_t h = {GCOLL_WIRE_SPARSE,
                              GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_ROWS,
                              n,
                              cn,
                              isz + 4 * cn,
                              {.fmt = GCOLL_VF_F32},
                              0};
        gcoll_wire_put_hdr(msg, &h);
        for (size_t j = 0; j < cn; j++)
            put32(msg + 48 + isz + 4 * j, 0x3f800000u); /* 1.0f */
        if (craft[k].ok) {
            assert_int_equal(gcoll_decode(c, msg, 48 + isz + 4 * cn, d, n, 0), GCOLL_OK);
            for (size_t i = 0; i < n; i++)
                assert_true(d[i] ==
                            (i < D || (i >= 150 * D && i < 151 * D) || i >= 300 * D ? 1.0f : 0.0f));
        } else {
            refused(c, msg, 48 + isz + 4 * cn, n);
        }
    }
    /* the flag combined with delta, or without sorted */
    for (unsigned fl = 8; fl < 16; fl++) {
        if (fl == (1u | 8u))
            continue;
        memcpy(bad, b, len);
        bad[6] = (uint8_t)fl;
        refused(c, bad, len, n);
    }
    for (size_t cut = 48; cut < len; cut++) { /* the header's payload length agreeing */
        memcpy(bad, b, cut);
        put32(bad + 24, (uint32_t)(cut - 48));
        refused(c, bad, cut, n);
    }
    free(bad);
    free(b);
    free(x);
    free(d);
    gcoll_compressor_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless),    cmocka_unit_test(test_top_rows),
        cmocka_unit_test(test_spec_errors), cmocka_unit_test(test_ef21_randomk),
        cmocka_unit_test(test_row_coded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
