/* test_plan.c: the step plan of a compressed allreduce (issue 34, item 3), with two ranks as
 * threads of one process over loopback TCP. Across a warm-up, gcoll_compressed_scheme_state
 * names the scheme each call then runs (the library's count of runs per scheme), where the
 * state-less gcoll_compressed_scheme names the one after the warm-up; and every call computes
 * its k once (the codec's count of k computations: one per rank per call). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "root_test_util.h"

#include "gcoll.h"
#include "collectives/compressed/compressed.h"
#include "compress/compress.h"

enum { P = 2, STEPS = 6, COUNT = 30000 };

static char root_addr[64];
static pthread_barrier_t bar;

/* What one case expects at each step: the scheme the state-aware query names (and the run
 * shows), and the state-less answer. */
typedef struct {
    const char *spec;
    const char *want[STEPS];
    const char *stateless;
    const char *adapt; /* rules of a gcoll_adapt controller attached to the state, or NULL */
} plan_case_t;

typedef struct {
    int rank;
    const plan_case_t *pc;
    int failed;
    char why[256];
} rank_arg_t;

/* Filled by rank 0 between the barriers, while rank 1 waits. */
static uint64_t runs0[GCOLL_COMPRESSED_SCHEMES], k0;

#define RCHECK(a, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond) && !(a)->failed) {                                                             \
            (a)->failed = 1;                                                                       \
            int n_ = snprintf((a)->why, sizeof((a)->why), "rank %d: line %d: %s: ", (a)->rank,     \
                              __LINE__, #cond);                                                    \
            if (n_ > 0 && (size_t)n_ < sizeof((a)->why))                                           \
                snprintf((a)->why + n_, sizeof((a)->why) - (size_t)n_, __VA_ARGS__);               \
        }                                                                                          \
    } while (0)

static int scheme_index(const char *name)
{
    for (int j = 0; name && j < GCOLL_COMPRESSED_SCHEMES; j++)
        if (!strcmp(gcoll_coll_compressed_name(j), name))
            return j;
    return -1;
}

/* One step: ask, snapshot the counters (rank 0, both ranks between barriers, so nothing
 * else runs), call, then check what ran and how many k were computed. */
static void one_step(rank_arg_t *a, gcoll_comm_t *comm, gcoll_compressor_t *c,
                     gcoll_tensor_state_t *s, const float *g, float *out, int t)
{
    const char *name = gcoll_compressed_scheme_state(comm, s, 0, NULL);
    const char *stateless = gcoll_compressed_scheme(comm, c, COUNT, 0, NULL);
    RCHECK(a, name && !strcmp(name, a->pc->want[t]), "%s step %d: the state's scheme %s, want %s",
           a->pc->spec, t, name ? name : "NULL", a->pc->want[t]);
    RCHECK(a, stateless && !strcmp(stateless, a->pc->stateless),
           "%s step %d: the state-less scheme %s, want %s", a->pc->spec, t,
           stateless ? stateless : "NULL", a->pc->stateless);
    pthread_barrier_wait(&bar);
    if (a->rank == 0) {
        for (int j = 0; j < GCOLL_COMPRESSED_SCHEMES; j++)
            runs0[j] = gcoll_coll_compressed_runs(j);
        k0 = gcoll_codec_k_computed();
    }
    pthread_barrier_wait(&bar);
    gcoll_status_t st = gcoll_compressed_allreduce(comm, s, g, out, COUNT, GCOLL_AVG);
    RCHECK(a, st == GCOLL_OK, "%s step %d: status %d", a->pc->spec, t, (int)st);
    pthread_barrier_wait(&bar);
    if (a->rank == 0) {
        int want = scheme_index(name);
        for (int j = 0; j < GCOLL_COMPRESSED_SCHEMES; j++) {
            uint64_t d = gcoll_coll_compressed_runs(j) - runs0[j];
            RCHECK(a, d == (uint64_t)(j == want ? P : 0),
                   "%s step %d: %llu runs of '%s' (the query said '%s')", a->pc->spec, t,
                   (unsigned long long)d, gcoll_coll_compressed_name(j), name ? name : "NULL");
        }
        uint64_t dk = gcoll_codec_k_computed() - k0;
        RCHECK(a, dk == P, "%s step %d: k computed %llu times by %d calls", a->pc->spec, t,
               (unsigned long long)dk, P);
    }
    pthread_barrier_wait(&bar);
}

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    gcoll_comm_t *comm = NULL;
    gcoll_compressor_t *c = NULL;
    gcoll_tensor_state_t *s = NULL;
    gcoll_adapt_t *ad = NULL;
    float *g = malloc(COUNT * sizeof(float)), *out = malloc(COUNT * sizeof(float));
    int ok = g && out && gcoll_comm_init_rank(P, a->rank, root_addr, &comm) == GCOLL_OK &&
             gcoll_compressor_create(a->pc->spec, &c) == GCOLL_OK &&
             gcoll_state_create(c, COUNT, &s) == GCOLL_OK;
    if (ok && a->pc->adapt)
        ok = gcoll_adapt_create(comm, a->pc->adapt, &ad) == GCOLL_OK &&
             gcoll_adapt_attach(ad, s) == GCOLL_OK;
    RCHECK(a, ok, "%s: setup failed", a->pc->spec);
    /* every rank runs every step, failed or not: the barriers and the collectives pair up */
    for (int t = 0; t < STEPS; t++) {
        for (size_t i = 0; i < COUNT; i++) /* distinct magnitudes: no ties at the threshold */
            g[i] = (float)sin(0.37 * (double)i + t + a->rank) * (1.0f + (float)(i % 97) / 97.0f);
        if (ok)
            one_step(a, comm, c, s, g, out, t);
        else
            for (int q = 0; q < 4; q++)
                pthread_barrier_wait(&bar);
    }
    gcoll_adapt_destroy(ad);
    gcoll_state_destroy(s);
    gcoll_compressor_destroy(c);
    gcoll_comm_destroy(comm);
    free(g);
    free(out);
    return NULL;
}

static void run_case(const plan_case_t *pc)
{
    test_pick_root(root_addr, sizeof(root_addr));
    pthread_t th[P];
    rank_arg_t a[P];
    assert_int_equal(pthread_barrier_init(&bar, NULL, P), 0);
    for (int r = 0; r < P; r++) {
        a[r] = (rank_arg_t){.rank = r, .pc = pc};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < P; r++)
        if (a[r].failed)
            fail_msg("%s", a[r].why);
}

/* Top-k's warm-up (exp schedule from dense over 3 steps: densities 1, 0.32, 0.1, then
 * 0.01): the selection is streamed (GCOLL_TOPK_STREAM=1024, so 30000 elements make 29
 * segments) only where k <= count / (2 P), i.e. from step 2 on; the state-less answer is
 * the streamed scheme from step 0. */
static void test_topk_warmup(void **unused)
{
    (void)unused;
    static const plan_case_t pc = {"topk:density=0.01,warmup_steps=3",
                                   {"sparse", "sparse", "streamed sparse", "streamed sparse",
                                    "streamed sparse", "streamed sparse"},
                                   "streamed sparse",
                                   NULL};
    run_case(&pc);
}

/* Codecs whose scheme the warm-up leaves alone: still one k per call. DGC's exp warm-up
 * and random-k's; qsgd's bit-width warm-up encodes with the plan's copy of the codec. */
static void test_other_codecs(void **unused)
{
    (void)unused;
    static const plan_case_t cases[] = {
        {"dgc:density=0.01,warmup_steps=4",
         {"sparse", "sparse", "sparse", "sparse", "sparse", "sparse"},
         "sparse",
         NULL},
        {"randomk:density=0.05,warmup_steps=2",
         {"random-k dense values", "random-k dense values", "random-k dense values",
          "random-k dense values", "random-k dense values", "random-k dense values"},
         "random-k dense values",
         NULL},
        {"qsgd:bits=4,warmup_steps=3,warmup_bits=8",
         {"alltoall", "alltoall", "alltoall", "alltoall", "alltoall", "alltoall"},
         "alltoall",
         NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i]);
}

/* A controller attached to the state encodes with its own copy of the codec, whose
 * density it sets after each call: with GCOLL_DENSITY_MIN/MAX at 0.3/0.5 its first
 * decision (snr+stage: within those bounds) puts k above count / (2 P), so the second call
 * on is not streamed, where the state-less answer (the spec's 1%) still is. */
static void test_adapt(void **unused)
{
    (void)unused;
    static const plan_case_t pc = {
        "topk:density=0.01",
        {"streamed sparse", "sparse", "sparse", "sparse", "sparse", "sparse"},
        "streamed sparse",
        "snr+stage"};
    setenv("GCOLL_DENSITY_MIN", "0.3", 1);
    setenv("GCOLL_DENSITY_MAX", "0.5", 1);
    run_case(&pc);
    unsetenv("GCOLL_DENSITY_MIN");
    unsetenv("GCOLL_DENSITY_MAX");
}

/* Bad arguments: NULL, never a crash. */
static void test_null(void **unused)
{
    (void)unused;
    assert_null(gcoll_compressed_scheme_state(NULL, NULL, 0, NULL));
}

int main(void)
{
    setenv("GCOLL_TOPK_STREAM", "1024", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_warmup),
        cmocka_unit_test(test_other_codecs),
        cmocka_unit_test(test_adapt),
        cmocka_unit_test(test_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
