/* test_warmup.c: warm-up schedules (densities and bit widths step by step, the messages
 * they give), per-layer selection of a fused tensor, and the layer policy by layer. */
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
#include "compress/wire.h"
#include "bucket/policy.h"

#include "compress_test_util.h"

static int close_to(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fabs(b);
}

/* exp: four equal stages, geometric from warmup_start to the target. 1 to 1/16 has ratio
 * 1/2 per stage: 1, 0.5, 0.25, 0.125, then 0.0625. */
static void test_density_exp(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("topk:density=0.0625,warmup_steps=8");
    const double want[] = {1, 1, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125, 0.0625, 0.0625};
    for (uint64_t t = 0; t < 10; t++)
        assert_true(close_to(gcoll_codec_density(c, t), want[t]));
    assert_true(gcoll_codec_density(c, 1u << 30) == 0.0625);
    gcoll_compressor_destroy(c);
    /* the paper's stages from 0.25: 75%, 93.75%, 98.4375%, 99.6%, then 99.9% sparsity */
    c = mk("dgc:density=0.001,warmup_steps=400,warmup_start=0.25");
    const double paper[] = {0.25, 0.0625, 0.015625, 0.004};
    for (uint64_t t = 0; t < 400; t++) {
        double d = gcoll_codec_density(c, t), p = paper[t / 100];
        assert_true(fabs(d - p) < 0.013 * p); /* within 1.3% of the paper's */
    }
    assert_true(gcoll_codec_density(c, 400) == 0.001);
    gcoll_compressor_destroy(c);
    /* never sparser than the target */
    c = mk("randomk:density=0.5,warmup_steps=8,warmup_start=0.6");
    for (uint64_t t = 0; t < 10; t++)
        assert_true(gcoll_codec_density(c, t) >= 0.5);
    gcoll_compressor_destroy(c);
}

static void test_density_linear_step(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("topk:density=0.1,warmup_steps=10,schedule=linear");
    for (uint64_t t = 0; t < 10; t++)
        assert_true(close_to(gcoll_codec_density(c, t), 1.0 - 0.09 * (double)t));
    assert_true(gcoll_codec_density(c, 10) == 0.1);
    gcoll_compressor_destroy(c);
    c = mk("dgc:density=0.01,warmup_steps=5,warmup_start=0.5,schedule=step");
    for (uint64_t t = 0; t < 5; t++)
        assert_true(gcoll_codec_density(c, t) == 0.5);
    assert_true(gcoll_codec_density(c, 5) == 0.01);
    gcoll_compressor_destroy(c);
    c = mk("randomk:density=0.01,warmup_steps=5,schedule=none");
    assert_true(gcoll_codec_density(c, 0) == 0.01);
    gcoll_compressor_destroy(c);
    c = mk("topk:density=0.01"); /* no warm-up unless asked */
    assert_true(gcoll_codec_density(c, 0) == 0.01);
    gcoll_compressor_destroy(c);
}

/* qsgd's bit width: 8 to 2 in four stages of a geometric schedule (8, 5.66, 4, 2.83
 * rounded), linearly, by a step. */
static void test_bits_schedule(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("qsgd:bits=2,warmup_steps=8");
    const unsigned want[] = {8, 8, 6, 6, 4, 4, 3, 3, 2, 2};
    for (uint64_t t = 0; t < 10; t++)
        assert_int_equal(gcoll_codec_bits(c, t), want[t]);
    gcoll_compressor_t at;
    assert_int_equal(gcoll_codec_at_step(c, 0, &at), 1);
    assert_int_equal(at.vs.bits, 8);
    assert_non_null(strstr(at.spec, "qsgd:bits=8"));
    assert_int_equal(gcoll_codec_at_step(c, 8, &at), 0);
    gcoll_compressor_destroy(c);
    c = mk("qsgd:bits=4,warmup_steps=4,warmup_bits=8,schedule=linear");
    const unsigned lin[] = {8, 7, 6, 5, 4};
    for (uint64_t t = 0; t < 5; t++)
        assert_int_equal(gcoll_codec_bits(c, t), lin[t]);
    gcoll_compressor_destroy(c);
    c = mk("qsgd:bits=3,warmup_steps=3,warmup_bits=6,schedule=step");
    assert_int_equal(gcoll_codec_bits(c, 2), 6);
    assert_int_equal(gcoll_codec_bits(c, 3), 3);
    gcoll_compressor_destroy(c);
}

static void test_spec_keys(void **unused)
{
    (void)unused;
    static const char *good[] = {
        "topk:density=0.01,warmup_steps=100,warmup_start=0.25,schedule=linear",
        "randomk:density=0.01,warmup_steps=10",
        "dgc:density=0.001,warmup_start=0.25",
        "qsgd:bits=2,warmup_steps=50,warmup_bits=6",
        "topk:density=0.01,warmup_steps=0",
        "topk:density=0.01+q8",
        "dgc:density=0.001"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        gcoll_compressor_t *c = mk(good[i]), *d = mk(c->spec);
        assert_string_equal(c->spec, d->spec); /* canonical parses back to itself */
        assert_int_equal(c->warmup_given & GCOLL_WARMUP_STEPS_GIVEN,
                         d->warmup_given & GCOLL_WARMUP_STEPS_GIVEN);
        assert_true(c->warmup_start == d->warmup_start);
        gcoll_compressor_destroy(c);
        gcoll_compressor_destroy(d);
    }
    /* given steps (even 0) are kept apart from none given: a caller's default applies
     * only to the latter */
    gcoll_compressor_t *c = mk("topk:density=0.01,warmup_steps=0");
    assert_true(c->warmup_given & GCOLL_WARMUP_STEPS_GIVEN);
    gcoll_compressor_destroy(c);
    c = mk("topk:density=0.01");
    assert_int_equal(c->warmup_given, 0);
    assert_null(strstr(c->spec, "warmup"));
    gcoll_compressor_destroy(c);
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"topk:density=0.01,warmup_start=0", "warmup_start=0"},
        {"topk:density=0.01,warmup_start=1.5", "warmup_start=1.5"},
        {"topk:density=0.1,warmup_start=0.05", "below density"},
        {"topk:k=5,warmup_start=0.5", "warm-up needs density"},
        {"qsgd:bits=4,warmup_bits=3", "below bits"},
        {"qsgd:bits=4,warmup_start=0.5", "warmup_start"},
        {"topk:density=0.01,warmup_bits=8", "warmup_bits"},
        {"threshold:tau=0.1,warmup_steps=3", "warmup_steps"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        char err[256];
        assert_int_equal(gcoll_compressor_check(bad[i].spec, err, sizeof(err)), GCOLL_ERR_INVALID);
        if (!strstr(err, bad[i].needle))
            fail_msg("error for '%s' does not name '%s': %s", bad[i].spec, bad[i].needle, err);
    }
}

/* The messages follow the schedule: nnz = ceil(density x n) at every step, the header's
 * sizes add up to the length, and a dense stage travels as a dense message. */
static void test_messages_per_step(void **unused)
{
    (void)unused;
    static const char *specs[] = {"topk:density=0.001,warmup_steps=12,schedule=exp",
                                  "dgc:density=0.001,warmup_steps=12,schedule=linear,select=exact",
                                  "randomk:density=0.001,warmup_steps=12,warmup_start=0.5"};
    const size_t n = 20000;
    float *x = malloc(n * sizeof(float));
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        gcoll_compressor_t *c = mk(specs[sp]);
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        for (uint64_t t = 0; t < 14; t++) {
            fill(x, n, 500 + t);
            for (size_t i = 0; i < n; i++)
                x[i] = x[i] == 0 ? 1e-3f : x[i];
            size_t len, nnz;
            uint8_t *b = encode_alloc(c, s, x, n, &len);
            assert_int_equal(gcoll_decode_info(b, len, NULL, &nnz), GCOLL_OK);
            double d = gcoll_codec_density(c, t);
            size_t k = (size_t)ceil(d * (double)n - 1e-9);
            gcoll_wire_hdr_t h;
            assert_int_equal(gcoll_wire_parse_hdr(b, len, n, &h), GCOLL_OK);
            assert_int_equal(GCOLL_WIRE_HDR + h.payload_len, len);
            if (h.flags & GCOLL_WIRE_F_DENSE) {
                /* (index, value) pairs of more than half the tensor: dense is smaller */
                assert_true(8 * k > 4 * n);
                assert_int_equal(len, GCOLL_WIRE_HDR + 4 * n);
            } else {
                if (nnz != k)
                    fail_msg("%s step %llu: %zu pairs, want %zu", specs[sp], (unsigned long long)t,
                             nnz, k);
                if (c->sparsify == GCOLL_SPARSIFY_RANDOMK) /* values only */
                    assert_int_equal(len, GCOLL_WIRE_HDR + 4 * k);
                else /* indices (raw or delta-packed, whichever is smaller) and values */
                    assert_true(len <= GCOLL_WIRE_HDR + 8 * k && len > GCOLL_WIRE_HDR + 4 * k);
            }
            free(b);
        }
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    free(x);
}

/* A fused tensor of three layers of different scales: per-layer top-k takes
 * ceil(density x length) of each, by |x| within the layer; the bound covers it. */
static void test_select_per_layer(void **unused)
{
    (void)unused;
    const size_t ends[3] = {5000, 9000, 9010}, n = 9010;
    float *x = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float m = (float)((i * 7919) % 10007 + 1) / 10007.0f;
        x[i] = i < 5000 ? m : i < 9000 ? m * 1e-3f : m * 1e-6f;
    }
    static const char *specs[] = {"topk:density=0.01", "topk:density=0.01,select=sample",
                                  "topk:density=0.01,select=reuse", "dgc:density=0.01"};
    for (size_t sp = 0; sp < sizeof(specs) / sizeof(*specs); sp++) {
        for (int layered = 0; layered < 2; layered++) {
            gcoll_compressor_t *c = mk(specs[sp]);
            if (layered) {
                c->layer_end = ends;
                c->nlayers = 3;
            }
            gcoll_tensor_state_t *s;
            assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
            size_t len;
            uint8_t *b = encode_alloc(c, s, x, n, &len);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            size_t cnt[3] = {0, 0, 0};
            for (size_t i = 0; i < n; i++)
                cnt[i < 5000 ? 0 : i < 9000 ? 1 : 2] += d[i] != 0;
            if (layered) {
                assert_int_equal(cnt[0], 50);
                assert_int_equal(cnt[1], 40);
                assert_int_equal(cnt[2], 1);
                assert_int_equal(gcoll_codec_k_range(c, 0, n, 0), 91);
                /* each kept value is among its layer's 1% largest: above the layer's
                 * (100 - 1)th percentile (values are a permutation scaled) */
                for (size_t i = 0; i < 5000; i++)
                    assert_true(d[i] == 0 || d[i] >= 0.98f);
                for (size_t i = 5000; i < 9000; i++)
                    assert_true(d[i] == 0 || d[i] >= 0.98e-3f);
            } else {
                assert_int_equal(cnt[0], 91); /* ceil(0.01 x 9010): all from the largest */
                assert_int_equal(cnt[1] + cnt[2], 0);
            }
            /* what was sent plus the residual is the input */
            const float *e = gcoll_state_residual(s);
            for (size_t i = 0; i < n; i++)
                assert_true(d[i] + e[i] == x[i]);
            free(b);
            gcoll_state_destroy(s);
            gcoll_compressor_destroy(c);
        }
    }
    free(x);
    free(d);
}

/* DGC's local clipping: each rank's gradient to clip/sqrt(N) before accumulation, N the
 * ranks of the collective (Lin et al. 2018); density 1 sends the whole accumulation. */
static void test_dgc_local_clip(void **unused)
{
    (void)unused;
    const size_t n = 1000;
    float *g = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) /* norm about 155, far above the bound */
        g[i] = (float)((int)(i % 17) - 8);
    for (int N = 1; N <= 4; N *= 4) {
        gcoll_compressor_t *c = mk("dgc:density=1,momentum=0.9,clip=2");
        gcoll_tensor_state_t *s;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        s->nranks = N;
        size_t len;
        uint8_t *b = encode_alloc(c, s, g, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        double dn = 0;
        for (size_t i = 0; i < n; i++)
            dn += (double)d[i] * d[i];
        assert_true(fabs(sqrt(dn) - 2.0 / sqrt((double)N)) < 1e-5);
        free(b);
        gcoll_state_destroy(s);
        gcoll_compressor_destroy(c);
    }
    free(g);
    free(d);
}

/* Layer policy: the MLP of gcoll-train (registered in backward order, biases first) and
 * ResNet-50 names; first and last are layers; a size rule does not shadow them. */
static const char *pick(const gcoll_policy_t *p, const char *const *names, int nt, int i)
{
    int in_first = gcoll_policy_same_layer(names[i], names[nt - 1]);
    int in_last = gcoll_policy_same_layer(names[i], names[0]);
    return gcoll_policy_pick(p, names[i], 100000, in_first, in_last, "D", NULL);
}

static void test_policy_layers(void **unused)
{
    (void)unused;
    assert_int_equal(gcoll_policy_layer_len("layer1.0.conv1.weight"), 14);
    assert_int_equal(gcoll_policy_layer_len("fc"), 2);
    assert_true(gcoll_policy_same_layer("fc2.weight", "fc2.bias"));
    assert_false(gcoll_policy_same_layer("fc2.weight", "fc1.weight"));
    assert_false(gcoll_policy_same_layer("bn1.weight", "conv1.weight"));
    static const char *mlp[] = {"fc3.bias",   "fc3.weight", "fc2.bias",
                                "fc2.weight", "fc1.bias",   "fc1.weight"};
    gcoll_policy_t p;
    char err[256];
    assert_int_equal(gcoll_policy_parse("first=fp16;last=bf16", &p, err, sizeof(err)), GCOLL_OK);
    const char *want[] = {"bf16", "bf16", "D", "D", "fp16", "fp16"};
    for (int i = 0; i < 6; i++)
        assert_string_equal(pick(&p, mlp, 6, i), want[i]);
    gcoll_policy_free(&p);
    /* a name rule before first still wins: biases dense, fc1's weight by first */
    assert_int_equal(gcoll_policy_parse("*bias*=none;first=fp16", &p, err, sizeof(err)), GCOLL_OK);
    assert_string_equal(pick(&p, mlp, 6, 4), "none");
    assert_string_equal(pick(&p, mlp, 6, 5), "fp16");
    gcoll_policy_free(&p);
    /* size<16384 does not shadow first for conv1 (9408 weights), but applies elsewhere */
    assert_int_equal(gcoll_policy_parse("size<16384=none;first=fp16", &p, err, sizeof(err)),
                     GCOLL_OK);
    assert_string_equal(gcoll_policy_pick(&p, "conv1.weight", 9408, 1, 0, "D", NULL), "fp16");
    assert_string_equal(gcoll_policy_pick(&p, "bn1.weight", 64, 0, 0, "D", NULL), "none");
    assert_string_equal(gcoll_policy_pick(&p, "fc.bias", 1000, 0, 1, "D", NULL), "none");
    int rule = 9;
    assert_string_equal(gcoll_policy_pick(&p, "fc.weight", 2048000, 0, 1, "D", &rule), "D");
    assert_int_equal(rule, -1);
    gcoll_policy_free(&p);
    /* type: rules are gcoll.torch's (module classes): refused here, saying so */
    assert_int_equal(gcoll_policy_parse("*bias*=none;type:Conv*=fp16", &p, err, sizeof(err)),
                     GCOLL_ERR_INVALID);
    assert_non_null(strstr(err, "PyTorch module classes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_density_exp),       cmocka_unit_test(test_density_linear_step),
        cmocka_unit_test(test_bits_schedule),     cmocka_unit_test(test_spec_keys),
        cmocka_unit_test(test_messages_per_step), cmocka_unit_test(test_select_per_layer),
        cmocka_unit_test(test_dgc_local_clip),    cmocka_unit_test(test_policy_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
