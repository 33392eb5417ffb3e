/* test_compress_vq.c: vector quantization: the contraction, against a uniform scalar
 * quantizer of the same bits on clustered data, the warm start, sizes, malformed messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "compress_test_util.h"
#include "gcoll.h"

/* Gradient-like clustered data: n / D vectors near one of `centers` random directions with
 * magnitudes spread over two decades, plus 5% noise. */
static void clustered(float *x, size_t n, size_t D, size_t centers, uint64_t seed)
{
    float *c = malloc(centers * D * sizeof(float));
    rng_s = seed;
    for (size_t i = 0; i < centers * D; i++)
        c[i] = rndf() * powf(10.0f, (float)(rnd32() % 3) - 2.0f);
    for (size_t v = 0; v * D < n; v++) {
        size_t k = rnd32() % centers;
        for (size_t j = 0; j < D && v * D + j < n; j++)
            x[v * D + j] = c[k * D + j] * (1.0f + 0.05f * rndf());
    }
    free(c);
}

static double sq(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)a[i] - (b ? b[i] : 0.0f);
        s += t * t;
    }
    return s;
}

/* The uniform scalar quantizer of L levels over [-max, max] (bin midpoints), nearest. */
static double uniform_err(const float *x, size_t n, unsigned L)
{
    float mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmaxf(mx, fabsf(x[i]));
    double w = 2.0 * mx / L, e = 0;
    for (size_t i = 0; i < n; i++) {
        double b = floor((x[i] + mx) / w);
        b = b > L - 1 ? L - 1 : b;
        double q = -mx + (b + 0.5) * w, t = q - x[i];
        e += t * t;
    }
    return e;
}

static void test_vs_scalar_and_contraction(void **unused)
{
    (void)unused;
    struct {
        const char *spec;
        size_t D;
        unsigned levels; /* the scalar quantizer with the same bits a value: 2^(B/D) */
    } cases[] = {{"vq:dim=4,bits=8", 4, 4}, {"vq:dim=8,bits=8", 8, 2}, {"vq:dim=2,bits=4", 2, 4}};
    const size_t n = 20000;
    float *x = malloc(n * 4), *d = malloc(n * 4);
    for (size_t k = 0; k < 3; k++) {
        clustered(x, n, cases[k].D, 40, 7 + k);
        gcoll_compressor_t *c = mk(cases[k].spec);
        size_t len;
        uint8_t *b = encode_alloc(c, NULL, x, n, &len);
        size_t K = (size_t)1 << (strstr(cases[k].spec, "bits=8") ? 8 : 4);
        assert_int_equal(len,
                         48 + 4 * K * cases[k].D + (n / cases[k].D * (K == 256 ? 8 : 4) + 7) / 8);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        double ev = sq(d, x, n), es = uniform_err(x, n, cases[k].levels), nx = sq(x, NULL, n);
        if (!(ev < es))
            fail_msg("%s: vq error %g not below the scalar quantizer's %g", cases[k].spec, ev, es);
        /* the contraction, vector by vector (codeword 0 is zero) */
        for (size_t v = 0; v < n / cases[k].D; v++) {
            size_t o = v * cases[k].D;
            assert_true(sq(d + o, x + o, cases[k].D) <= sq(x + o, NULL, cases[k].D) * (1 + 1e-6));
        }
        assert_true(ev < nx);
        print_message("%s: ||Q(x) - x||^2 / ||x||^2 = %.4g, uniform scalar %u levels %.4g\n",
                      cases[k].spec, ev / nx, cases[k].levels, es / nx);
        free(b);
        gcoll_compressor_destroy(c);
    }
    free(x);
    free(d);
}

/* The state's codebook warm-starts the next step: on the same data the second encode's
 * error is no worse (two more Lloyd iterations from a converged start), and error feedback
 * keeps D(c) + e_new == e_old + g to float rounding. */
static void test_warm_and_ef(void **unused)
{
    (void)unused;
    const size_t n = 8000;
    float *x = malloc(n * 4), *d = malloc(n * 4), *e0 = malloc(n * 4);
    clustered(x, n, 4, 30, 3);
    gcoll_compressor_t *c = mk("vq:dim=4,bits=6,ef=0");
    assert_string_equal(gcoll_compressor_spec(c), "vq:dim=4,bits=6,ef=0");
    gcoll_tensor_state_t *s;
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    double prev = INFINITY;
    for (int t = 0; t < 3; t++) {
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        double e = sq(d, x, n);
        assert_true(e <= prev * (1 + 1e-9));
        prev = e;
        free(b);
    }
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    c = mk("vq:dim=4,bits=6");
    assert_int_equal(gcoll_state_create(c, n, &s), GCOLL_OK);
    for (int t = 0; t < 4; t++) {
        clustered(x, n, 4, 30, 10 + (uint64_t)t);
        memcpy(e0, gcoll_state_residual(s), n * 4);
        size_t len;
        uint8_t *b = encode_alloc(c, s, x, n, &len);
        assert_int_equal(gcoll_decode(c, b, len, d, n, 0), GCOLL_OK);
        const float *e = gcoll_state_residual(s);
        double en = 0, xn = 0;
        for (size_t i = 0; i < n; i++) {
            float want = e0[i] + x[i];
            assert_true(fabsf(d[i] + e[i] - want) <= 2.4e-7f * (fabsf(want) + fabsf(d[i])));
            en += (double)e[i] * e[i];
            xn += (double)want * want;
        }
        assert_true(en <= xn); /* contraction of e + g */
        free(b);
    }
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    free(x);
    free(d);
    free(e0);
}

static void test_malformed(void **unused)
{
    (void)unused;
    float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, d[10];
    gcoll_compressor_t *c = mk("vq:dim=4,bits=3");
    size_t len;
    uint8_t *b = encode_alloc(c, NULL, x, 10, &len);
    assert_int_equal(len, 48 + 4 * 8 * 4 + 2); /* 3 vectors of 3 bits */
    assert_int_equal(gcoll_decode(c, b, len, d, 10, 0), GCOLL_OK);
    for (size_t cut = 0; cut < len; cut += 5)
        assert_int_equal(gcoll_decode(c, b, cut, d, 10, 0), GCOLL_ERR_INVALID);
    b[len - 1] |= 0x80; /* padding bit */
    assert_int_equal(gcoll_decode(c, b, len, d, 10, 0), GCOLL_ERR_INVALID);
    b[len - 1] &= 0x7f;
    float nan = NAN;
    memcpy(b + 48 + 4 * 5, &nan, 4);
    assert_int_equal(gcoll_decode(c, b, len, d, 10, 0), GCOLL_ERR_INVALID);
    free(b);
    static const char *bad[] = {"vq:dim=0", "vq:dim=65", "vq:bits=9", "vq:bits=0",
                                "vq:dim=4,dim=4"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        assert_int_equal(gcoll_compressor_check(bad[i], NULL, 0), GCOLL_ERR_INVALID);
    gcoll_compressor_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_scalar_and_contraction),
        cmocka_unit_test(test_warm_and_ef),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
