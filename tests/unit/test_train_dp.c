/* test_train_dp.c: data parallelism of gcoll-train's loop, with communicators in threads of
 * one process: P ranks with the dense average end with the weights one rank gets on the
 * union of their batches (up to float rounding), compressed training stays bit-identical
 * across ranks, and a short run lowers the loss. */
#include <arpa/inet.h>
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
#include "train_test_util.h"

#include "gcoll.h"
#include "train/train.h"

enum { MAXR = 4, DIM = 24, NTRAIN = 384, NTEST = 100 };

static train_data_t data;

static char root_addr[64];

typedef struct {
    int rank, size;
    train_opts_t o;
    train_result_t res;
    int rc;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    gcoll_comm_t *comm = NULL;
    a->rc = -100;
    if (gcoll_comm_init_rank(a->size, a->rank, root_addr, &comm) != GCOLL_OK)
        return NULL;
    a->rc = train_run(&a->o, &data, comm, NULL, 1, &a->res);
    gcoll_comm_destroy(comm);
    return NULL;
}

/* Runs size ranks with per-rank batch; results in a[0..size). */
static void run_ranks(rank_arg_t *a, int size, const train_opts_t *o)
{
    test_pick_root(root_addr, sizeof(root_addr));
    pthread_t th[MAXR];
    for (int r = 0; r < size; r++) {
        a[r].rank = r;
        a[r].size = size;
        a[r].o = *o;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &a[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (a[r].rc != 0)
            fail_msg("rank %d of %d failed (%d)", r, size, a[r].rc);
}

static void base_opts(train_opts_t *o)
{
    train_opts_default(o);
    o->sizes[1] = 32;
    o->sizes[2] = 16;
    o->epochs = 2;
    o->lr = 0.05f;
}

static void test_ranks_match_union(void **state)
{
    (void)state;
    train_opts_t o;
    base_opts(&o);
    rank_arg_t one[1], p2[2], p4[4];
    memset(one, 0, sizeof(one));
    memset(p2, 0, sizeof(p2));
    memset(p4, 0, sizeof(p4));
    o.batch = 16;
    run_ranks(one, 1, &o);
    o.batch = 8;
    run_ranks(p2, 2, &o);
    o.batch = 4;
    run_ranks(p4, 4, &o);
    size_t n = one[0].res.nparams;
    assert_true(n > 0);
    rank_arg_t *runs[2] = {p2, p4};
    int sizes[2] = {2, 4};
    for (int k = 0; k < 2; k++) {
        double worst = 0;
        for (int r = 0; r < sizes[k]; r++) {
            assert_int_equal(runs[k][r].res.nparams, n);
            /* every rank holds the same weights, bit for bit */
            assert_memory_equal(runs[k][r].res.params, runs[k][0].res.params, n * sizeof(float));
        }
        for (size_t i = 0; i < n; i++) {
            double w1 = one[0].res.params[i], wp = runs[k][0].res.params[i];
            double d = fabs(w1 - wp) / (1e-2 + fabs(w1));
            if (d > worst)
                worst = d;
        }
        print_message("%d ranks vs 1 rank on the union of their batches: largest relative "
                      "difference %.3g\n",
                      sizes[k], worst);
        assert_true(worst < 1e-4);
        /* and the training went somewhere */
        assert_true(runs[k][0].res.last_loss < 0.8 * runs[k][0].res.first_loss);
        assert_true(fabs(runs[k][0].res.last_loss - one[0].res.last_loss) < 1e-4);
        assert_true(runs[k][0].res.wire_bytes > 0 && runs[k][0].res.raw_bytes > 0);
        for (int r = 0; r < sizes[k]; r++)
            free(runs[k][r].res.params);
    }
    free(one[0].res.params);
}

/* Every codec family keeps the ranks in lockstep (bit-identical weights) and trains. */
static void test_compressed_identical(void **state)
{
    (void)state;
    const char *specs[] = {"topk:density=0.01",
                           "topk:density=0.01,ef=0",
                           "dgc:density=0.01,momentum=0.9,warmup_steps=10",
                           "randomk:density=0.05",
                           "sign",
                           "qsgd:bits=4,ef=0",
                           "topk:density=0.05+q8"};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        train_opts_t o;
        base_opts(&o);
        o.batch = 8;
        o.epochs = 3;
        o.compressor = specs[s];
        o.policy = "*bias*=none";
        rank_arg_t p2[2];
        memset(p2, 0, sizeof(p2));
        run_ranks(p2, 2, &o);
        assert_memory_equal(p2[0].res.params, p2[1].res.params, p2[0].res.nparams * sizeof(float));
        print_message("%-45s loss %.4f -> %.4f, wire/raw %.4f\n", specs[s], p2[0].res.first_loss,
                      p2[0].res.last_loss,
                      (double)p2[0].res.wire_bytes / (double)p2[0].res.raw_bytes);
        if (!(p2[0].res.last_loss < p2[0].res.first_loss))
            fail_msg("%s: loss did not go down", specs[s]);
        if (!(p2[0].res.wire_bytes < p2[0].res.raw_bytes))
            fail_msg("%s: not compressed", specs[s]);
        free(p2[0].res.params);
        free(p2[1].res.params);
    }
}

/* The learning-rate schedules at their documented points. */
static void test_lr_schedule(void **state)
{
    (void)state;
    train_opts_t o;
    train_opts_default(&o);
    assert_int_equal(o.lr_schedule, -1); /* cosine outside --async */
    assert_true(fabsf(train_lr_at(&o, 0, 100) - 0.05f) < 1e-7f);
    assert_true(fabsf(train_lr_at(&o, 50, 100) - 0.025f) < 1e-7f);
    assert_true(train_lr_at(&o, 99, 100) < 0.05f * 1e-3f);
    assert_true(train_lr_at(&o, 30, 100) > train_lr_at(&o, 31, 100));
    o.lr_schedule = train_lr_schedule_parse("step");
    assert_int_equal(o.lr_schedule, TRAIN_LR_STEP);
    assert_true(train_lr_at(&o, 49, 100) == 0.05f);
    assert_true(fabsf(train_lr_at(&o, 50, 100) - 0.005f) < 1e-9f);
    assert_true(fabsf(train_lr_at(&o, 74, 100) - 0.005f) < 1e-9f);
    assert_true(fabsf(train_lr_at(&o, 75, 100) - 0.0005f) < 1e-10f);
    o.lr_schedule = train_lr_schedule_parse("constant");
    assert_int_equal(o.lr_schedule, TRAIN_LR_CONSTANT);
    assert_true(train_lr_at(&o, 99, 100) == 0.05f);
    assert_int_equal(train_lr_schedule_parse("cosine"), TRAIN_LR_COSINE);
    assert_int_equal(train_lr_schedule_parse("linear"), -1);
    assert_string_equal(train_lr_schedule_name(-1), "cosine");
}

/* DGC's layer rule: the output layer and tensors of at most 2/density elements dense. */
static void test_dgc_layer_rule(void **state)
{
    (void)state;
    char buf[256];
    const char *r = train_dgc_layer_rule("dgc:density=0.001", buf, sizeof(buf));
    assert_non_null(r);
    assert_string_equal(r, "last=none;size<2001=none;*=dgc:density=0.001");
    r = train_dgc_layer_rule("dgc:density=0.01,momentum=0.9", buf, sizeof(buf));
    assert_non_null(r);
    assert_string_equal(r, "last=none;size<201=none;*=dgc:density=0.01,momentum=0.9");
    assert_null(train_dgc_layer_rule("topk:density=0.001", buf, sizeof(buf)));
    assert_null(train_dgc_layer_rule("none", buf, sizeof(buf)));
    assert_null(train_dgc_layer_rule("dgc:density=2", buf, sizeof(buf))); /* invalid spec */
    assert_null(train_dgc_layer_rule("dgc:density=0.001", buf, 8));       /* no room */
}

/* Random-k with classic error feedback takes the optimizer's momentum into its spec; other
 * random-k forms and other codecs are left alone. */
static void test_randomk_spec(void **state)
{
    (void)state;
    char buf[256];
    const char *r = train_randomk_spec("randomk:density=0.01", 0.9f, buf, sizeof(buf));
    assert_non_null(r);
    assert_string_equal(r, "randomk:density=0.01,momentum=0.9");
    r = train_randomk_spec("randomk:density=0.01,seed=3+fp16", 0.9f, buf, sizeof(buf));
    assert_non_null(r);
    assert_string_equal(r, "randomk:density=0.01,seed=3,momentum=0.9+fp16");
    assert_true(train_codec_momentum(r));
    assert_null(train_randomk_spec("randomk:density=0.01,momentum=0.5", 0.9f, buf, 256));
    assert_null(train_randomk_spec("randomk:density=0.01,ef=0", 0.9f, buf, 256));
    assert_null(train_randomk_spec("randomk:density=0.01,feedback=ef21", 0.9f, buf, 256));
    assert_null(train_randomk_spec("randomk:density=0.01", 0.0f, buf, 256));
    assert_null(train_randomk_spec("topk:density=0.01", 0.9f, buf, 256));
    assert_null(train_randomk_spec("randomk:density=0.01", 0.9f, buf, 20)); /* no room */
    assert_false(train_codec_momentum("randomk:density=0.01"));
    assert_false(train_codec_momentum("randomk:density=0.01,momentum=0"));
    assert_true(train_codec_momentum("dgc:density=0.01"));
    assert_false(train_momentum_first("randomk:density=0.01,momentum=0.9", NULL));
    assert_true(train_momentum_first("randomk:density=0.01", NULL));
}

/* Momentum is per tensor: with a DGC compressor, the tensors a policy leaves dense get the
 * usual momentum (0.9), so a run whose policy sends everything dense is the dense run. */
static void test_momentum_per_tensor(void **state)
{
    (void)state;
    train_opts_t o;
    base_opts(&o);
    o.batch = 8;
    rank_arg_t a[2], b[2];
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    run_ranks(a, 2, &o); /* dense */
    o.compressor = "dgc:density=0.01";
    o.policy = "*=none";
    run_ranks(b, 2, &o);
    assert_int_equal(a[0].res.nparams, b[0].res.nparams);
    assert_memory_equal(a[0].res.params, b[0].res.params, a[0].res.nparams * sizeof(float));
    for (int r = 0; r < 2; r++) {
        free(a[r].res.params);
        free(b[r].res.params);
    }
}

int main(void)
{
    setenv("GCOLL_TIMEOUT_MS", "30s", 1);
    unsetenv("GCOLL_COMPRESSOR");
    unsetenv("GCOLL_LAYER_POLICY");
    test_make_prototypes(&data, DIM, NTRAIN, NTEST);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_match_union),   cmocka_unit_test(test_compressed_identical),
        cmocka_unit_test(test_lr_schedule),         cmocka_unit_test(test_dgc_layer_rule),
        cmocka_unit_test(test_momentum_per_tensor), cmocka_unit_test(test_randomk_spec),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    train_data_free(&data);
    return rc;
}
