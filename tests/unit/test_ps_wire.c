/* test_ps_wire.c: the parameter server's messages (lib/training/ps_wire.c) without a
 * network. Frames of pushes and compressed pull answers round-trip; every truncation and
 * every corrupted length field of a frame is refused before anything is written, for
 * dense, sparse and quantized codecs; the compressed pull's feedback is exact (the worker
 * that adds each answer holds the owner's view bit for bit, and the view plus the residual
 * is the model). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gcoll.h"
#include "training/ps_wire.h"
#include "base/util.h"

enum { NT = 3 };
static const size_t counts[NT] = {200, 0, 17}; /* an empty slice in the middle */

static float value(int t, size_t j)
{
    return (float)((int)((t * 7 + (int)j * 13) % 29) - 14) / 8.0f;
}

/* A frame of the three slices with codec spec, into buf; returns its length. */
static size_t make_frame(gcoll_compressor_t *c, uint8_t *buf, size_t cap, float src[NT][200])
{
    const float *s[NT];
    for (int t = 0; t < NT; t++) {
        for (size_t j = 0; j < counts[t]; j++)
            src[t][j] = value(t, j);
        s[t] = src[t];
    }
    size_t len = 0;
    gcoll_ps_put_hdr(buf, GCOLL_PS_PUSH, 5, 4, NT);
    assert_true(gcoll_ps_frame_bound(c, counts, NT) <= cap);
    assert_int_equal(gcoll_ps_frame_encode(c, NULL, s, counts, NT, buf, cap, &len), GCOLL_OK);
    return len;
}

static const char *specs[] = {"none", "topk:density=0.1", "q8", "topk:density=0.2+q8", "fp16"};

/* The compressor of specs[k], and its frame of the three slices in buf (*len_p bytes). */
static gcoll_compressor_t *spec_frame(size_t k, uint8_t *buf, size_t cap, float src[NT][200],
                                      size_t *len_p)
{
    gcoll_compressor_t *c;
    assert_int_equal(gcoll_compressor_create(specs[k], &c), GCOLL_OK);
    *len_p = make_frame(c, buf, cap, src);
    return c;
}

static void test_frame_roundtrip(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
        uint8_t buf[4096];
        float src[NT][200], out[NT][200], ref[NT][200];
        size_t len;
        gcoll_compressor_t *c = spec_frame(k, buf, sizeof(buf), src, &len);
        gcoll_ps_hdr_t h;
        assert_int_equal(gcoll_ps_get_hdr(buf, len, &h), GCOLL_OK);
        assert_true(h.kind == GCOLL_PS_PUSH && h.a == 5 && h.b == 4 && h.c == NT);
        float *dst[NT] = {out[0], out[1], out[2]};
        char why[128];
        assert_int_equal(gcoll_ps_frame_decode(c, buf, len, dst, counts, NT, 0, why, sizeof(why)),
                         GCOLL_OK);
        /* the reference: each slice's own message decoded by the codec */
        for (int t = 0; t < NT; t++) {
            if (!counts[t])
                continue;
            uint8_t one[2048];
            size_t l;
            assert_int_equal(gcoll_encode(c, NULL, src[t], counts[t], one, sizeof(one), &l),
                             GCOLL_OK);
            assert_int_equal(gcoll_decode(c, one, l, ref[t], counts[t], 0), GCOLL_OK);
            assert_memory_equal(out[t], ref[t], counts[t] * sizeof(float));
        }
        gcoll_compressor_destroy(c);
    }
}

/* Every prefix, every overlong length field, a non-empty message for the empty slice and
 * trailing bytes: refused, and the destination untouched. */
static void test_frame_malformed(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
        uint8_t buf[4096], bad[4100];
        float src[NT][200], out[NT][200];
        size_t len;
        gcoll_compressor_t *c = spec_frame(k, buf, sizeof(buf), src, &len);
        float *dst[NT] = {out[0], out[1], out[2]};
        char why[128];
        size_t refused = 0;
        for (size_t l = 0; l < len; l++) {
            for (int t = 0; t < NT; t++)
                for (size_t j = 0; j < 200; j++)
                    out[t][j] = 42.0f;
            gcoll_status_t st =
                gcoll_ps_frame_decode(c, buf, l, dst, counts, NT, 0, why, sizeof(why));
            if (st != GCOLL_ERR_INVALID)
                fail_msg("%s: a frame cut to %zu of %zu bytes was taken", specs[k], l, len);
            for (int t = 0; t < NT; t++)
                for (size_t j = 0; j < 200; j++)
                    assert_true(out[t][j] == 42.0f);
            refused++;
        }
        /* the length fields: at 32, after the first message, after the empty one */
        size_t l0 = gcoll_get_u32(buf + GCOLL_PS_HDR);
        size_t at[3] = {GCOLL_PS_HDR, GCOLL_PS_HDR + 4 + l0, GCOLL_PS_HDR + 8 + l0};
        uint32_t vals[] = {0, 1, 3, (uint32_t)len, 0x7fffffffu, 0xffffffffu};
        for (int f = 0; f < 3; f++) {
            uint32_t orig = gcoll_get_u32(buf + at[f]);
            for (size_t v = 0; v < sizeof(vals) / sizeof(vals[0]); v++) {
                if (vals[v] == orig)
                    continue;
                memcpy(bad, buf, len);
                gcoll_put_u32(bad + at[f], vals[v]);
                assert_int_equal(
                    gcoll_ps_frame_decode(c, bad, len, dst, counts, NT, 0, why, sizeof(why)),
                    GCOLL_ERR_INVALID);
                refused++;
            }
        }
        /* trailing bytes */
        memcpy(bad, buf, len);
        memset(bad + len, 0, 3);
        assert_int_equal(
            gcoll_ps_frame_decode(c, bad, len + 3, dst, counts, NT, 0, why, sizeof(why)),
            GCOLL_ERR_INVALID);
        assert_non_null(strstr(why, "trailing"));
        /* a frame for other slice counts (another owner's, or another model) */
        size_t other[NT] = {200, 0, 16};
        assert_int_equal(gcoll_ps_frame_decode(c, buf, len, dst, other, NT, 0, why, sizeof(why)),
                         GCOLL_ERR_INVALID);
        size_t fewer[NT - 1] = {200, 0};
        assert_int_equal(gcoll_ps_frame_decode(c, buf, len, dst, fewer, NT - 1, 0, NULL, 0),
                         GCOLL_ERR_INVALID);
        print_message("%s: %zu-byte frame, %zu malformed forms refused\n", specs[k], len,
                      refused + 3);
        gcoll_compressor_destroy(c);
    }
    /* the header */
    uint8_t h[GCOLL_PS_HDR];
    gcoll_ps_hdr_t hd;
    gcoll_ps_put_hdr(h, GCOLL_PS_REPLY, 1, 2, 3);
    assert_int_equal(gcoll_ps_get_hdr(h, GCOLL_PS_HDR - 1, &hd), GCOLL_ERR_INVALID);
    h[0] ^= 1;
    assert_int_equal(gcoll_ps_get_hdr(h, GCOLL_PS_HDR, &hd), GCOLL_ERR_INVALID);
}

/* The server's fused apply: a frame of fp32 as it is ('none') is added times a to the
 * destination, as decoding it and adding would (a is a power of two, so a x is exact and
 * the one rounding of the sum is the same with or without a fused multiply-add); another
 * codec is refused, and so is every truncation and a non-finite value, with nothing
 * written. */
static void test_frame_axpy(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
        uint8_t buf[4096];
        float src[NT][200], out[NT][200], ref[NT][200];
        size_t len;
        gcoll_compressor_t *c = spec_frame(k, buf, sizeof(buf), src, &len);
        float *dst[NT] = {out[0], out[1], out[2]};
        for (int t = 0; t < NT; t++)
            for (size_t j = 0; j < 200; j++)
                out[t][j] = ref[t][j] = 1.0f / (float)(j + 3);
        const int exact = !strcmp(specs[k], "none");
        assert_int_equal(gcoll_ps_exact(c), exact);
        char why[128];
        assert_int_equal(gcoll_ps_frame_axpy(c, buf, len, dst, counts, NT, 0.25f, why, sizeof(why)),
                         exact ? GCOLL_OK : GCOLL_ERR_INVALID);
        for (int t = 0; t < NT; t++)
            for (size_t j = 0; j < counts[t] && exact; j++)
                ref[t][j] += 0.25f * src[t][j];
        for (int t = 0; t < NT; t++)
            assert_memory_equal(out[t], ref[t], sizeof(out[t]));
        for (size_t l = 0; l < len; l++)
            assert_int_equal(gcoll_ps_frame_axpy(c, buf, l, dst, counts, NT, 0.25f, NULL, 0),
                             GCOLL_ERR_INVALID);
        if (exact) {
            /* the same frame one byte off its alignment adds the same again */
            static uint8_t odd[4097];
            memcpy(odd + 1, buf, len);
            for (int t = 0; t < NT; t++)
                for (size_t j = 0; j < counts[t]; j++)
                    ref[t][j] += 0.25f * src[t][j];
            assert_int_equal(gcoll_ps_frame_axpy(c, odd + 1, len, dst, counts, NT, 0.25f, NULL, 0),
                             GCOLL_OK);
            for (int t = 0; t < NT; t++)
                assert_memory_equal(out[t], ref[t], sizeof(out[t]));
            /* a NaN in the last slice: refused before the first is touched */
            uint8_t bad[4096];
            memcpy(bad, buf, len);
            const float nan = NAN;
            memcpy(bad + len - sizeof(float), &nan, sizeof(nan));
            assert_int_equal(gcoll_ps_frame_axpy(c, bad, len, dst, counts, NT, 0.25f, NULL, 0),
                             GCOLL_ERR_INVALID);
            assert_int_equal(gcoll_ps_frame_decode(c, bad, len, dst, counts, NT, 1, NULL, 0),
                             GCOLL_ERR_INVALID);
        }
        for (int t = 0; t < NT; t++)
            assert_memory_equal(out[t], ref[t], sizeof(out[t]));
        gcoll_compressor_destroy(c);
    }
}

/* The compressed pull over 30 answers while the model moves: the worker adds each answer
 * to its copy and holds the owner's view bit for bit; the residual w - view shrinks under
 * top-k between moves (a contraction) and the model is view + residual exactly in the
 * arithmetic the owner uses. */
static void test_delta_feedback(void **state)
{
    (void)state;
    const char *pspecs[] = {"topk:density=0.1", "q8", "fp16"};
    enum { N = 217 };
    const size_t cnt[2] = {200, 17};
    for (size_t k = 0; k < 3; k++) {
        gcoll_compressor_t *c;
        assert_int_equal(gcoll_compressor_create(pspecs[k], &c), GCOLL_OK);
        float w[N], view[N], worker[N], scratch[N];
        for (size_t j = 0; j < N; j++)
            w[j] = view[j] = worker[j] = value(0, j);
        uint8_t buf[4096];
        double last = 0;
        for (int round = 0; round < 30; round++) {
            if (round % 3 == 0) /* the shard completes a clock */
                for (size_t j = 0; j < N; j++)
                    w[j] -= 0.05f * value(round, j);
            double before = 0, after = 0;
            for (size_t j = 0; j < N; j++)
                before += (double)(w[j] - view[j]) * (w[j] - view[j]);
            size_t len;
            gcoll_ps_put_hdr(buf, GCOLL_PS_REPLY, (uint64_t)round, 1, 2);
            assert_true(gcoll_ps_frame_bound(c, cnt, 2) <= sizeof(buf));
            assert_int_equal(
                gcoll_ps_encode_delta(c, w, view, scratch, cnt, 2, buf, sizeof(buf), &len),
                GCOLL_OK);
            float *dst[2] = {worker, worker + 200};
            assert_int_equal(gcoll_ps_frame_decode(c, buf, len, dst, cnt, 2, 1, NULL, 0), GCOLL_OK);
            assert_memory_equal(worker, view, sizeof(view));
            for (size_t j = 0; j < N; j++)
                after += (double)(w[j] - view[j]) * (w[j] - view[j]);
            if (!strncmp(pspecs[k], "topk", 4) && before > 0)
                assert_true(after <= 0.9 * before + 1e-12); /* k = n/10: delta >= 0.1 */
            last = after;
        }
        print_message("pull %s: worker == owner's view over 30 answers, final residual "
                      "norm^2 %.3g\n",
                      pspecs[k], last);
        gcoll_compressor_destroy(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_roundtrip),
        cmocka_unit_test(test_frame_malformed),
        cmocka_unit_test(test_frame_axpy),
        cmocka_unit_test(test_delta_feedback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
