/* test_train_mlp.c: gcoll-train's sgemm against a naive product, backward against finite
 * differences, and a short SGD run that must lower the loss. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "train/data.h"
#include "train/gemm.h"
#include "train/mlp.h"

static uint64_t rs = 99;
static float urand(void)
{
    return (float)(train_splitmix64(&rs) >> 40) / 16777216.0f;
}

/* Every combination of transposes, with sizes that do not divide the blocks. */
static void test_sgemm(void **state)
{
    (void)state;
    const int m = 37, n = 301, k = 290;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
    float *c = malloc(sizeof(float) * m * n), *r = malloc(sizeof(float) * m * n);
    for (int i = 0; i < m * k; i++)
        a[i] = urand() - 0.5f;
    for (int i = 0; i < k * n; i++)
        b[i] = urand() - 0.5f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            for (int i = 0; i < m * n; i++)
                c[i] = r[i] = (float)(i % 7);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)(ta ? a[p * m + i] : a[i * k + p]) *
                             (tb ? b[j * k + p] : b[p * n + j]);
                    r[i * n + j] = (float)(0.5 * s + 2.0 * r[i * n + j]);
                }
            train_sgemm(ta, tb, m, n, k, 0.5f, a, ta ? m : k, b, tb ? k : n, 2.0f, c, n);
            for (int i = 0; i < m * n; i++)
                if (fabsf(c[i] - r[i]) > 1e-4f * (1.0f + fabsf(r[i])))
                    fail_msg("%s: trans %d%d: c[%d] = %g, want %g", train_sgemm_name(), ta, tb, i,
                             c[i], r[i]);
        }
    free(a);
    free(b);
    free(c);
    free(r);
}

/* Loss, and a hash of which hidden units the ReLUs let through: a finite difference whose
 * step flips a unit straddles a kink of the loss and says nothing about its derivative. */
static double loss_of(train_mlp_t *m, const float *x, const uint8_t *y, int b, uint64_t *mask)
{
    double loss = train_mlp_forward(m, x, y, b, NULL);
    uint64_t h = 1469598103934665603ull;
    for (int l = 1; l < m->nl; l++)
        for (size_t i = 0; i < (size_t)b * m->l[l - 1].out; i++)
            h = (h ^ (uint64_t)(m->act[l][i] > 0.0f)) * 1099511628211ull;
    *mask = h;
    return loss;
}

/* Central differences of the loss against backward's gradient, for every parameter of a
 * small net and a sample of each tensor of the real one (whose sizes cross the fallback
 * sgemm's blocks). */
static void check_gradients(const int *sizes, int n, int b, int stride, int bstride)
{
    train_mlp_t m;
    assert_int_equal(train_mlp_init(&m, sizes, n, b, 5), 0);
    float *x = malloc(sizeof(float) * (size_t)b * sizes[0]);
    uint8_t y[64];
    for (int i = 0; i < b * sizes[0]; i++)
        x[i] = urand();
    for (int i = 0; i < b; i++)
        y[i] = (uint8_t)(i * 7 % TRAIN_CLASSES);
    for (int l = 0; l < m.nl; l++) /* non-zero biases exercise their gradient too */
        for (int j = 0; j < m.l[l].out; j++)
            m.l[l].b[j] = 0.1f * (urand() - 0.5f);
    uint64_t mask0, mask_up, mask_dn;
    loss_of(&m, x, y, b, &mask0);
    assert_int_equal(train_mlp_backward(&m, y, NULL, NULL), 0);
    const float eps = 1e-3f;
    int checked = 0, bad = 0, kinks = 0;
    for (int l = 0; l < m.nl; l++) {
        for (int which = 0; which < 2; which++) {
            float *p = which ? m.l[l].b : m.l[l].w;
            const float *g = which ? m.l[l].gb : m.l[l].gw;
            size_t cnt = which ? (size_t)m.l[l].out : (size_t)m.l[l].in * m.l[l].out;
            for (size_t i = 0; i < cnt; i += (size_t)(which ? bstride : stride)) {
                float keep = p[i];
                p[i] = keep + eps;
                double up = loss_of(&m, x, y, b, &mask_up);
                p[i] = keep - eps;
                double dn = loss_of(&m, x, y, b, &mask_dn);
                p[i] = keep;
                double fd = (up - dn) / (2.0 * eps);
                checked++;
                if (mask_up != mask0 || mask_dn != mask0) {
                    kinks++;
                    continue;
                }
                if (fabs(fd - g[i]) > 1e-3 + 1e-2 * fabs(fd)) {
                    if (bad++ < 5)
                        print_message("layer %d %s[%zu]: backward %g, finite difference %g\n", l,
                                      which ? "b" : "w", i, g[i], fd);
                }
            }
        }
    }
    if (bad)
        fail_msg("%d of %d gradients disagree with finite differences", bad, checked);
    if (kinks > checked / 20)
        fail_msg("%d of %d differences straddle a ReLU kink: too few checked", kinks, checked);
    free(x);
    train_mlp_free(&m);
}

static void test_gradient_small(void **state)
{
    (void)state;
    const int sizes[] = {13, 9, 7, 10};
    check_gradients(sizes, 4, 6, 1, 1);
}

static void test_gradient_full(void **state)
{
    (void)state;
    const int sizes[] = {784, 512, 256, 10};
    check_gradients(sizes, 4, 3, 1999, 5);
}

/* A gradient step along the reduced gradient is what train_mlp_sgd takes. */
static void test_sgd_step(void **state)
{
    (void)state;
    const int sizes[] = {4, 3, 10};
    train_mlp_t m;
    assert_int_equal(train_mlp_init(&m, sizes, 3, 2, 1), 0);
    for (int i = 0; i < 12; i++)
        m.l[0].gw[i] = (float)i;
    float w0 = m.l[0].w[5];
    train_mlp_sgd(&m, 0.5f, 0.0f);
    assert_true(m.l[0].w[5] == w0 - 2.5f);
    train_mlp_sgd(&m, 0.5f, 0.9f); /* v = 5, then w -= 0.5 * 5 */
    train_mlp_sgd(&m, 0.5f, 0.9f); /* v = 0.9 * 5 + 5 */
    assert_true(fabsf(m.l[0].w[5] - (w0 - 2.5f - 2.5f - 4.75f)) < 1e-5f);
    train_mlp_free(&m);
}

/* A few hundred minibatch steps on separable synthetic classes must lower the loss a lot. */
static void test_short_run(void **state)
{
    (void)state;
    enum { DIM = 32, N = 2000, B = 20, STEPS = 300 };
    float centers[TRAIN_CLASSES][DIM];
    for (int c = 0; c < TRAIN_CLASSES; c++)
        for (int j = 0; j < DIM; j++)
            centers[c][j] = urand();
    float *xs = malloc(sizeof(float) * N * DIM);
    uint8_t *ys = malloc(N);
    for (int i = 0; i < N; i++) {
        ys[i] = (uint8_t)(i % TRAIN_CLASSES);
        for (int j = 0; j < DIM; j++)
            xs[i * DIM + j] = centers[ys[i]][j] + 0.3f * (urand() - 0.5f);
    }
    const int sizes[] = {DIM, 64, 32, TRAIN_CLASSES};
    train_mlp_t m;
    assert_int_equal(train_mlp_init(&m, sizes, 4, B, 3), 0);
    double first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        int off = (s * B) % N;
        double loss = train_mlp_forward(&m, xs + off * DIM, ys + off, B, NULL);
        assert_int_equal(train_mlp_backward(&m, ys + off, NULL, NULL), 0);
        train_mlp_sgd(&m, 0.05f, 0.9f);
        if (s == 0)
            first = loss;
        if (s >= STEPS - 20)
            last += loss / 20;
    }
    print_message("loss of the first step %.4f, mean of the last 20 %.4f\n", first, last);
    assert_true(first > 1.5);
    assert_true(last < 0.3 * first);
    free(xs);
    free(ys);
    train_mlp_free(&m);
}

int main(void)
{
    train_sgemm_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgemm),         cmocka_unit_test(test_gradient_small),
        cmocka_unit_test(test_gradient_full), cmocka_unit_test(test_sgd_step),
        cmocka_unit_test(test_short_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
