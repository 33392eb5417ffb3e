/* test_randomk_momentum.c: randomk:momentum=M, the random-k codec that takes an SGD
 * optimizer's momentum M (docs/compressors.md, "Random-k with error feedback"): its residual
 * takes g/(1-M) each step, the selection is random-k's own, and the spec rules. Checked
 * against a reference residual kept here in double precision, and against classic random-k
 * fed g/(1-M). */
#include <float.h>
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

#include "compress_test_util.h"

/* Over several steps, what is sent is the reference residual r += g/(1-M) at k indices,
 * and the indices are those classic random-k (same seed, same step) picks when fed
 * g/(1-M) itself. Tolerance: each element's float residual differs from the double one
 * by at most two roundings a step (of g/(1-M) and of the sum), each at most FLT_EPSILON
 * times acc, the sum of |g|/(1-M) over the steps so far: (steps + 2) x 2 x FLT_EPSILON x
 * acc. A gain off by 0.1% already fails. */
static void test_gain_against_reference(void **unused)
{
    (void)unused;
    static const struct {
        const char *spec, *classic;
        double m;
    } cases[] = {
        {"randomk:density=0.01,seed=5,momentum=0.9", "randomk:density=0.01,seed=5", 0.9},
        {"randomk:density=0.05,seed=9,momentum=0.5", "randomk:density=0.05,seed=9", 0.5},
    };
    const size_t n = 10007;
    const int steps = 40;
    float *g = malloc(n * 4), *gs = malloc(n * 4), *d = malloc(n * 4), *dc = malloc(n * 4);
    double *r = calloc(n, sizeof(double)), *acc = calloc(n, sizeof(double));
    FOR_EACH_SIMD(lvl)
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(*cases); ci++) {
        gcoll_compressor_t *c = mk(cases[ci].spec), *cc = mk(cases[ci].classic);
        assert_non_null(strstr(gcoll_compressor_spec(c), "momentum="));
        gcoll_tensor_state_t *s, *sc;
        assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
        assert_int_equal(gcoll_state_create(cc, n, &sc), GCOLL_OK);
        memset(r, 0, n * sizeof(double));
        memset(acc, 0, n * sizeof(double));
        /* the codec keeps M as a float (as dgc's momentum) */
        const double gain = 1.0 / (1.0 - (double)(float)cases[ci].m);
        for (int step = 0; step < steps; step++) {
            fill(g, n, 700 + (uint64_t)step);
            for (size_t i = 0; i < n; i++) {
                gs[i] = (float)(g[i] * gain);
                r[i] += g[i] * gain;
                acc[i] += fabs(g[i] * gain);
            }
            size_t len, lenc;
            uint8_t *b = encode_alloc(c, s, g, n, &len);
            uint8_t *bc = encode_alloc(cc, sc, gs, n, &lenc);
            assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
            assert_int_equal(gcoll_decode(cc, bc, lenc, dc, n, 0), GCOLL_OK);
            const float *e = gcoll_state_residual(s);
            size_t sent = 0, k = gcoll_codec_k(c, n, (uint64_t)step);
            for (size_t i = 0; i < n; i++) {
                double tol = (double)(step + 2) * 2.0 * FLT_EPSILON * acc[i];
                /* the same indices as classic random-k, the same values up to rounding */
                assert_true((d[i] != 0.0f) == (dc[i] != 0.0f) || r[i] == 0.0);
                if (fabs((double)d[i] - (double)dc[i]) > tol)
                    fail_msg("%s step %d element %zu: %a, classic random-k %a", cases[ci].spec,
                             step, i, (double)d[i], (double)dc[i]);
                /* what travels plus what stays is the reference residual */
                if (fabs((double)d[i] + (double)e[i] - r[i]) > tol)
                    fail_msg("%s step %d element %zu: sent %a + residual %a, reference %a",
                             cases[ci].spec, step, i, (double)d[i], (double)e[i], r[i]);
                if (d[i] != 0.0f) {
                    sent++;
                    r[i] -= d[i]; /* the reference follows what was sent */
                }
            }
            assert_true(sent <= k && sent + k / 10 + 2 >= k); /* exact zeros are not counted */
            free(b);
            free(bc);
        }
        gcoll_state_destroy(s);
        gcoll_state_destroy(sc);
        gcoll_compressor_destroy(c);
        gcoll_compressor_destroy(cc);
    }
    gcoll_simd_set(GCOLL_SIMD_AUTO);
    free(g);
    free(gs);
    free(d);
    free(dc);
    free(r);
    free(acc);
}

/* Without a state nothing is fed back, and nothing is scaled either: the same message as
 * classic random-k's. */
static void test_stateless_unscaled(void **unused)
{
    (void)unused;
    const size_t n = 4099;
    float *g = malloc(n * 4);
    fill(g, n, 31);
    gcoll_compressor_t *c = mk("randomk:density=0.1,seed=2,momentum=0.9");
    gcoll_compressor_t *cc = mk("randomk:density=0.1,seed=2");
    size_t len, lenc;
    uint8_t *b = encode_alloc(c, NULL, g, n, &len), *bc = encode_alloc(cc, NULL, g, n, &lenc);
    assert_int_equal(len, lenc);
    assert_memory_equal(b, bc, len);
    free(b);
    free(bc);
    free(g);
    gcoll_compressor_destroy(c);
    gcoll_compressor_destroy(cc);
}

/* The key: canonical form, round trip, and where it is refused. */
static void test_spec(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("randomk:density=0.01,momentum=0.9");
    const char *canon = gcoll_compressor_spec(c);
    assert_non_null(strstr(canon, "feedback=ef"));
    assert_non_null(strstr(canon, "momentum=0.9"));
    gcoll_compressor_t *c2 = mk(canon);
    assert_string_equal(gcoll_compressor_spec(c2), canon);
    gcoll_compressor_destroy(c2);
    gcoll_compressor_destroy(c);
    /* without the key (or with 0) the canonical spec is the one it always was */
    c = mk("randomk:density=0.01,momentum=0");
    assert_null(strstr(gcoll_compressor_spec(c), "momentum"));
    c2 = mk("randomk:density=0.01");
    assert_string_equal(gcoll_compressor_spec(c), gcoll_compressor_spec(c2));
    gcoll_compressor_destroy(c);
    gcoll_compressor_destroy(c2);
    static const char *bad[] = {
        "randomk:density=0.01,momentum=0.9,ef=0",
        "randomk:density=0.01,feedback=ef21,momentum=0.9",
        "randomk:density=0.01,momentum=1",
        "randomk:density=0.01,momentum=-0.1",
        "randomk:density=0.01,momentum=0.9,momentum=0.9",
        "randomk:density=0.01,momentum=x",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        char err[256];
        gcoll_compressor_t *x = NULL;
        if (gcoll_compressor_create(bad[i], &x) == GCOLL_OK)
            fail_msg("'%s' accepted", bad[i]);
        assert_int_equal(gcoll_compressor_check(bad[i], err, sizeof(err)), GCOLL_ERR_INVALID);
        assert_non_null(strstr(err, "momentum"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gain_against_reference),
        cmocka_unit_test(test_stateless_unscaled),
        cmocka_unit_test(test_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
