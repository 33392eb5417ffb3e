/* test_compress_wire.c: every class of malformed message is refused, and nothing is written on
 * error. */
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
#include "compress/sparsify.h"
#include "compress/wire.h"

#define N 1000
#define SENTINEL 7.25f

static gcoll_compressor_t *mk(const char *spec)
{
    gcoll_compressor_t *c = NULL;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK)
        fail_msg("spec '%s' rejected", spec);
    return c;
}

static void fill(float *x, size_t n, unsigned seed)
{
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * (float)(1 + i % 7);
    }
}

/* A valid message of c for N elements (heap, *len bytes, with spare room after it). */
static uint8_t *valid_msg(gcoll_compressor_t *c, size_t *len)
{
    float x[N];
    fill(x, N, 1);
    size_t cap = gcoll_compressor_bound(c, N) + 64;
    uint8_t *b = calloc(1, cap);
    assert_int_equal(gcoll_encode(c, NULL, x, N, b, cap, len), GCOLL_OK);
    return b;
}

/* The message must be refused by every decoder and leave the output untouched. */
static void expect_bad_n(const gcoll_compressor_t *c, const uint8_t *b, size_t len, size_t count,
                         const char *what)
{
    static float out[N + 8];
    static uint32_t pi[N + 8];
    static float pv[N + 8];
    for (size_t i = 0; i < N + 8; i++)
        out[i] = SENTINEL;
    for (int acc = 0; acc < 2; acc++)
        if (gcoll_decode(c, b, len, out, count, acc) != GCOLL_ERR_INVALID)
            fail_msg("%s: decode (accumulate=%d) accepted a malformed message", what, acc);
    for (size_t i = 0; i < N + 8; i++)
        if (out[i] != SENTINEL)
            fail_msg("%s: output element %zu written on error", what, i);
    size_t nnz = 12345;
    if (gcoll_decode_pairs(c, b, len, count, pi, pv, N + 8, &nnz) != GCOLL_ERR_INVALID)
        fail_msg("%s: decode_pairs accepted a malformed message", what);
    assert_int_equal(nnz, 12345);
}
static void expect_bad(const gcoll_compressor_t *c, const uint8_t *b, size_t len, const char *what)
{
    expect_bad_n(c, b, len, N, what);
}

static void expect_ok(const gcoll_compressor_t *c, const uint8_t *b, size_t len, const char *what)
{
    float out[N];
    if (gcoll_decode(c, b, len, out, N, 0) != GCOLL_OK)
        fail_msg("%s: valid message refused", what);
}

static const char *all_specs[] = {
    "none",
    "fp16",
    "bf16",
    "q8:bucket=100",
    "sign:chunk=64",
    "qsgd:bits=3,bucket=50",
    "topk:density=0.05",
    "topk:density=0.3",
    "topk:density=0.05+q8:bucket=16",
    "topk:density=0.05+qsgd:bits=5,bucket=16",
    "threshold:tau=0.01",
    "randomk:density=0.05,seed=2",
    "randomk:density=0.05,seed=2+bf16",
    "topk:density=0.05+sign",
};
#define NSPECS (sizeof(all_specs) / sizeof(*all_specs))

/* Every strict prefix and one extra trailing byte are refused. */
static void test_truncation_and_trailing(void **unused)
{
    (void)unused;
    for (size_t s = 0; s < NSPECS; s++) {
        gcoll_compressor_t *c = mk(all_specs[s]);
        size_t len;
        uint8_t *b = valid_msg(c, &len);
        expect_ok(c, b, len, all_specs[s]);
        for (size_t l = 0; l < len; l++)
            expect_bad(c, b, l, all_specs[s]);
        expect_bad(c, b, len + 1, all_specs[s]);
        expect_bad(c, NULL, len, all_specs[s]);
        free(b);
        gcoll_compressor_destroy(c);
    }
}

static void test_header_fields(void **unused)
{
    (void)unused;
    for (size_t s = 0; s < NSPECS; s++) {
        gcoll_compressor_t *c = mk(all_specs[s]);
        size_t len;
        uint8_t *b = valid_msg(c, &len), *m = malloc(len + 64);
        const char *sp = all_specs[s];
#define MUT(stmt, what)                                                                            \
    do {                                                                                           \
        memcpy(m, b, len);                                                                         \
        stmt;                                                                                      \
        expect_bad(c, m, len, what);                                                               \
    } while (0)
        MUT(m[0] ^= 1, "bad magic");
        MUT(m[4] = 2, "future version");
        MUT(m[4] = 0, "version 0");
        MUT(m[5] = 9, "unknown codec id");
        MUT(m[5] = (uint8_t)(m[5] == GCOLL_WIRE_DENSE ? GCOLL_WIRE_SPARSE : GCOLL_WIRE_DENSE),
            "codec id of another codec");
        MUT(gcoll_put_u16(m + 6, 0x80), "unknown flag");
        MUT(gcoll_put_u64(m + 8, N - 1), "count one less");
        MUT(gcoll_put_u64(m + 8, N + 1), "count one more");
        MUT(gcoll_put_u64(m + 8, 1ull << 40), "absurd count");
        MUT(gcoll_put_u64(m + 16, N + 1), "nnz > count");
        MUT(gcoll_put_u64(m + 16, ~0ull), "absurd nnz");
        MUT(gcoll_put_u64(m + 24, gcoll_get_u64(m + 24) + 1), "payload length + 1");
        MUT(gcoll_put_u64(m + 24, gcoll_get_u64(m + 24) - 1), "payload length - 1");
        MUT(gcoll_put_u64(m + 24, ~0ull), "absurd payload length");
        MUT(m[32] = 99, "unknown value format");
        MUT(m[32] = (uint8_t)(m[32] == GCOLL_VF_F16 ? GCOLL_VF_BF16 : GCOLL_VF_F16),
            "value format of another codec");
        MUT(m[33] ^= 0x10, "bits field");
        MUT(m[34] = 1, "reserved parameter bits");
        MUT(gcoll_put_u32(m + 36, gcoll_get_u32(m + 36) + 8), "bucket of another codec");
        if (m[5] != GCOLL_WIRE_RANDOMK)
            MUT(gcoll_put_u64(m + 40, 5), "random-k key on a non-random-k message");
        else
            MUT(gcoll_put_u16(m + 6, GCOLL_WIRE_F_SORTED), "random-k with index flags");
        /* the expected element count is checked too */
        expect_bad_n(c, b, len, N - 1, sp);
        expect_bad_n(c, b, len, N + 1, sp);
        /* a message from another compressor */
        gcoll_compressor_t *other = mk(strcmp(sp, "fp16") ? "fp16" : "bf16");
        expect_bad(other, b, len, "decoded with another compressor");
        gcoll_compressor_destroy(other);
#undef MUT
        free(m);
        free(b);
        gcoll_compressor_destroy(c);
    }
}

/* Sparse message with raw u32 indices and f32 values, built by hand. */
static size_t build_raw(uint8_t *out, const uint32_t *idx, size_t nnz, unsigned flags,
                        uint64_t count)
{
    gcoll_wire_hdr_t h = {
        GCOLL_WIRE_SPARSE, flags, count, nnz, 8 * nnz, {GCOLL_VF_F32, 0, 0, 0, 0, 0}, 0};
    gcoll_wire_put_hdr(out, &h);
    for (size_t j = 0; j < nnz; j++) {
        gcoll_put_u32(out + 48 + 4 * j, idx[j]);
        float v = 1.0f + (float)j;
        memcpy(out + 48 + 4 * nnz + 4 * j, &v, 4);
    }
    return 48 + 8 * nnz;
}

static void test_sparse_indices(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("topk:density=0.01");
    uint8_t m[4096];
    uint32_t ok[] = {0, 5, 17, 999};
    size_t len = build_raw(m, ok, 4, GCOLL_WIRE_F_SORTED, N);
    expect_ok(c, m, len, "raw sorted");
    uint32_t oob[] = {0, 5, 17, 1000};
    expect_bad(c, m, build_raw(m, oob, 4, GCOLL_WIRE_F_SORTED, N), "index == count");
    uint32_t huge[] = {0xffffffffu};
    expect_bad(c, m, build_raw(m, huge, 1, GCOLL_WIRE_F_SORTED, N), "index 2^32-1");
    uint32_t dup[] = {0, 5, 5, 999};
    expect_bad(c, m, build_raw(m, dup, 4, GCOLL_WIRE_F_SORTED, N), "duplicate");
    uint32_t uns[] = {0, 17, 5, 999};
    expect_bad(c, m, build_raw(m, uns, 4, GCOLL_WIRE_F_SORTED, N), "unsorted");
    /* every encoder promises sorted indices; a message without the promise is refused
     * (decode_pairs returns pairs ascending, a fuzzer found an unsorted message breaking
     * that) */
    expect_bad(c, m, build_raw(m, dup, 4, 0, N), "no sorted promise");
    expect_bad(c, m, build_raw(m, oob, 4, 0, N), "no sorted promise, out of range");
    /* delta coding promised without sortedness */
    len = build_raw(m, ok, 4, GCOLL_WIRE_F_DELTA, N);
    expect_bad(c, m, len, "delta without sorted");
    /* dense fallback flag combined with others, or with nnz != count */
    len = build_raw(m, ok, 4, GCOLL_WIRE_F_DENSE | GCOLL_WIRE_F_SORTED, N);
    expect_bad(c, m, len, "dense flag + sorted");
    len = build_raw(m, ok, 4, GCOLL_WIRE_F_DENSE, N);
    expect_bad(c, m, len, "dense flag with nnz < count");
    /* non-finite values in the payload */
    len = build_raw(m, ok, 4, GCOLL_WIRE_F_SORTED, N);
    float nan = NAN;
    memcpy(m + 48 + 16 + 8, &nan, 4);
    expect_bad(c, m, len, "NaN value");
    gcoll_compressor_destroy(c);
}

/* Delta-bitpacked index blocks: widths, truncation, running past count. */
static void test_delta_indices(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("topk:density=0.2");
    uint32_t idx[200];
    for (uint32_t j = 0; j < 200; j++)
        idx[j] = j * 4 + (j % 3);
    size_t isz = gcoll_idx_delta_size(idx, 200);
    uint8_t m[4096];
    gcoll_wire_hdr_t h = {GCOLL_WIRE_SPARSE,
                          GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_DELTA,
                          N,
                          200,
                          isz + 800,
                          {GCOLL_VF_F32, 0, 0, 0, 0, 0},
                          0};
    gcoll_wire_put_hdr(m, &h);
    assert_int_equal(gcoll_idx_delta_write(idx, 200, m + 48), isz);
    for (int j = 0; j < 200; j++) {
        float v = 0.5f;
        memcpy(m + 48 + isz + 4 * j, &v, 4);
    }
    size_t len = 48 + isz + 800;
    expect_ok(c, m, len, "delta valid");
    uint8_t w0 = m[48];
    m[48] = 33;
    expect_bad(c, m, len, "width 33");
    m[48] = 32; /* wider blocks than the bytes present */
    expect_bad(c, m, len, "width 32, truncated block");
    m[48] = w0;
    /* second block header: make its gaps run past count */
    size_t b2 = 48 + 1 + (128 * w0 + 7) / 8;
    uint8_t w1 = m[b2];
    m[b2] = (uint8_t)(w1 + 1);
    expect_bad(c, m, len, "second block width changed");
    m[b2] = w1;
    memset(m + b2 + 1, 0xff, (size_t)((72 * w1 + 7) / 8));
    expect_bad(c, m, len, "gaps past count");
    gcoll_compressor_destroy(c);
}

/* gcoll_idx_check straight, on sections longer than its 256-index (raw) and 128-index
 * (delta) blocks: each fault at a block's first or last position, or just past it, is
 * found, and a clean section is accepted whole. Sections sit in exact-size buffers. */
static void test_idx_check_blocks(void **unused)
{
    (void)unused;
    enum { NNZ = 600, COUNT = 5000 };
    uint32_t idx[NNZ];
    size_t used;
    for (uint32_t j = 0; j < NNZ; j++)
        idx[j] = j * 8 + (j % 5);
    const unsigned raw_flags[] = {0, GCOLL_WIRE_F_SORTED};
    const size_t at[] = {0, 1, 255, 256, 257, 511, 512, NNZ - 1};
    uint8_t *raw = malloc(4 * NNZ);
    for (size_t f = 0; f < 2; f++) {
        for (size_t j = 0; j < NNZ; j++)
            gcoll_put_u32(raw + 4 * j, idx[j]);
        for (size_t nnz = 0; nnz <= NNZ; nnz += (nnz < 300 ? 1 : 100)) {
            assert_int_equal(gcoll_idx_check(raw, 4 * nnz, raw_flags[f], nnz, COUNT, &used),
                             GCOLL_OK);
            assert_int_equal(used, 4 * nnz);
        }
        for (size_t a = 0; a < sizeof(at) / sizeof(*at); a++) {
            size_t j = at[a];
            gcoll_put_u32(raw + 4 * j, COUNT); /* out of range */
            assert_int_equal(gcoll_idx_check(raw, 4 * NNZ, raw_flags[f], NNZ, COUNT, &used),
                             GCOLL_ERR_INVALID);
            /* equal to, then below, the previous index: refused only when sorted */
            gcoll_put_u32(raw + 4 * j, j ? idx[j - 1] : 0);
            if (j)
                assert_int_equal(gcoll_idx_check(raw, 4 * NNZ, raw_flags[f], NNZ, COUNT, &used),
                                 f ? GCOLL_ERR_INVALID : GCOLL_OK);
            if (j > 1) {
                gcoll_put_u32(raw + 4 * j, idx[j - 2]);
                assert_int_equal(gcoll_idx_check(raw, 4 * NNZ, raw_flags[f], NNZ, COUNT, &used),
                                 f ? GCOLL_ERR_INVALID : GCOLL_OK);
            }
            gcoll_put_u32(raw + 4 * j, idx[j]);
        }
    }
    free(raw);
    /* delta: a count that the last index of one block reaches (refused) or just clears */
    size_t isz = gcoll_idx_delta_size(idx, NNZ);
    uint8_t *d = malloc(isz);
    assert_int_equal(gcoll_idx_delta_write(idx, NNZ, d), isz);
    const size_t dn[] = {1, 127, 128, 129, 256, NNZ};
    for (size_t a = 0; a < sizeof(dn) / sizeof(*dn); a++) {
        uint64_t last = idx[dn[a] - 1];
        unsigned fl = GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_DELTA;
        assert_int_equal(gcoll_idx_check(d, isz, fl, NNZ, last, &used), GCOLL_ERR_INVALID);
        if (dn[a] == NNZ) {
            assert_int_equal(gcoll_idx_check(d, isz, fl, NNZ, last + 1, &used), GCOLL_OK);
            assert_int_equal(used, isz);
        }
    }
    free(d);
}

/* Value sections: scales, codes and half-precision patterns that no encoder emits. */
static void test_value_sections(void **unused)
{
    (void)unused;
    struct {
        const char *spec;
        size_t off; /* from the payload start */
        uint8_t byte;
        const char *what;
    } cases[] = {
        {"none", 3, 0x7f, "f32 exponent all ones (high byte)"},
        {"fp16", 1, 0x7c, "fp16 infinity"},
        {"fp16", 1, 0xfe, "fp16 NaN"},
        {"bf16", 1, 0x7f, "bf16 NaN/Inf"},
        {"q8:bucket=100", 3, 0xff, "q8 scale NaN"},
        {"q8:bucket=100", 3, 0x80, "q8 scale negative"},
        {"q8:bucket=100", 40 + 5, 0x80, "q8 code -128"},
        {"qsgd:bits=2,bucket=50", 3, 0xff, "qsgd norm NaN"},
        {"qsgd:bits=2,bucket=50", 80 + 2, 0xff, "qsgd code 3 with s = 1"},
        {"sign:chunk=64", 3, 0x80, "sign scale negative"},
        {"sign:chunk=64", 3, 0x7f, "sign scale infinite"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        gcoll_compressor_t *c = mk(cases[i].spec);
        size_t len;
        uint8_t *b = valid_msg(c, &len);
        b[48 + cases[i].off] = cases[i].byte;
        if (cases[i].byte == 0x7f && !strcmp(cases[i].spec, "none"))
            b[48 + 2] = 0x80; /* 0x7f80.... = inf */
        if (cases[i].byte == 0x7f && strstr(cases[i].spec, "sign"))
            b[48 + 2] = 0x80;
        if (!strcmp(cases[i].spec, "bf16"))
            b[48] = 0x80; /* 0x7f80 */
        expect_bad(c, b, len, cases[i].what);
        free(b);
        gcoll_compressor_destroy(c);
    }
}

/* Random corruption: any outcome but a crash or an out-of-bounds access (the fuzzers
 * run the same under AddressSanitizer); a refused message leaves out untouched. */
static void test_random_corruption(void **unused)
{
    (void)unused;
    uint64_t r = 99;
    for (size_t s = 0; s < NSPECS; s++) {
        gcoll_compressor_t *c = mk(all_specs[s]);
        size_t len;
        uint8_t *b = valid_msg(c, &len), *m = malloc(len);
        float out[N];
        for (int t = 0; t < 3000; t++) {
            memcpy(m, b, len);
            int flips = 1 + t % 4;
            for (int f = 0; f < flips; f++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                m[(r >> 33) % len] ^= (uint8_t)(1u << ((r >> 20) % 8));
            }
            for (size_t i = 0; i < N; i++)
                out[i] = SENTINEL;
            gcoll_status_t st = gcoll_decode(c, m, len, out, N, 1);
            assert_true(st == GCOLL_OK || st == GCOLL_ERR_INVALID);
            if (st != GCOLL_OK)
                for (size_t i = 0; i < N; i++)
                    assert_true(out[i] == SENTINEL);
            else
                for (size_t i = 0; i < N; i++)
                    assert_true(isfinite(out[i]));
        }
        free(m);
        free(b);
        gcoll_compressor_destroy(c);
    }
}

/* gcoll_codec_sum (the block-merged decode of every rank's message) gives the bits of
 * zeroing, one ADD decode per message in order and a division, for sparse messages of
 * several value formats, sizes around its block, and the dense and random-k fallbacks;
 * a malformed message is named and leaves out untouched. */
static void test_sum_messages(void **unused)
{
    (void)unused;
    static const char *specs[] = {"topk:density=0.01",      "topk:density=0.3+q8",
                                  "topk:density=0.05+fp16", "threshold:tau=0.4",
                                  "randomk:density=0.1",    "q8:bucket=100"};
    /* 1048579: past the size from which the sum streams its output */
    static const size_t counts[] = {1, 2047, 2048, 2049, 5000, 9001, 1048579};
    enum { M = 5, CMAX = 1048579 };
    float *x = malloc(CMAX * sizeof(float)), *got = malloc(CMAX * sizeof(float)),
          *want = malloc(CMAX * sizeof(float));
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        gcoll_compressor_t *c = mk(specs[si]);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t n = counts[ci], cap = gcoll_compressor_bound(c, n), len[M];
            uint8_t *msg[M];
            for (int i = 0; i < M; i++) {
                fill(x, n, (unsigned)(31 * ci + i + 1));
                msg[i] = malloc(cap);
                assert_int_equal(gcoll_encode(c, NULL, x, n, msg[i], cap, &len[i]), GCOLL_OK);
            }
            for (int m = 1; m <= M; m += 2) {
                for (int avg = 0; avg < 2; avg++) {
                    float div = avg ? (float)m : 1.0f;
                    memset(want, 0, n * sizeof(float));
                    for (int i = 0; i < m; i++)
                        assert_int_equal(
                            gcoll_codec_decode(c, msg[i], len[i], want, n, GCOLL_DECODE_ADD),
                            GCOLL_OK);
                    if (avg)
                        for (size_t k = 0; k < n; k++)
                            want[k] /= div;
                    for (size_t k = 0; k < n; k++)
                        got[k] = SENTINEL;
                    int bad = -1;
                    assert_int_equal(
                        gcoll_codec_sum(c, (const uint8_t *const *)msg, len, m, got, n, div, &bad),
                        GCOLL_OK);
                    if (memcmp(got, want, n * sizeof(float)) != 0)
                        fail_msg("%s, count %zu, %d messages, div %g: differs from the "
                                 "decode-add reference",
                                 specs[si], n, m, (double)div);
                }
            }
            /* the last message truncated: refused, named, out untouched */
            size_t keep = len[M - 1];
            len[M - 1] = keep - 1;
            for (size_t k = 0; k < n; k++)
                got[k] = SENTINEL;
            int bad = -1;
            assert_int_equal(
                gcoll_codec_sum(c, (const uint8_t *const *)msg, len, M, got, n, 1.0f, &bad),
                GCOLL_ERR_INVALID);
            assert_int_equal(bad, M - 1);
            for (size_t k = 0; k < n; k++)
                assert_true(got[k] == SENTINEL);
            /* a message for another dense size */
            len[M - 1] = keep;
            if (n > 1)
                assert_int_equal(
                    gcoll_codec_sum(c, (const uint8_t *const *)msg, len, M, got, n - 1, 1.0f, &bad),
                    GCOLL_ERR_INVALID);
            for (int i = 0; i < M; i++)
                free(msg[i]);
        }
        gcoll_compressor_destroy(c);
    }
    free(x);
    free(got);
    free(want);
}

/* Top-k's streamed selection pass (select.h) and the filtered sum of its segments
 * (gcoll_sum_sources): the candidates each segment hands out, read through the trim rule
 * the selection reports, are exactly the pairs the encoder sent; summed with another
 * rank's plain pairs they give the bits of the decode-add reference; a malformed chain
 * (a segment outside its index range, counts that disagree with the announced total, a
 * truncated segment, another value format) is refused with out untouched. */
#define SEGS_MAX 64
typedef struct {
    uint8_t *buf[SEGS_MAX];
    size_t len[SEGS_MAX], n;
    size_t count;
} seg_sink_t;

static void sink_emit(void *arg, size_t s, const uint32_t *idx, const float *val, size_t n)
{
    seg_sink_t *k = arg;
    assert_int_equal(s, k->n);
    size_t cap = gcoll_codec_pairs_bound(NULL, n, k->count);
    k->buf[s] = malloc(cap);
    assert_int_equal(
        gcoll_codec_encode_pairs(NULL, idx, val, n, k->count, k->buf[s], cap, &k->len[s]),
        GCOLL_OK);
    k->n++;
}

static void sink_free(seg_sink_t *k)
{
    for (size_t s = 0; s < k->n; s++)
        free(k->buf[s]);
    k->n = 0;
}

/* A fresh state of c encodes x[0..n) with its selection pass streamed into *sink in
 * segments of seg (rule: what the selection reports). Returns the state. */
static gcoll_tensor_state_t *encode_streamed(gcoll_compressor_t *c, const float *x, size_t n,
                                             size_t seg, uint8_t *msg, size_t cap, size_t *len,
                                             seg_sink_t *sink, gcoll_select_stream_t *rule)
{
    gcoll_tensor_state_t *s = NULL;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    *sink = (seg_sink_t){.count = n};
    *rule = (gcoll_select_stream_t){.seg = seg, .emit = sink_emit, .arg = sink};
    const gcoll_encode_opts_t opt = {.stream = rule};
    assert_int_equal(gcoll_codec_encode_range(c, s, 0, x, n, 0, &opt, msg, cap, len), GCOLL_OK);
    s->step++; /* as gcoll_encode */
    return s;
}

static void test_sum_sources(void **unused)
{
    (void)unused;
    enum { CNT = 200003, SEG = 16384 };
    static const char *specs[] = {"topk:density=0.01", "topk:density=0.02,select=sample"};
    float *x = malloc(CNT * sizeof(float)), *y = malloc(CNT * sizeof(float));
    float *got = malloc(CNT * sizeof(float)), *want = malloc(CNT * sizeof(float));
    uint32_t *pi = malloc(CNT * sizeof(uint32_t));
    float *pv = malloc(CNT * sizeof(float));
    for (size_t si = 0; si < sizeof(specs) / sizeof(specs[0]); si++) {
        gcoll_compressor_t *c = mk(specs[si]);
        size_t cap = gcoll_compressor_bound(c, CNT), len = 0, ylen = 0, yn = 0;
        uint8_t *msg = malloc(cap), *ymsg = malloc(cap);
        for (int ties = 0; ties < 2; ties++) {
            fill(x, CNT, 7 + (unsigned)si);
            if (ties) /* 497 magnitudes, about 402 times each: the threshold falls among equals */
                for (size_t i = 0; i < CNT; i++)
                    x[i] = (x[i] < 0 ? -1.0f : 1.0f) * (1.0f + (float)(i % 497) / 497.0f);
            seg_sink_t sink;
            gcoll_select_stream_t rule;
            gcoll_tensor_state_t *s = encode_streamed(c, x, CNT, SEG, msg, cap, &len, &sink, &rule);
            assert_true(rule.streamed);
            assert_int_equal(sink.n, (CNT + SEG - 1) / SEG);
            if (ties)
                assert_true(rule.ties > 1);
            /* the rule applied by hand to the decoded candidates gives the message's pairs */
            size_t nsel = 0, kept = 0, tl = rule.ties;
            assert_int_equal(gcoll_codec_decode_pairs(c, msg, len, CNT, pi, pv, CNT, &nsel),
                             GCOLL_OK);
            for (size_t g = 0; g < sink.n; g++) {
                static uint32_t ci[SEG];
                static float cv[SEG];
                size_t m = 0;
                assert_int_equal(
                    gcoll_codec_decode_pairs(NULL, sink.buf[g], sink.len[g], CNT, ci, cv, SEG, &m),
                    GCOLL_OK);
                for (size_t q = 0; q < m; q++) {
                    uint32_t a;
                    memcpy(&a, &cv[q], 4);
                    a &= 0x7fffffffu;
                    if (a > rule.thr || (a == rule.thr && tl > 0 && tl--)) {
                        assert_true(kept < nsel);
                        assert_int_equal(ci[q], pi[kept]);
                        assert_true(cv[q] == pv[kept]);
                        kept++;
                    }
                }
            }
            assert_int_equal(kept, nsel);
            size_t cand = 0;
            for (size_t g = 0; g < sink.n; g++) {
                size_t m = 0;
                assert_int_equal(gcoll_decode_info(sink.buf[g], sink.len[g], NULL, &m), GCOLL_OK);
                cand += m;
            }
            /* another rank's plain pairs: a stateless top-k of other data */
            fill(y, CNT, 99);
            assert_int_equal(gcoll_encode(c, NULL, y, CNT, ymsg, cap, &ylen), GCOLL_OK);
            uint32_t *yi = malloc(CNT * sizeof(uint32_t));
            float *yv = malloc(CNT * sizeof(float));
            assert_int_equal(gcoll_codec_decode_pairs(c, ymsg, ylen, CNT, yi, yv, CNT, &yn),
                             GCOLL_OK);
            memset(want, 0, CNT * sizeof(float));
            assert_int_equal(gcoll_codec_decode(c, ymsg, ylen, want, CNT, GCOLL_DECODE_ADD),
                             GCOLL_OK);
            assert_int_equal(gcoll_codec_decode(c, msg, len, want, CNT, GCOLL_DECODE_ADD),
                             GCOLL_OK);
            for (size_t i = 0; i < CNT; i++)
                want[i] /= 2.0f;
            gcoll_sum_src_t src[2] = {{.idx = yi, .val = yv, .n = yn},
                                      {.msgs = (const uint8_t *const *)sink.buf,
                                       .lens = sink.len,
                                       .nmsg = sink.n,
                                       .seg = SEG,
                                       .filter = 1,
                                       .thr = rule.thr,
                                       .ties = rule.ties,
                                       .want = nsel,
                                       .cand = cand}};
            int bad = -1;
            assert_int_equal(gcoll_sum_sources(c, src, 2, got, CNT, 2.0f, &bad), GCOLL_OK);
            assert_memory_equal(got, want, CNT * sizeof(float));
            /* malformed chains: refused, the source named, out untouched */
            for (int how = 0; how < 7; how++) {
                gcoll_sum_src_t b = src[1];
                uint8_t *swap[SEGS_MAX];
                size_t lens[SEGS_MAX];
                memcpy(swap, sink.buf, sizeof(swap));
                memcpy(lens, sink.len, sizeof(lens));
                b.msgs = (const uint8_t *const *)swap;
                b.lens = lens;
                uint8_t *q8 = NULL;
                if (how == 0) { /* two segments swapped: indices outside their ranges */
                    swap[1] = sink.buf[2];
                    swap[2] = sink.buf[1];
                    lens[1] = sink.len[2];
                    lens[2] = sink.len[1];
                } else if (how == 1) {
                    b.want++;
                } else if (how == 2) { /* no trim rule: more pairs pass than announced */
                    assert_true(rule.thr > 0);
                    b.thr = 0;
                    b.ties = 0;
                } else if (how == 3) {
                    lens[3]--;
                } else if (how == 5) { /* more candidates announced than the segments hold */
                    b.cand++;
                } else if (how == 6) { /* a first segment shorter than a header */
                    lens[0] = 20;
                } else { /* a segment whose values are q8 */
                    gcoll_compressor_t *cq = mk("topk:density=0.5+q8");
                    size_t qn = 0, qcap = gcoll_codec_pairs_bound(cq, 4, CNT);
                    uint32_t qi[4] = {3 * SEG, 3 * SEG + 1, 3 * SEG + 2, 3 * SEG + 3};
                    float qv[4] = {1, 2, 3, 4};
                    q8 = malloc(qcap);
                    assert_int_equal(gcoll_codec_encode_pairs(cq, qi, qv, 4, CNT, q8, qcap, &qn),
                                     GCOLL_OK);
                    swap[3] = q8;
                    lens[3] = qn;
                    gcoll_compressor_destroy(cq);
                }
                for (size_t i = 0; i < CNT; i++)
                    got[i] = SENTINEL;
                gcoll_sum_src_t both[2] = {src[0], b};
                bad = -1;
                if (gcoll_sum_sources(c, both, 2, got, CNT, 1.0f, &bad) != GCOLL_ERR_INVALID)
                    fail_msg("%s: malformed chain %d accepted", specs[si], how);
                assert_int_equal(bad, 1);
                for (size_t i = 0; i < CNT; i++)
                    assert_true(got[i] == SENTINEL);
                free(q8);
            }
            free(yi);
            free(yv);
            sink_free(&sink);
            gcoll_state_destroy(s);
        }
        /* one magnitude everywhere: the sampled candidates overflow, the selection takes
         * the histogram path and says it did not come from the candidates */
        for (size_t i = 0; i < CNT; i++)
            x[i] = i % 3 ? 2.0f : -2.0f;
        seg_sink_t sink;
        gcoll_select_stream_t rule;
        gcoll_tensor_state_t *s = encode_streamed(c, x, CNT, SEG, msg, cap, &len, &sink, &rule);
        assert_false(rule.streamed);
        sink_free(&sink);
        gcoll_state_destroy(s);
        free(msg);
        free(ymsg);
        gcoll_compressor_destroy(c);
    }
    free(x);
    free(y);
    free(got);
    free(want);
    free(pi);
    free(pv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncation_and_trailing),
        cmocka_unit_test(test_header_fields),
        cmocka_unit_test(test_sparse_indices),
        cmocka_unit_test(test_delta_indices),
        cmocka_unit_test(test_idx_check_blocks),
        cmocka_unit_test(test_value_sections),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_sum_messages),
        cmocka_unit_test(test_sum_sources),
    };
    /* once with the generic (non-AVX2) kernels, once with what the CPU offers */
    gcoll_simd_set(GCOLL_SIMD_GENERIC);
    int rc = cmocka_run_group_tests_name("generic kernels", tests, NULL, NULL);
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    rc += cmocka_run_group_tests_name("best kernels", tests, NULL, NULL);
    return rc;
}
