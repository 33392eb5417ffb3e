/* test_ucx.c: the UCX transport's single-copy path (GCOLL_UCX_CMA_MIN) between two
 * transport instances in one process: transfers either way round, a send withdrawn while
 * its message waits unexpected, a receive of another length, and malformed single-copy
 * messages; and its registration cache. Skips when UCX cannot run here. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ucx_int.h"
#include "util.h"

typedef struct {
    gcoll_config_t cfg;
    gcoll_transport_t *t[2];
    uint8_t blob[2][4096];
    size_t len[2];
    gcoll_status_t st[2];
} pair_t;

typedef struct {
    pair_t *p;
    int rank;
} conn_arg_t;

static void *connect_one(void *arg)
{
    conn_arg_t *a = arg;
    const void *blobs[2] = {a->p->blob[0], a->p->blob[1]};
    a->p->st[a->rank] =
        gcoll_ucx_ops.connect(a->p->t[a->rank], blobs, a->p->len, gcoll_time_ms() + 20000);
    return NULL;
}

static int setup(void **state)
{
    char why[256];
    if (gcoll_ucx_ops.probe(why, sizeof(why)) != GCOLL_OK) {
        print_message("ucx unavailable: %s\n", why);
        *state = NULL;
        return 0;
    }
    pair_t *p = calloc(1, sizeof(*p));
    p->cfg.timeout_ms = 10000;
    p->cfg.ucx_cma_min = 128 << 10;
    for (int r = 0; r < 2; r++) {
        gcoll_transport_params_t params = {.rank = r, .size = 2, .cfg = &p->cfg,
                                           .local_ip = "127.0.0.1",
                                           .key = {(const uint8_t *)"k", 1}, .wake_fd = -1};
        assert_int_equal(gcoll_ucx_ops.create(&params, &p->t[r]), GCOLL_OK);
        p->len[r] = sizeof(p->blob[r]);
        assert_int_equal(gcoll_ucx_ops.address(p->t[r], p->blob[r], &p->len[r]), GCOLL_OK);
    }
    pthread_t th[2];
    conn_arg_t a[2] = {{p, 0}, {p, 1}};
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&th[r], NULL, connect_one, &a[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    assert_int_equal(p->st[0], GCOLL_OK);
    assert_int_equal(p->st[1], GCOLL_OK);
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    pair_t *p = *state;
    if (!p)
        return 0;
    for (int r = 0; r < 2; r++)
        if (p->t[r])
            gcoll_ucx_ops.destroy(p->t[r]);
    free(p);
    return 0;
}

#define SKIP_WITHOUT_UCX(p)                                                                   \
    do {                                                                                      \
        if (!(p))                                                                             \
            skip();                                                                           \
    } while (0)

static void progress_both(pair_t *p)
{
    for (int r = 0; r < 2; r++)
        gcoll_ucx_ops.progress(p->t[r], 0);
}

/* Drives both sides until every request is done (5 s: a test failure). */
static void drive(pair_t *p, gcoll_treq_t **reqs, int n)
{
    uint64_t deadline = gcoll_time_ms() + 5000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= reqs[i]->done;
        if (all)
            return;
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
    }
}

static gcoll_treq_t req(int peer, uint64_t tag, void *buf, size_t len)
{
    return (gcoll_treq_t){.peer = peer, .tag = tag, .sig = 7, .buf = buf, .len = len};
}

/* Until rank 1 holds an unexpected message from rank 0. */
static void wait_unexpected(pair_t *p)
{
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!p->t[1]->peers[0].unexp) {
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
    }
}

static void transfer(pair_t *p, size_t len, int recv_first, int single_copy)
{
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + len);
    unsigned long sends = p->t[0]->st_cma_sends, recvs = p->t[1]->st_cma_recvs;
    gcoll_treq_t s = req(1, 1000 + len, src, len), r = req(0, 1000 + len, dst, len);
    if (recv_first)
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    if (!recv_first) {
        wait_unexpected(p);
        if (single_copy)
            assert_int_equal(s.done, 0); /* the send waits for the read */
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    }
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(s.status, GCOLL_OK);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, len);
    assert_memory_equal(src, dst, len);
    assert_int_equal(p->t[0]->st_cma_sends - sends, (unsigned long)single_copy);
    assert_int_equal(p->t[1]->st_cma_recvs - recvs, (unsigned long)single_copy);
    free(src);
    free(dst);
}

static void test_single_copy(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    /* both ends can read each other (same process): the hellos said so */
    assert_int_equal(p->t[0]->peers[1].cma_send, 1);
    assert_int_equal(p->t[1]->peers[0].cma_send, 1);
    const size_t lens[] = {128 << 10, (3 << 20) + 7};
    for (size_t i = 0; i < 2; i++) {
        transfer(p, lens[i], 1, 1);
        transfer(p, lens[i], 0, 1);
    }
    /* below the threshold: UCX's own protocols */
    transfer(p, (128 << 10) - 1, 1, 0);
    transfer(p, 1000, 0, 0);
}

/* A send cancelled while its descriptor waits at the receiver: the token word is cleared
 * first, so the later read fails instead of delivering the buffer the caller got back. The
 * receive is then held, as one on a failing endpoint, for the abort the withdrawing rank
 * sends, whose status decides (abort = 1); without one it fails with GCOLL_ERR_PEER after
 * the grace period (abort = 0). */
static void withdrawn(pair_t *p, int abort)
{
    size_t len = 256 << 10;
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    memset(src, 0x5a, len);
    gcoll_treq_t s = req(1, 77, src, len), r = req(0, 77, dst, len);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    wait_unexpected(p);
    gcoll_ucx_ops.cancel(p->t[0], &s);
    assert_int_equal(s.done, 1);
    assert_int_equal(s.status, GCOLL_ERR_ABORTED);
    memset(src, 0, len); /* the caller reuses its buffer */
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    for (int i = 0; i < 20; i++)
        progress_both(p);
    assert_int_equal(r.done, 0); /* held */
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "withdrawn"));
    if (abort)
        gcoll_ucx_ops.abort(p->t[0], GCOLL_ERR_MISMATCH, "a mismatch elsewhere");
    uint64_t t0 = gcoll_time_ms();
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, abort ? GCOLL_ERR_MISMATCH : GCOLL_ERR_PEER);
    if (!abort)
        assert_true(gcoll_time_ms() - t0 >= 400); /* the grace period ran out first */
    free(src);
    free(dst);
}

static void test_withdrawn_abort(void **state)
{
    SKIP_WITHOUT_UCX(*state);
    withdrawn(*state, 1);
}

static void test_withdrawn_silent(void **state)
{
    SKIP_WITHOUT_UCX(*state);
    withdrawn(*state, 0);
}

/* A receive of another length: the receiver says no without reading. */
static void test_length_mismatch(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t len = 256 << 10;
    uint8_t *src = calloc(1, len), *dst = calloc(1, len);
    gcoll_treq_t s = req(1, 78, src, len), r = req(0, 78, dst, len / 2);
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    /* as UCX's rendezvous completes a send its receiver dropped: the receiver's failure
     * (and the abort it sends) decides the status everywhere */
    assert_int_equal(s.status, GCOLL_OK);
    free(src);
    free(dst);
}

/* Malformed single-copy messages from an authenticated peer fail that peer, with a reason;
 * nothing is read. A descriptor one byte too long: */
static void test_malformed_desc(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    uint8_t junk[GCOLL_UCX_CMA_DESC + 1] = {1, 2, 3};
    size_t len = 256 << 10;
    uint8_t *dst = calloc(1, len);
    gcoll_treq_t r = req(0, 0, dst, len);
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(gcoll_ucx_send_ctl(p->t[0], 1, UCX_MSG_CMA, 0, junk, sizeof(junk)),
                     GCOLL_OK);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "malformed single-copy"));
    assert_true(p->t[1]->peers[0].failed);
    /* nothing more goes to a failed peer */
    assert_int_equal(gcoll_ucx_send_ctl(p->t[1], 0, UCX_MSG_FIN, 0, junk, 8), GCOLL_ERR_PEER);
    free(dst);
}

/* An answer of the wrong length fails the send waiting for it. */
static void test_malformed_fin(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    uint8_t junk[3] = {1, 2, 3};
    size_t len = 256 << 10;
    uint8_t *src = calloc(1, len);
    gcoll_treq_t s = req(1, 5, src, len);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    wait_unexpected(p);
    assert_int_equal(gcoll_ucx_send_ctl(p->t[1], 0, UCX_MSG_FIN, 0, junk, sizeof(junk)),
                     GCOLL_OK);
    gcoll_treq_t *snd[] = {&s};
    drive(p, snd, 1);
    assert_int_equal(s.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[0]), "malformed single-copy"));
    free(src);
}

/* A receiver torn down with a single-copy descriptor still unexpected answers it: the
 * sender's send ends instead of waiting for an answer that would never come. */
static void test_destroy_answers(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t len = 256 << 10;
    uint8_t *src = calloc(1, len);
    gcoll_treq_t s = req(1, 9, src, len);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    wait_unexpected(p);
    gcoll_ucx_ops.destroy(p->t[1]);
    p->t[1] = NULL;
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!s.done && gcoll_time_ms() < deadline)
        gcoll_ucx_ops.progress(p->t[0], 1);
    assert_int_equal(s.done, 1);
    free(src);
}

/* The registration cache: a lookup finds a live registration covering the range, and
 * nothing once it is deregistered (or when nothing is registered: the lock-free path). */
static void test_registration(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t len = 1 << 20;
    uint8_t *buf = calloc(1, len);
    assert_null(gcoll_ucx_reg_lookup(p->t[0], buf, len));
    void *h = NULL;
    assert_int_equal(gcoll_ucx_ops.mem_reg(p->t[0], buf, len, &h), GCOLL_OK);
    assert_non_null(h);
    assert_non_null(gcoll_ucx_reg_lookup(p->t[0], buf + 4096, 8192));
    assert_null(gcoll_ucx_reg_lookup(p->t[0], buf + 4096, len)); /* runs past the end */
    transfer(p, len, 1, 1); /* other buffers meanwhile */
    gcoll_ucx_ops.mem_dereg(p->t[0], h);
    assert_null(gcoll_ucx_reg_lookup(p->t[0], buf, len));
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_single_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_withdrawn_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_withdrawn_silent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_length_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_desc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_fin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_answers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
