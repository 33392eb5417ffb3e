/* test_ps.c: the bounded-staleness parameter server. The shard logic (lib/training/ssp.c) under a
 * scripted interleaving: the clock window, f(tau) = 1/(1+tau) and the histogram; then the
 * server with communicators in threads: S = 0 is synchronous SGD step for step (within
 * rounding), with S = 2 and a straggler no worker reads more than S clocks ahead, crafted
 * malformed pushes from a rogue rank fail the server with a message naming the fault, and
 * malformed use is refused; DC-ASGD under a scripted interleaving, and compressed pulls
 * and DC-ASGD through the server. The S = 0 and straggler cases run with and without
 * prefetched pulls; prefetched pulls on one rank are plain SGD (read-my-writes). */
#include <arpa/inet.h>
#include <float.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "root_test_util.h"

#include "core/comm.h"
#include "gcoll.h"
#include "training/ssp.h"
#include "base/util.h"

/* ---- the shard under a scripted interleaving ------------------------------------- */

/* P = 2 workers, S = 2, lr = 1, one element starting at 10. Worker 0 runs ahead: it
 * pushes 1 for clocks 0, 1, 2, all computed on the shard at clock 0 (tau = 0, 1, 2);
 * worker 1 pushes 4 for clock 0 (read at 0, tau 0), then 8 for clock 1 read at clock 1
 * (tau 0) and 16 for clock 2 read at clock 1 (tau 1). Each clock is applied when both
 * updates are in: w -= lr * sum f(tau) u / P. */
static void test_ssp_script(void **state)
{
    (void)state;
    gcoll_ssp_shard_t s;
    float init = 10.0f;
    assert_int_equal(gcoll_ssp_init(&s, 2, 2, 1, &init, 1.0f, GCOLL_PS_WEIGHT_INVERSE), GCOLL_OK);
    assert_true(gcoll_ssp_can_read(&s, 0) && gcoll_ssp_can_read(&s, 2));
    assert_false(gcoll_ssp_can_read(&s, 3)); /* clock 3 would be S + 1 ahead of clock 0 */
    float scale, *row;
    char why[256];
    /* worker 0, clocks 0..2, all read at clock 0 */
    for (uint64_t c = 0; c < 3; c++) {
        assert_int_equal(gcoll_ssp_check(&s, 0, c, 0, why, sizeof(why)), GCOLL_OK);
        row = gcoll_ssp_row(&s, c, 0, &scale);
        assert_true(fabsf(scale - (float)(0.5 / (1.0 + (double)c))) < 1e-7f);
        row[0] += scale * 1.0f;
        assert_int_equal(gcoll_ssp_commit(&s, 0, c, 0), 0); /* worker 1 is missing */
    }
    assert_true(s.w[0] == 10.0f && s.clock == 0);
    /* worker 0 cannot push clock 3: out of the window (and it could not have read) */
    assert_int_equal(gcoll_ssp_check(&s, 0, 3, 0, why, sizeof(why)), GCOLL_ERR_INVALID);
    assert_non_null(strstr(why, "staleness window"));
    /* out of order, and a read clock the shard never had */
    assert_int_equal(gcoll_ssp_check(&s, 1, 1, 0, why, sizeof(why)), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_ssp_check(&s, 1, 0, 1, why, sizeof(why)), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_ssp_check(&s, 5, 0, 0, why, sizeof(why)), GCOLL_ERR_INVALID);
    /* worker 1, clock 0: completes clock 0 = 10 - (0.5 * 1 + 0.5 * 4) */
    assert_int_equal(gcoll_ssp_check(&s, 1, 0, 0, NULL, 0), GCOLL_OK);
    row = gcoll_ssp_row(&s, 0, 0, &scale);
    row[0] += scale * 4.0f;
    assert_int_equal(gcoll_ssp_commit(&s, 1, 0, 0), 1);
    assert_true(s.w[0] == 7.5f && s.clock == 1);
    assert_true(gcoll_ssp_can_read(&s, 3));
    /* worker 1, clock 1 read at clock 1: tau 0; clock 1 = 7.5 - (0.5 * 1/2 * 1 + 0.5 * 8) */
    row = gcoll_ssp_row(&s, 1, 1, &scale);
    assert_true(scale == 0.5f);
    row[0] += scale * 8.0f;
    assert_int_equal(gcoll_ssp_commit(&s, 1, 1, 1), 1);
    assert_true(fabsf(s.w[0] - (7.5f - 0.25f - 4.0f)) < 1e-6f && s.clock == 2);
    /* worker 1, clock 2 read at clock 1: tau 1; clock 2 = w - (0.5/3 * 1 + 0.25 * 16) */
    assert_int_equal(gcoll_ssp_check(&s, 1, 2, 1, NULL, 0), GCOLL_OK);
    row = gcoll_ssp_row(&s, 2, 1, &scale);
    assert_true(scale == 0.25f);
    row[0] += scale * 16.0f;
    assert_int_equal(gcoll_ssp_commit(&s, 1, 2, 1), 1);
    double want = 10.0 - 2.5 - (0.25 + 4.0) - (0.5 / 3.0 + 4.0);
    assert_true(fabs(s.w[0] - want) < 1e-5);
    assert_true(s.clock == 3);
    /* taus: worker 0 {0, 1, 2}, worker 1 {0, 0, 1} */
    assert_true(s.hist[0] == 3 && s.hist[1] == 2 && s.hist[2] == 1 && s.napplied == 6);
    assert_true(fabs(s.tau_sum / (double)s.napplied - 4.0 / 6.0) < 1e-12);
    /* the rows were cleared: the next window starts from zero */
    assert_true(s.acc[0] == 0.0f && s.acc[1] == 0.0f && s.acc[2] == 0.0f);
    gcoll_ssp_free(&s);

    assert_true(gcoll_ssp_weight(GCOLL_PS_WEIGHT_INVERSE, 3) == 0.25);
    assert_true(gcoll_ssp_weight(GCOLL_PS_WEIGHT_NONE, 3) == 1.0);
    assert_int_equal(gcoll_ssp_init(&s, 0, 0, 1, NULL, 1.0f, 0), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_ssp_init(&s, 2, -1, 1, NULL, 1.0f, 0), GCOLL_ERR_INVALID);
}

/* DC-ASGD (Zheng et al. 2017) under a scripted interleaving: P = 2, S = 1, lr = 1, one
 * element at 10, lambda = 1/2. Worker 0 pushes 1 for clock 0 and reads again (view 10,
 * shard clock 0) before worker 1 pushes 2 for clock 0, which completes it: w = 10 - (1 + 2)/2
 * = 8.5. Worker 1 reads (view 8.5) and pushes 3 for clock 1: w_now = view, no correction.
 * Worker 0's push of 2 for clock 1, computed at 10, is stale by one clock: corrected to
 * 2 + 1/2 * 2 * 2 * (8.5 - 10) = -1, weighted 1/(1+1) / 2, so clock 1 gives
 * w = 8.5 - (3/2 + (-1)/4) = 7.25. Every value is exact in binary floating point. */
static void test_dc_script(void **state)
{
    (void)state;
    gcoll_ssp_shard_t s;
    float init = 10.0f, scale, *row;
    const float lambda = 0.5f;
    assert_int_equal(gcoll_ssp_init(&s, 2, 1, 1, &init, 1.0f, GCOLL_PS_WEIGHT_INVERSE), GCOLL_OK);
    assert_int_equal(gcoll_ssp_enable_views(&s), GCOLL_OK);
    assert_true(gcoll_ssp_view(&s, 0)[0] == 10.0f && gcoll_ssp_view(&s, 1)[0] == 10.0f);
    /* what ps.c does on a push's arrival: check, compensate, weight, sum, commit */
#define PUSH(wk, c, kread, val, want_g)                                                            \
    do {                                                                                           \
        float g = (val);                                                                           \
        assert_int_equal(gcoll_ssp_check(&s, (wk), (c), (kread), NULL, 0), GCOLL_OK);              \
        gcoll_ssp_compensate(&s, (wk), &g, lambda);                                                \
        assert_true(g == (want_g));                                                                \
        row = gcoll_ssp_row(&s, (c), (kread), &scale);                                             \
        row[0] += scale * g;                                                                       \
        gcoll_ssp_commit(&s, (wk), (c), (kread));                                                  \
    } while (0)
    gcoll_ssp_snapshot(&s, 0);
    gcoll_ssp_snapshot(&s, 1);
    PUSH(0, 0, 0, 1.0f, 1.0f);
    gcoll_ssp_snapshot(&s, 0); /* worker 0 reads for clock 1 at shard clock 0 */
    PUSH(1, 0, 0, 2.0f, 2.0f);
    assert_true(s.w[0] == 8.5f && s.clock == 1);
    gcoll_ssp_snapshot(&s, 1);
    assert_true(gcoll_ssp_view(&s, 0)[0] == 10.0f && gcoll_ssp_view(&s, 1)[0] == 8.5f);
    PUSH(1, 1, 1, 3.0f, 3.0f);
    PUSH(0, 1, 0, 2.0f, -1.0f);
#undef PUSH
    assert_true(s.w[0] == 7.25f && s.clock == 2);
    assert_true(s.hist[0] == 3 && s.hist[1] == 1);
    gcoll_ssp_free(&s);

    /* elementwise: g += lambda g^2 (w - view), per coordinate */
    float w3[3] = {1.0f, 2.0f, 4.0f};
    assert_int_equal(gcoll_ssp_init(&s, 1, 0, 3, w3, 1.0f, GCOLL_PS_WEIGHT_INVERSE), GCOLL_OK);
    assert_int_equal(gcoll_ssp_enable_views(&s), GCOLL_OK);
    float *v = gcoll_ssp_view(&s, 0);
    v[0] = 0.0f, v[1] = 2.0f, v[2] = 8.0f;
    float g3[3] = {2.0f, 5.0f, -1.0f};
    gcoll_ssp_compensate(&s, 0, g3, 0.25f);
    assert_true(g3[0] == 2.0f + 0.25f * 4.0f * 1.0f);
    assert_true(g3[1] == 5.0f);
    assert_true(g3[2] == -1.0f + 0.25f * 1.0f * -4.0f);
    gcoll_ssp_free(&s);
}

/* ---- the server in threads -------------------------------------------------------- */

enum { MAXR = 4, N1 = 300, N2 = 7, STEPS = 200 };

static char root_addr[64];
/* the prefetch and weighting settings of the next run_ranks */
static int g_prefetch, g_weighting;

typedef struct rank_arg rank_arg_t;
struct rank_arg {
    int rank, size, S, slow;
    const char *spec, *pull;
    float dc;
    int prefetch, weighting;
    int failed;
    char why[256];
    double worst;
    gcoll_ps_stats_t stats;
    float w[N1 + N2];
};

#define RCHECK(a, cond)                                                                            \
    do {                                                                                           \
        if (!(cond) && !(a)->failed) {                                                             \
            (a)->failed = 1;                                                                       \
            snprintf((a)->why, sizeof((a)->why), "rank %d: %s:%d: %s", (a)->rank, __FILE__,        \
                     __LINE__, #cond);                                                             \
        }                                                                                          \
    } while (0)

/* A smooth objective whose gradient every rank can compute for every rank: worker r at
 * its step s sees g_r(w) = w - target(r, s) (the gradient of a quadratic), so the
 * reference step of synchronous SGD is w - lr * mean_r g_r(w). */
static float target(int r, int s, size_t j)
{
    return (float)((double)((r * 31 + s * 7 + (int)j * 13) % 17) / 17.0 - 0.5);
}

static const float LR = 0.1f;

static void grads(float *g, const float *w, int r, int s)
{
    for (size_t j = 0; j < N1 + N2; j++)
        g[j] = w[j] - target(r, s, j);
}

/* S = 0, "none": the model each pull returns is the previous one minus lr times the mean
 * of the ranks' gradients at it, within 4 eps (|w| + lr mean |g|) per element (the
 * average's sum, the scaling by 1/P, the product with lr and the subtraction round once
 * each). The same holds for prefetched pulls on one rank with f = 1 (the answer lacks the
 * last push, which the worker adds itself: the product and the subtraction round once
 * each). With S > 0 and a slow rank, the read gap never exceeds S. */
static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    gcoll_comm_t *comm = NULL;
    if (gcoll_comm_init_rank(a->size, a->rank, root_addr, &comm) != GCOLL_OK) {
        a->failed = 1;
        snprintf(a->why, sizeof(a->why), "rank %d: init failed", a->rank);
        return NULL;
    }
    float *w = a->w, g[N1 + N2], prev[N1 + N2];
    for (size_t j = 0; j < N1 + N2; j++)
        w[j] = (float)j / (float)(N1 + N2);
    gcoll_ps_config_t cfg = {.staleness = a->S,
                             .lr = LR,
                             .compressor = a->spec,
                             .pull_compressor = a->pull,
                             .dc_lambda = a->dc,
                             .prefetch = a->prefetch,
                             .weighting = (gcoll_ps_weight_t)a->weighting};
    gcoll_ps_t *ps = NULL;
    RCHECK(a, gcoll_ps_create(comm, &cfg, &ps) == GCOLL_OK);
    if (!ps)
        goto out;
    RCHECK(a, gcoll_ps_add_tensor(ps, w, N1, NULL) == GCOLL_OK);
    RCHECK(a, gcoll_ps_add_tensor(ps, w + N1, N2, NULL) == GCOLL_OK);
    RCHECK(a, gcoll_ps_push(ps, (const float *const[]){g, g + N1}) == GCOLL_ERR_INVALID);
    RCHECK(a, gcoll_ps_start(ps) == GCOLL_OK);
    RCHECK(a, gcoll_ps_add_tensor(ps, g, 3, NULL) == GCOLL_ERR_INVALID);
    double worst = 0;
    for (int s = 0; s < STEPS && !a->failed; s++) {
        RCHECK(a, gcoll_ps_pull(ps) == GCOLL_OK);
        if (s == 0)
            RCHECK(a, gcoll_ps_pull(ps) == GCOLL_ERR_INVALID); /* twice without a push */
        int sgd =
            a->S == 0 || (a->prefetch && a->size == 1 && a->weighting == GCOLL_PS_WEIGHT_NONE);
        if (sgd && s > 0 && a->spec == NULL && a->pull == NULL) {
            for (size_t j = 0; j < N1 + N2; j++) {
                double mean = 0, mabs = 0;
                for (int r = 0; r < a->size; r++) {
                    float gr = prev[j] - target(r, s - 1, j);
                    mean += gr;
                    mabs += fabs(gr);
                }
                mean /= a->size;
                mabs /= a->size;
                double ref = prev[j] - LR * mean;
                double bound = FLT_EPSILON * (fabs(prev[j]) + LR * mabs);
                double d = fabs(w[j] - ref) / bound;
                if (d > worst)
                    worst = d;
            }
        }
        memcpy(prev, w, sizeof(prev));
        grads(g, w, a->rank, s);
        if (a->slow == a->rank) /* real extra work, not a sleep */
            for (volatile int k = 0; k < 200000; k++)
                ;
        RCHECK(a, gcoll_ps_push(ps, (const float *const[]){g, g + N1}) == GCOLL_OK);
        gcoll_ps_stats_t st;
        gcoll_ps_stats(ps, &st);
        RCHECK(a, st.max_gap <= (uint64_t)a->S); /* the bound, as each pull saw it */
    }
    RCHECK(a, gcoll_ps_finish(ps) == GCOLL_OK);
    gcoll_ps_stats(ps, &a->stats);
    a->worst = worst;
out:
    gcoll_ps_destroy(ps);
    gcoll_comm_destroy(comm);
    return NULL;
}

static void run_ranks_with(rank_arg_t *a, int size, int S, int slow, const char *spec,
                           const char *pull, float dc)
{
    test_pick_root(root_addr, sizeof(root_addr));
    pthread_t th[MAXR];
    for (int r = 0; r < size; r++) {
        memset(&a[r], 0, sizeof(a[r]));
        a[r].rank = r;
        a[r].size = size;
        a[r].S = S;
        a[r].slow = slow;
        a[r].spec = spec;
        a[r].pull = pull;
        a[r].dc = dc;
        a[r].prefetch = g_prefetch;
        a[r].weighting = g_weighting;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (a[r].failed)
            fail_msg("%s", a[r].why);
}

static void run_ranks(rank_arg_t *a, int size, int S, int slow, const char *spec)
{
    run_ranks_with(a, size, S, slow, spec, NULL, 0.0f);
}

static void test_s0_is_sync(void **state)
{
    (void)state;
    for (int pf = 0; pf <= 1; pf++) {
        g_prefetch = pf;
        for (int p = 1; p <= MAXR; p++) {
            rank_arg_t a[MAXR];
            run_ranks(a, p, 0, -1, NULL);
            for (int r = 0; r < p; r++) {
                assert_memory_equal(a[r].w, a[0].w, sizeof(a[0].w));
                if (a[r].worst > 4.0)
                    fail_msg("%d ranks%s: %.2f eps (|w| + lr mean|g|) from synchronous SGD", p,
                             pf ? ", prefetched" : "", a[r].worst);
                assert_true(a[r].stats.max_gap == 0 && a[r].stats.mean_staleness == 0.0);
                assert_true(a[r].stats.applied == (uint64_t)(STEPS * p * p));
            }
            print_message("S=0 on %d rank%s%s, %d steps: largest difference from synchronous "
                          "SGD %.2f eps (|w| + lr mean|g|), bound 4\n",
                          p, p == 1 ? "" : "s", pf ? ", prefetched" : "", STEPS, a[0].worst);
        }
    }
    g_prefetch = 0;
}

/* Prefetched pulls on one rank with S = 1: every answer but the first is asked for before
 * the push it lacks (tau = 1), and the worker adds that push itself, so the run is plain
 * SGD (f = 1) within the 4 eps above; without that it would lag a step. */
static void test_prefetch_reads_own_writes(void **state)
{
    (void)state;
    rank_arg_t a[1];
    g_prefetch = 1;
    g_weighting = GCOLL_PS_WEIGHT_NONE;
    run_ranks(a, 1, 1, -1, NULL);
    g_prefetch = 0;
    g_weighting = GCOLL_PS_WEIGHT_INVERSE;
    print_message("S=1 prefetched on 1 rank: mean staleness %.3f, largest difference from SGD "
                  "%.2f eps (|w| + lr |g|), bound 4\n",
                  a[0].stats.mean_staleness, a[0].worst);
    assert_true(a[0].stats.max_gap <= 1);
    /* the answers were stale: all but clock 0's lacked the last push */
    assert_true(a[0].stats.hist[1] == STEPS - 1 && a[0].stats.hist[0] == 1);
    if (a[0].worst > 4.0)
        fail_msg("%.2f eps (|w| + lr |g|) from SGD", a[0].worst);
}

static void test_bound_with_straggler(void **state)
{
    (void)state;
    const char *specs[] = {NULL, "topk:density=0.1"};
    for (int k = 0; k < 4; k++) {
        rank_arg_t a[MAXR];
        g_prefetch = k >= 2;
        run_ranks(a, 3, 2, 2, specs[k % 2]);
        g_prefetch = 0;
        gcoll_ps_stats_t *s = &a[0].stats;
        uint64_t n = 0;
        for (int t = 0; t < 9; t++)
            n += s->hist[t];
        print_message("S=2, rank 2 slow, %s%s: max clock gap %llu, mean staleness %.3f, tau "
                      "histogram %llu %llu %llu\n",
                      specs[k % 2] ? specs[k % 2] : "none", k >= 2 ? ", prefetched" : "",
                      (unsigned long long)s->max_gap, s->mean_staleness,
                      (unsigned long long)s->hist[0], (unsigned long long)s->hist[1],
                      (unsigned long long)s->hist[2]);
        assert_true(s->max_gap <= 2);
        assert_true(n == s->applied && s->applied == 3 * 3 * STEPS);
        for (int t = 3; t < 9; t++)
            assert_true(s->hist[t] == 0);
        /* every rank ends with the same model */
        assert_memory_equal(a[1].w, a[0].w, sizeof(a[0].w));
        assert_memory_equal(a[2].w, a[0].w, sizeof(a[0].w));
        /* and it converged towards the mean target */
        for (size_t j = 0; j < N1 + N2; j += 37)
            assert_true(isfinite(a[0].w[j]) && fabsf(a[0].w[j]) < 1.0f);
    }
}

/* Compressed pulls and DC-ASGD through the server. S = 0: the compensation is zero (the
 * shard cannot move between a worker's read and its push), so the run is synchronous SGD
 * within the same 4 eps per step as without it (the sums' order, hence their rounding,
 * follows the pushes' arrival, so two runs are not bit for bit equal). S = 2 with a slow
 * rank, top-k pushes and top-k or q8 pulls, with and without DC-ASGD: the bound holds,
 * every rank ends with the same model, and it converges as the dense run does. */
static void test_pull_codec_and_dc(void **state)
{
    (void)state;
    rank_arg_t a[MAXR], b[MAXR];
    run_ranks_with(a, 3, 0, -1, NULL, NULL, 0.0f);
    run_ranks_with(b, 3, 0, -1, NULL, NULL, 0.5f);
    for (int r = 0; r < 3; r++) {
        assert_memory_equal(b[r].w, b[0].w, sizeof(b[0].w));
        if (b[r].worst > 4.0)
            fail_msg("S=0 with DC-ASGD: %.2f eps (|w| + lr mean|g|) from synchronous SGD",
                     b[r].worst);
    }
    assert_true(b[0].stats.mean_staleness == 0.0);
    /* the dense, exact run's model: the reference the others should approach */
    double ref = 0;
    for (size_t j = 0; j < N1 + N2; j++)
        ref += fabs(a[0].w[j]);
    struct {
        const char *push, *pull;
        float dc;
    } cases[] = {{"topk:density=0.1", "topk:density=0.1", 0.0f},
                 {NULL, "q8", 0.5f},
                 {"topk:density=0.1", "topk:density=0.2+q8", 0.5f}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        run_ranks_with(a, 3, 2, 2, cases[k].push, cases[k].pull, cases[k].dc);
        gcoll_ps_stats_t *s = &a[0].stats;
        assert_true(s->max_gap <= 2 && s->applied == 3 * 3 * STEPS);
        for (int t = 3; t < 9; t++)
            assert_true(s->hist[t] == 0);
        assert_memory_equal(a[1].w, a[0].w, sizeof(a[0].w));
        assert_memory_equal(a[2].w, a[0].w, sizeof(a[0].w));
        double d = 0, m = 0;
        for (size_t j = 0; j < N1 + N2; j++) {
            assert_true(isfinite(a[0].w[j]));
            d += fabs(a[0].w[j] - b[0].w[j]);
            m += fabs(a[0].w[j]);
        }
        print_message("S=2, rank 2 slow, push %s, pull %s, DC lambda %g: gap %llu, mean "
                      "staleness %.3f, mean |w - w_sync| %.4f (mean |w_sync| %.4f)\n",
                      cases[k].push ? cases[k].push : "none", cases[k].pull, (double)cases[k].dc,
                      (unsigned long long)s->max_gap, s->mean_staleness, d / (N1 + N2),
                      ref / (N1 + N2));
        /* the targets' mean is what SGD approaches; staleness and compression move it
         * little against the model's own size */
        assert_true(d < 0.5 * ref);
    }
}

/* ---- malformed pushes: a rogue rank 1 sends crafted bytes to rank 0's server --------- */

typedef struct {
    int rank;
    const uint8_t *msg;
    size_t len;
    gcoll_status_t st;
    char err[1024];
} rogue_arg_t;

/* Rank 1's own operation: the bytes on the server's request channel, with its tag (the
 * first operation's sequence, message 0: ps.c's PS_SUB(1, 0)) and signature. */
static gcoll_status_t rogue_run(gcoll_comm_t *comm, gcoll_request_t *req)
{
    rogue_arg_t *a = req->a.ext;
    gcoll_treq_t r;
    memset(&r, 0, sizeof(r));
    uint32_t sig = gcoll_call_sig(64, 1, 0, 0, 1);
    GCOLL_CHECK(gcoll_net_isend(comm, &r, 0, 1u << 28, sig, a->msg, a->len));
    return gcoll_net_waitall(comm, &r, 1);
}

static void *rogue_main(void *p)
{
    rogue_arg_t *a = p;
    gcoll_comm_t *comm = NULL;
    if ((a->st = gcoll_comm_init_rank(2, a->rank, root_addr, &comm)) != GCOLL_OK)
        return NULL;
    if (a->rank == 0) {
        float w[8] = {0};
        gcoll_ps_config_t cfg = {.staleness = 1, .lr = 0.1f};
        gcoll_ps_t *ps = NULL;
        gcoll_ps_create(comm, &cfg, &ps);
        gcoll_ps_add_tensor(ps, w, 8, NULL);
        gcoll_ps_start(ps);
        a->st = gcoll_ps_pull(ps); /* rank 1's shard never answers: the server must fail */
        snprintf(a->err, sizeof(a->err), "%s", gcoll_comm_last_error(comm));
        gcoll_ps_destroy(ps);
    } else {
        gcoll_args_t args = {.ext = a};
        gcoll_request_t *req = gcoll_request_new(comm, "rogue", rogue_run, &args);
        a->st = gcoll_comm_submit(comm, req, NULL);
    }
    gcoll_comm_destroy(comm);
    return NULL;
}

static void test_malformed_push(void **state)
{
    (void)state;
    /* a well-formed push to owner 0 of 4 floats ("none": the codec's own header + data) */
    gcoll_compressor_t *c;
    assert_int_equal(gcoll_compressor_create("none", &c), GCOLL_OK);
    float g[4] = {1, 2, 3, 4};
    uint8_t good[256];
    size_t l;
    assert_int_equal(gcoll_encode(c, NULL, g, 4, good + 36, sizeof(good) - 36, &l), GCOLL_OK);
    gcoll_put_u32(good, 0x31535047u);
    gcoll_put_u32(good + 4, 1);
    gcoll_put_u64(good + 8, 0);
    gcoll_put_u64(good + 16, 0);
    gcoll_put_u64(good + 24, 1);
    gcoll_put_u32(good + 32, (uint32_t)l);
    size_t glen = 36 + l;
    struct {
        const char *name, *want;
        size_t at;
        uint64_t val;
        int width;
        size_t len;
    } cases[] = {
        {"bad magic", "malformed message from rank 1", 0, 7, 4, 0},
        {"length past the end", "length 1000 past the message", 32, 1000, 4, 0},
        {"clock out of order", "update out of order", 8, 5, 8, 0},
        {"read clock ahead of the shard", "read clock outside", 16, 3, 8, 0},
        {"tensor count", "pushed 2 tensors, 1 registered", 24, 2, 8, 0},
        {"truncated codec message", "does not decode", 32, 0, 0, 36 + 4},
        /* longer than any push can be: the receive's size cap refuses it */
        {"trailing bytes", "at most", 0, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t msg[300] = {0};
        memcpy(msg, good, glen);
        size_t len = glen;
        if (cases[i].width == 4)
            gcoll_put_u32(msg + cases[i].at, (uint32_t)cases[i].val);
        else if (cases[i].width == 8)
            gcoll_put_u64(msg + cases[i].at, cases[i].val);
        else if (cases[i].len == 1)
            len = glen + 3;
        else {
            len = cases[i].len;
            gcoll_put_u32(msg + 32, 4);
        }
        test_pick_root(root_addr, sizeof(root_addr));
        rogue_arg_t a[2] = {{.rank = 0}, {.rank = 1, .msg = msg, .len = len}};
        pthread_t th[2];
        for (int r = 0; r < 2; r++)
            assert_int_equal(pthread_create(&th[r], NULL, rogue_main, &a[r]), 0);
        for (int r = 0; r < 2; r++)
            pthread_join(th[r], NULL);
        print_message("%s: rank 0 fails with %s: %s\n", cases[i].name, gcoll_status_string(a[0].st),
                      a[0].err);
        assert_true(a[0].st < 0);
        if (!strstr(a[0].err, cases[i].want))
            fail_msg("%s: expected '%s' in '%s'", cases[i].name, cases[i].want, a[0].err);
    }
    gcoll_compressor_destroy(c);
}

static void test_bad_config(void **state)
{
    (void)state;
    test_pick_root(root_addr, sizeof(root_addr));
    gcoll_comm_t *comm = NULL;
    assert_int_equal(gcoll_comm_init_rank(1, 0, root_addr, &comm), GCOLL_OK);
    gcoll_ps_config_t bad[] = {
        {.staleness = -1, .lr = 0.1f},
        {.staleness = 1001, .lr = 0.1f},
        {.staleness = 1, .lr = -1.0f},
        {.staleness = 1, .lr = NAN},
        {.staleness = 1, .lr = 0.1f, .compressor = "topk:density=7"},
        {.staleness = 1, .lr = 0.1f, .weighting = (gcoll_ps_weight_t)9},
        {.staleness = 1, .lr = 0.1f, .pull_compressor = "topk:density=2"},
        {.staleness = 1, .lr = 0.1f, .pull_compressor = "randomk:density=0.1"},
        {.staleness = 1, .lr = 0.1f, .pull_compressor = "dgc:density=0.1"},
        {.staleness = 1, .lr = 0.1f, .dc_lambda = -1.0f},
        {.staleness = 1, .lr = 0.1f, .dc_lambda = INFINITY},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gcoll_ps_t *ps = NULL;
        assert_int_equal(gcoll_ps_create(comm, &bad[i], &ps), GCOLL_ERR_INVALID);
        assert_null(ps);
    }
    gcoll_ps_config_t ok = {.staleness = 1, .lr = 0.1f};
    gcoll_ps_t *ps = NULL;
    assert_int_equal(gcoll_ps_create(comm, &ok, &ps), GCOLL_OK);
    assert_int_equal(gcoll_ps_start(ps), GCOLL_ERR_INVALID); /* no tensor */
    assert_int_equal(gcoll_ps_pull(ps), GCOLL_ERR_INVALID);  /* not started */
    float w[4] = {0};
    assert_int_equal(gcoll_ps_add_tensor(ps, NULL, 4, NULL), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_ps_add_tensor(ps, w, 4, NULL), GCOLL_OK);
    assert_int_equal(gcoll_ps_start(ps), GCOLL_OK);
    assert_int_equal(gcoll_ps_pull(ps), GCOLL_OK);
    float g[4] = {1, 2, NAN, 4};
    assert_int_equal(gcoll_ps_push(ps, (const float *const[]){g}), GCOLL_ERR_INVALID);
    g[2] = 3;
    assert_int_equal(gcoll_ps_push(ps, (const float *const[]){g}), GCOLL_OK);
    assert_int_equal(gcoll_ps_finish(ps), GCOLL_OK);
    assert_true(fabsf(w[3] + 0.4f) < 1e-6f); /* one step of lr 0.1 */
    gcoll_ps_destroy(ps);
    /* destroying a running server aborts it instead of leaving its thread on freed memory */
    assert_int_equal(gcoll_ps_create(comm, &ok, &ps), GCOLL_OK);
    gcoll_ps_add_tensor(ps, w, 4, NULL);
    assert_int_equal(gcoll_ps_start(ps), GCOLL_OK);
    gcoll_ps_destroy(ps);
    gcoll_comm_destroy(comm);
}

int main(void)
{
    setenv("GCOLL_TIMEOUT_MS", "30s", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ssp_script),        cmocka_unit_test(test_dc_script),
        cmocka_unit_test(test_s0_is_sync),        cmocka_unit_test(test_bound_with_straggler),
        cmocka_unit_test(test_pull_codec_and_dc), cmocka_unit_test(test_malformed_push),
        cmocka_unit_test(test_bad_config),        cmocka_unit_test(test_prefetch_reads_own_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
