/* test_ef_contract.c: the contraction each codec sends under error feedback, on random and
 * adversarial vectors, and the budget of the spare residual buffers. */
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

/* --- the contraction every codec is used with under error feedback -------------------- */

/*
 * Error feedback converges when ||C(x) - x||^2 <= (1 - delta) ||x||^2 (Stich et al. 2018,
 * Karimireddy et al. 2019). For each codec with ef=1 and its delta (docs/compressors.md,
 * "Error feedback"), on random and adversarial vectors, C(x) decoded from the message a
 * fresh state sends. Stochastic codecs (QSGD, random-k) hold it in expectation: the mean
 * of R draws against 1 - delta plus 4 standard errors of that mean. Below float's normal
 * range (the denormal vector) q8, QSGD, fp16 and bf16 lose their relative precision and
 * send zeros or coarse values while the residual keeps the rest: there they are only
 * non-expansive (delta 0), checked as such.
 */
static double pd_q8(double m)
{
    return 1.0 - m / (4.0 * 127.0 * 127.0);
}
/* QSGD's contractive form: levels max/s apart, nearest (values.c) */
static double pd_qsgd(int bits, double m)
{
    double sl = (double)((1 << (bits - 1)) - 1);
    return 1.0 / (1.0 + (m - 1.0) / (4.0 * sl * sl));
}

enum { V_RANDOM, V_ZERO, V_HUGE, V_HUGE_ALONE, V_CONST, V_ALT, V_DENORMAL, V_SPIKES, V_COUNT };
static const char *const vnames[V_COUNT] = {"random",           "all zero", "one huge value",
                                            "huge value alone", "constant", "alternating",
                                            "denormals",        "spikes"};

static void contraction_vec(int kind, float *x, size_t n, float huge)
{
    rng_s = 4242 + (uint64_t)kind;
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case V_RANDOM:
            x[i] = rndf() * (1.0f + (float)(rnd32() % 4));
            break;
        case V_ZERO:
            x[i] = 0.0f;
            break;
        case V_HUGE:
            x[i] = i == 17 ? huge : rndf();
            break;
        case V_HUGE_ALONE:
            x[i] = i == 1500 ? -huge : 0.0f;
            break;
        case V_CONST:
            x[i] = 1.5f;
            break;
        case V_ALT:
            x[i] = i % 2 ? -0.75f : 0.75f;
            break;
        case V_DENORMAL:
            x[i] = (rndf() + 1.5f) * 1e-40f * (i % 2 ? -1.0f : 1.0f);
            break;
        default:
            x[i] = i % 100 == 0 ? 10.0f * rndf() : 0.01f * rndf();
            break;
        }
    }
}

static void test_contraction(void **unused)
{
    (void)unused;
    const size_t n = 3001;
    const double nd = (double)n;
    static const struct {
        const char *spec;
        double delta;
        int stoch, lowprec; /* lowprec: a value format that loses precision below 1e-37 */
        float huge;         /* the "huge value" within the format's range */
    } cases[] = {
        {"none", 1, 0, 0, 3e38f},
        {"fp16", 1 - 0x1p-22, 0, 1, 6e4f},
        {"bf16", 1 - 0x1p-16, 0, 1, 3e38f},
        {"q8", 0, 0, 1, 3e38f}, /* delta from the bucket below */
        {"q8:bucket=64", 0, 0, 1, 3e38f},
        {"qsgd:bits=8", 0, 1, 1, 1e30f},
        {"qsgd:bits=4", 0, 1, 1, 1e30f},
        {"qsgd:bits=2", 0, 1, 1, 1e30f},
        {"qsgd:bits=4,bucket=64", 0, 1, 1, 1e30f},
        {"sign", 1.0 / 64, 0, 0, 1e30f}, /* one scale per chunk of 64 */
        {"sign:chunk=64", 1.0 / 64, 0, 0, 1e30f},
        {"sign:scale=l2", 0.75 / nd, 0, 0, 1e30f},
        {"sign:scale=l2,chunk=64", 0.75 / 64, 0, 0, 1e30f},
        {"topk:density=0.1", 0.1, 0, 0, 3e38f},
        {"topk:k=5", 5 / nd, 0, 0, 3e38f},
        {"topk:density=0.1+q8", 0, 0, 1, 3e38f},
        {"topk:density=0.1+qsgd", 0, 1, 1, 1e30f},
        {"topk:density=0.1+fp16", 0.1 * (1 - 0x1p-22), 0, 1, 6e4f},
        {"topk:density=0.1+sign", 0, 0, 0, 1e30f},
        {"randomk:density=0.1,feedback=ef", 0, 1, 0, 3e38f},
        {"dgc:density=0.1,momentum=0,select=exact", 0.1, 0, 0, 3e38f},
        {"threshold:tau=0.5", 0, 0, 0, 3e38f}, /* no delta: |e_i| < tau instead */
    };
    float *x = malloc(n * 4), *d = malloc(n * 4);
    char spec[128];
    FOR_EACH_SIMD(lvl)
    for (size_t j = 0; j < sizeof(cases) / sizeof(*cases); j++) {
        gcoll_compressor_t *c = mk(cases[j].spec);
        const size_t k = gcoll_codec_k(c, n, 0);
        double delta = cases[j].delta;
        if (c->sparsify == GCOLL_SPARSIFY_NONE && c->vs.fmt == GCOLL_VF_Q8)
            delta = pd_q8(c->vs.bucket);
        else if (c->sparsify == GCOLL_SPARSIFY_NONE && c->vs.fmt == GCOLL_VF_QSGD)
            delta = pd_qsgd((int)c->vs.bits, c->vs.bucket);
        else if (c->vs.fmt == GCOLL_VF_Q8) /* k values in one bucket */
            delta = (double)k / nd * pd_q8((double)GCOLL_MIN(k, (size_t)c->vs.bucket));
        else if (c->vs.fmt == GCOLL_VF_QSGD)
            delta = (double)k / nd * pd_qsgd((int)c->vs.bits, GCOLL_MIN(k, c->vs.bucket));
        else if (c->vs.fmt == GCOLL_VF_SIGN && c->sparsify != GCOLL_SPARSIFY_NONE)
            delta = 1.0 / nd; /* k/n of the norm kept, then 1/k of that: one scale */
        else if (c->sparsify == GCOLL_SPARSIFY_RANDOMK)
            delta = (double)k / nd;
        const int R = cases[j].stoch ? 64 : 1;
        for (int v = 0; v < V_COUNT; v++) {
            contraction_vec(v, x, n, cases[j].huge);
            double x2 = 0;
            for (size_t i = 0; i < n; i++)
                x2 += (double)x[i] * x[i];
            double sum = 0, sum2 = 0, emax = 0;
            for (int t = 0; t < R; t++) {
                gcoll_compressor_t *ct = c;
                if (c->sparsify == GCOLL_SPARSIFY_RANDOMK) { /* other indices each draw */
                    snprintf(spec, sizeof(spec), "randomk:density=0.1,seed=%d,feedback=ef", t + 1);
                    ct = mk(spec);
                }
                gcoll_tensor_state_t *s;
                assert_int_equal(gcoll_state_create(ct, n, &s), GCOLL_OK);
                gcoll_state_set_salt(s, (uint64_t)t * 7919 + 1);
                size_t len;
                uint8_t *b = encode_alloc(ct, s, x, n, &len);
                assert_int_equal(gcoll_decode(ct, b, len, d, n, 0), GCOLL_OK);
                double e2 = 0;
                for (size_t i = 0; i < n; i++) {
                    double di = (double)d[i] - x[i];
                    e2 += di * di;
                    emax = fmax(emax, fabs(di));
                }
                double r = x2 > 0 ? e2 / x2 : e2;
                sum += r;
                sum2 += r * r;
                free(b);
                gcoll_state_destroy(s);
                if (ct != c)
                    gcoll_compressor_destroy(ct);
            }
            double mean = sum / R, var = R > 1 ? fmax(0, (sum2 - sum * mean) / (R - 1)) : 0;
            double dl = v == V_DENORMAL && cases[j].lowprec ? 0 : delta;
            /* 1e-6: float rounding of the decoded values and of the squares */
            double lim = x2 > 0 ? 1 - dl + 4 * sqrt(var / R) + 1e-6 : 0;
            if (c->sparsify == GCOLL_SPARSIFY_THRESHOLD) { /* what stays is below tau */
                if (!(emax < 0.5))
                    fail_msg("%s on %s: a residual of %g is not below tau", cases[j].spec,
                             vnames[v], emax);
                lim = x2 > 0 ? 1 + 1e-6 : 0;
            }
            if (!(mean <= lim))
                fail_msg("%s on %s: ||C(x)-x||^2 / ||x||^2 = %.6g above 1 - delta = %.6g "
                         "(delta %.4g, %d draw(s))",
                         cases[j].spec, vnames[v], mean, lim, dl, R);
        }
        gcoll_compressor_destroy(c);
    }
    free(x);
    free(d);
}

/* The spare residuals of folded checks share one budget per process: a state reserves its
 * buffer's bytes (64-byte rounded) only if they fit in what is left, keeps them until it
 * is destroyed, and a refused state keeps one residual. */
static void test_spare_budget(void **unused)
{
    (void)unused;
    gcoll_compressor_t *c = mk("topk:density=0.01");
    gcoll_tensor_state_t *a, *b, *d;
    assert_int_equal(gcoll_state_create(c, 1000, &a), GCOLL_OK); /* 4032 bytes */
    assert_int_equal(gcoll_state_create(c, 2000, &b), GCOLL_OK); /* 8000 bytes */
    assert_int_equal(gcoll_state_create(c, 10, &d), GCOLL_OK);   /* 64 bytes */
    const size_t budget = 4032 + 8000 - 1;
    assert_true(gcoll_codec_spare_reserve(a, budget));
    assert_true(gcoll_codec_spare_reserve(a, budget)); /* held: no second reservation */
    assert_false(gcoll_codec_spare_reserve(b, budget));
    assert_true(b->spare_refused);
    assert_false(gcoll_codec_spare_reserve(b, 0)); /* 0: no spare at all */
    assert_true(gcoll_codec_spare_reserve(d, budget));
    gcoll_state_destroy(a); /* its bytes come back */
    assert_true(gcoll_codec_spare_reserve(b, budget));
    assert_int_equal(b->spare_reserved, 8000);
    gcoll_state_destroy(b);
    gcoll_state_destroy(d);
    /* all released: the whole budget is free again */
    assert_int_equal(gcoll_state_create(c, 3000, &a), GCOLL_OK);
    assert_true(gcoll_codec_spare_reserve(a, 12032));
    gcoll_state_destroy(a);
    gcoll_compressor_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contraction),
        cmocka_unit_test(test_spare_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
