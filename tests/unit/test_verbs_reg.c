/* test_verbs_reg.c: the verbs registration cache, and whole communicators over the fake
 * device of fake_verbs.c. */
#include <arpa/inet.h>
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

#include "fake_verbs.h"
#include "base/util.h"
#include "transports/verbs/verbs.h"
#include "verbs_pair.h"

/* ---- registration cache ------------------------------------------------------------------- */

static void test_regcache_unit(void **state)
{
    (void)state;
    const gcoll_ibv_ops_t *ibv;
    assert_int_equal(gcoll_ibv_get(&ibv, NULL, 0), GCOLL_OK);
    struct ibv_pd pd = {0};
    gcoll_vb_regcache_t c;
    char err[128];
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *mem = NULL;
    assert_int_equal(posix_memalign((void **)&mem, (size_t)pg, (size_t)pg * 16), 0);
    gcoll_vb_reg_t *r[6];
    int live0 = fake_stats.live_mr;

    /* caching off: register per use, deregister on release; user regions still found */
    gcoll_vb_reg_init(&c, ibv, &pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0);
    assert_int_equal(gcoll_vb_reg_acquire(&c, mem, 100, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    assert_int_equal(fake_stats.live_mr, live0 + 1);
    gcoll_vb_reg_release(&c, r[0]);
    assert_int_equal(fake_stats.live_mr, live0);
    assert_int_equal(gcoll_vb_reg_acquire(&c, mem, 100, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[0]);
    assert_int_equal(c.hits, 0);
    assert_int_equal(c.registrations, 2);
    assert_int_equal(gcoll_vb_reg_acquire(&c, mem, (size_t)pg * 4, 1, &r[1], err, sizeof(err)),
                     GCOLL_OK);
    assert_int_equal(gcoll_vb_reg_acquire(&c, mem + 10, 1000, 0, &r[0], err, sizeof(err)),
                     GCOLL_OK);
    assert_ptr_equal(r[0], r[1]);
    assert_int_equal(c.hits, 1);
    gcoll_vb_reg_release(&c, r[0]);
    gcoll_vb_reg_invalidate(&c, (void *)r[1]->start, r[1]->end - r[1]->start); /* mem_dereg */
    gcoll_vb_reg_release(&c, r[1]);
    assert_int_equal(fake_stats.live_mr, live0);
    gcoll_vb_reg_destroy(&c);

    /* caching on, 2 entries: hits within a registered page range, LRU eviction */
    gcoll_vb_reg_init(&c, ibv, &pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 2);
    uint8_t *A = mem, *B = mem + 4 * pg, *C = mem + 8 * pg, *D = mem + 12 * pg;
    assert_int_equal(gcoll_vb_reg_acquire(&c, A, 100, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[0]);
    assert_int_equal(gcoll_vb_reg_acquire(&c, A + 200, 300, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[0]);
    assert_int_equal(c.hits, 1);
    assert_int_equal(c.misses, 1);
    assert_int_equal(fake_stats.live_mr, live0 + 1);
    assert_int_equal(gcoll_vb_reg_acquire(&c, B, 100, 0, &r[1], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[1]);
    assert_int_equal(gcoll_vb_reg_acquire(&c, A, 10, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[0]); /* A is now the most recently used */
    assert_int_equal(gcoll_vb_reg_acquire(&c, C, 100, 0, &r[2], err, sizeof(err)), GCOLL_OK);
    gcoll_vb_reg_release(&c, r[2]);
    assert_int_equal(c.evictions, 1); /* B went, not A */
    assert_int_equal(c.count, 2);
    uint64_t miss = c.misses;
    assert_int_equal(gcoll_vb_reg_acquire(&c, A, 10, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    assert_int_equal(c.misses, miss);
    /* entries in use are never evicted, even past the limit */
    assert_int_equal(gcoll_vb_reg_acquire(&c, B, 10, 0, &r[1], err, sizeof(err)), GCOLL_OK);
    assert_int_equal(gcoll_vb_reg_acquire(&c, D, 10, 0, &r[3], err, sizeof(err)), GCOLL_OK);
    assert_int_equal(c.misses, miss + 2);
    assert_true(fake_verbs_rkey_live(r[0]->mr->rkey));
    /* invalidation: an idle entry goes at once, one in use when released */
    uint32_t rkA = r[0]->mr->rkey;
    gcoll_vb_reg_invalidate(&c, A + 5, 1);
    assert_true(fake_verbs_rkey_live(rkA)); /* still in use */
    gcoll_vb_reg_release(&c, r[0]);
    assert_false(fake_verbs_rkey_live(rkA));
    assert_int_equal(gcoll_vb_reg_acquire(&c, A, 10, 0, &r[0], err, sizeof(err)), GCOLL_OK);
    assert_int_equal(c.misses, miss + 3); /* registered anew */
    assert_int_not_equal(r[0]->mr->rkey, rkA);
    gcoll_vb_reg_release(&c, r[0]);
    gcoll_vb_reg_release(&c, r[1]);
    gcoll_vb_reg_release(&c, r[3]);
    assert_true(c.count <= 2);
    gcoll_vb_reg_destroy(&c);
    assert_int_equal(fake_stats.live_mr, live0);
    /* zero-length or wrapping ranges are refused */
    assert_int_equal(gcoll_vb_reg_acquire(&c, A, 0, 0, &r[0], err, sizeof(err)), GCOLL_ERR_INVALID);
    free(mem);
}

static void tw_cache(gcoll_config_t *c)
{
    c->ib_reg_cache = 4;
}

static void test_regcache_transport(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_cache);
    size_t len = 100000;
    uint8_t *src = malloc(len), *dst = malloc(len);
    for (int round = 0; round < 3; round++) {
        memset(src, round + 1, len);
        gcoll_treq_t s = req(1, 10 + (uint64_t)round, src, len),
                     r = req(0, 10 + (uint64_t)round, dst, len);
        OPS.irecv(p->t[1], &r);
        OPS.isend(p->t[0], &s);
        gcoll_treq_t *both[] = {&s, &r};
        drive(p, both, 2);
        assert_int_equal(r.status, GCOLL_OK);
        assert_memory_equal(src, dst, len);
    }
    assert_int_equal(p->t[0]->reg.registrations, 1);
    assert_int_equal(p->t[0]->reg.hits, 2);
    assert_int_equal(p->t[1]->reg.registrations, 1);
    assert_int_equal(p->t[1]->reg.hits, 2);
    /* after invalidation (the buffer was freed, say) the next use registers again */
    gcoll_vb_reg_invalidate(&p->t[1]->reg, dst, len);
    check_transfer(p, 10, 1);
    gcoll_treq_t s = req(1, 20, src, len), r = req(0, 20, dst, len);
    OPS.irecv(p->t[1], &r);
    OPS.isend(p->t[0], &s);
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(p->t[1]->reg.registrations, 2);
    /* mem_reg: a region registered once by the caller, found by every message */
    void *h = NULL;
    uint8_t *user = malloc(len);
    assert_int_equal(OPS.mem_reg(p->t[0], user, len, &h), GCOLL_OK);
    uint64_t regs = p->t[0]->reg.registrations;
    s = req(1, 21, user, len);
    r = req(0, 21, dst, len);
    OPS.irecv(p->t[1], &r);
    OPS.isend(p->t[0], &s);
    drive(p, both, 2);
    assert_int_equal(p->t[0]->reg.registrations, regs);
    OPS.mem_dereg(p->t[0], h);
    free(user);
    free(src);
    free(dst);
    pair_close(p);
}

/* ---- the whole library over the fake device ------------------------------------------ */

/* Communicators in threads of one process, GCOLL_TRANSPORT=verbs: bootstrap, connect,
 * ring allreduce (eager and rendezvous messages), broadcast, barrier and a mismatch that
 * must reach every rank, all through gcoll's public API with the fake device below. */
enum { NRANKS = 3 };
static char root_addr[64];
static int comm_bad[NRANKS];

static void *rank_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    gcoll_comm_t *comm = NULL;
    gcoll_status_t st = gcoll_comm_init_rank(NRANKS, rank, root_addr, &comm);
    if (st != GCOLL_OK) {
        comm_bad[rank] = 100;
        return NULL;
    }
    if (strcmp(gcoll_comm_transport(comm), "verbs") != 0)
        comm_bad[rank]++;
    const size_t counts[] = {0, 1, 7, 1000, 100003};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        float *x = malloc((n + 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1) * (float)(i % 17);
        if (gcoll_allreduce(comm, x, x, n, GCOLL_FLOAT32, GCOLL_SUM) != GCOLL_OK)
            comm_bad[rank]++;
        for (size_t i = 0; i < n; i++)
            if (x[i] != 6.0f * (float)(i % 17)) { /* (1 + 2 + 3) * v */
                comm_bad[rank]++;
                break;
            }
        free(x);
    }
    int64_t b[5000];
    for (int i = 0; i < 5000; i++)
        b[i] = rank == 2 ? i * 3 : -1;
    if (gcoll_broadcast(comm, b, 5000, GCOLL_INT64, 2) != GCOLL_OK || b[4999] != 4999 * 3)
        comm_bad[rank]++;
    if (gcoll_barrier(comm) != GCOLL_OK)
        comm_bad[rank]++;
    /* rank 1 passes another count: every rank must see GCOLL_ERR_MISMATCH */
    float y[64] = {0};
    st = gcoll_allreduce(comm, y, y, rank == 1 ? 63 : 64, GCOLL_FLOAT32, GCOLL_SUM);
    if (st != GCOLL_ERR_MISMATCH)
        comm_bad[rank] += 1000;
    gcoll_comm_destroy(comm);
    return NULL;
}

static void test_comm_over_fake(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    snprintf(root_addr, sizeof(root_addr), "127.0.0.1:%d", ntohs(sa.sin_port));
    setenv("GCOLL_TRANSPORT", "verbs", 1);
    setenv("GCOLL_TIMEOUT_MS", "20s", 1);
    setenv("GCOLL_IB_EAGER_SLOTS", "4", 1);
    setenv("GCOLL_IB_CHUNK", "16kb", 1);
    setenv("GCOLL_IB_QPS_PER_PEER", "2", 1);
    pthread_t th[NRANKS];
    for (int r = 0; r < NRANKS; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r), 0);
    for (int r = 0; r < NRANKS; r++)
        pthread_join(th[r], NULL);
    unsetenv("GCOLL_TRANSPORT");
    unsetenv("GCOLL_TIMEOUT_MS");
    unsetenv("GCOLL_IB_EAGER_SLOTS");
    unsetenv("GCOLL_IB_CHUNK");
    unsetenv("GCOLL_IB_QPS_PER_PEER");
    for (int r = 0; r < NRANKS; r++)
        if (comm_bad[r])
            fail_msg("rank %d: %d bad result(s)", r, comm_bad[r]);
    assert_true(fake_stats.writes > 0);
    assert_int_equal(fake_stats.rnr, 0);
    assert_int_equal(fake_stats.live_qp, 0);
    assert_int_equal(fake_stats.live_mr, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_regcache_unit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regcache_transport, setup, teardown),
        cmocka_unit_test_setup_teardown(test_comm_over_fake, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
