/* verbs_pair.c: helpers shared by the verbs unit tests: two transports over the fake device. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fake_verbs.h"
#include "base/util.h"
#include "verbs_pair.h"

void load_cfg(gcoll_config_t *cfg)
{
    char err[256];
    assert_int_equal(gcoll_config_load(cfg, err, sizeof(err)), GCOLL_OK);
}

gcoll_transport_t *make(pair_t *p, int rank, int size)
{
    gcoll_transport_params_t params = {.rank = rank,
                                       .size = size,
                                       .cfg = &p->cfg,
                                       .local_ip = "127.0.0.1",
                                       .key = {(const uint8_t *)"k", 1},
                                       .wake_fd = p->wake[rank]};
    gcoll_transport_t *t = NULL;
    assert_int_equal(OPS.create(&params, &t), GCOLL_OK);
    return t;
}

void *connect_main(void *arg)
{
    conn_arg_t *a = arg;
    a->st = OPS.connect(a->t, a->blobs, a->lens, gcoll_time_ms() + 10000);
    return NULL;
}

/* Two ranks in one process, connected for real over loopback TCP (the side channel) and
 * the fake device; rank 1 connects on a thread since connect blocks on its peer. */
pair_t *pair_open(tweak_fn tweak)
{
    pair_t *p = calloc(1, sizeof(*p));
    load_cfg(&p->cfg);
    if (tweak)
        tweak(&p->cfg);
    p->wake[0] = p->wake[1] = -1;
    p->t[0] = make(p, 0, 2);
    p->t[1] = make(p, 1, 2);
    static uint8_t blob[2][256];
    size_t len[2] = {sizeof(blob[0]), sizeof(blob[1])};
    for (int i = 0; i < 2; i++)
        assert_int_equal(OPS.address(p->t[i], blob[i], &len[i]), GCOLL_OK);
    conn_arg_t a[2];
    for (int i = 0; i < 2; i++)
        a[i] = (conn_arg_t){.t = p->t[i], .blobs = {blob[0], blob[1]}, .lens = {len[0], len[1]}};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, connect_main, &a[1]), 0);
    connect_main(&a[0]);
    pthread_join(th, NULL);
    assert_int_equal(a[0].st, GCOLL_OK);
    assert_int_equal(a[1].st, GCOLL_OK);
    return p;
}

void pair_close(pair_t *p)
{
    for (int i = 0; i < 2; i++)
        if (p->t[i])
            OPS.destroy(p->t[i]);
    gcoll_config_free(&p->cfg);
    free(p);
    /* Every verbs object the transports created is gone again. */
    assert_int_equal(fake_stats.live_qp, 0);
    assert_int_equal(fake_stats.live_cq, 0);
    assert_int_equal(fake_stats.live_ctx, 0);
    assert_int_equal(fake_stats.live_mr, 0);
    assert_int_equal(fake_stats.cq_overflow, 0);
}

int setup(void **state)
{
    (void)state;
    unsetenv("GCOLL_IB_HCA");
    fake_verbs_install();
    return 0;
}

int teardown(void **state)
{
    (void)state;
    fake_verbs_uninstall();
    return 0;
}

/* Drives both sides until every request is done (5 s: a test failure). */
void drive(pair_t *p, gcoll_treq_t **reqs, int n)
{
    uint64_t deadline = gcoll_time_ms() + 5000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= reqs[i]->done;
        if (all)
            return;
        assert_true(gcoll_time_ms() < deadline);
        for (int i = 0; i < 2; i++)
            if (p->t[i])
                assert_int_equal(OPS.progress(p->t[i], 0), GCOLL_OK);
    }
}

void idle(pair_t *p, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 2; i++)
            if (p->t[i])
                OPS.progress(p->t[i], 0);
}

gcoll_treq_t req(int peer, uint64_t tag, void *buf, size_t len)
{
    return (gcoll_treq_t){.peer = peer, .tag = tag, .sig = 7, .buf = buf, .len = len};
}

void check_transfer(pair_t *p, size_t len, int recv_first)
{
    uint8_t *src = malloc(len + 1), *dst = calloc(1, len + 1);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 31 + len);
    gcoll_treq_t s = req(1, 42 + len, src, len), r = req(0, 42 + len, dst, len);
    if (recv_first)
        assert_int_equal(OPS.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(OPS.isend(p->t[0], &s), GCOLL_OK);
    if (!recv_first) {
        idle(p, 5); /* lands unexpected (eager) or waits as an offer (rendezvous) */
        assert_int_equal(OPS.irecv(p->t[1], &r), GCOLL_OK);
    }
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(s.status, GCOLL_OK);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, len);
    if (len)
        assert_memory_equal(src, dst, len);
    assert_int_equal(dst[len], 0); /* not a byte past the message */
    free(src);
    free(dst);
}
