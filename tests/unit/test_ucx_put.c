/* test_ucx_put.c: the UCX transport's single copy that the sender writes, for a receive made
 * with GCOLL_TREQ_RECEIVER_BUSY (protocol in ucx_int.h), between two transport instances in
 * one process: transfers either way round, the fallback to reading when the sender cannot
 * write, a receive withdrawn before the sender wrote (nothing lands after), malformed
 * requests and answers. Skips when UCX cannot run here. */
#include "ucx_pair.h"

static void test_put(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    const size_t lens[] = {128 << 10, (3 << 20) + 7};
    for (size_t i = 0; i < 2; i++) {
        transfer(p, lens[i], 1, VIA_PUT);
        transfer(p, lens[i], 0, VIA_PUT); /* the descriptor waited unexpected */
    }
    /* below the single-copy size the flag changes nothing */
    transfer(p, 4097, 1, VIA_UCX);
    /* the flag does not change plain receives around it */
    transfer(p, 256 << 10, 1, VIA_CMA);
}

/* A sender that cannot reach the receiver's memory answers GCOLL_ERR_UNSUPPORTED and the
 * receiver reads instead. */
static void test_put_fallback(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    int pid = p->t[0]->peers[1].cma_pid;
    p->t[0]->peers[1].cma_pid = 0;
    transfer(p, 256 << 10, 1, VIA_PUT_READ);
    transfer(p, 256 << 10, 0, VIA_PUT_READ);
    p->t[0]->peers[1].cma_pid = pid;
    transfer(p, 256 << 10, 1, VIA_PUT);
}

/* A receive withdrawn after its request went out and before the sender took it up: the
 * cancel waits for the answer (here none comes: the sender does not progress), then gives
 * the peer up; the sender, on the request, finds the token gone and writes nothing. Of a
 * 128 KiB message the sender writes all; of 1 MiB the first 768 KiB, the receiver reading
 * the rest itself as soon as its request left (before the cancel). */
static void withdrawn(pair_t *p, size_t len, size_t wlen)
{
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    memset(src, 0x5a, len);
    gcoll_treq_t s = req(1, 55, src, len), r = req(0, 55, dst, len);
    r.flags = GCOLL_TREQ_RECEIVER_BUSY;
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!r.priv) { /* matched: the request is on its way */
        assert_true(gcoll_time_ms() < deadline);
        gcoll_ucx_ops.progress(p->t[1], 0);
    }
    uint64_t t0 = gcoll_time_ms();
    gcoll_ucx_ops.cancel(p->t[1], &r);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, GCOLL_ERR_ABORTED);
    assert_true(gcoll_time_ms() - t0 >= 150); /* it waited for an answer */
    assert_true(p->t[1]->peers[0].rx.failed);
    gcoll_treq_t *snd[] = {&s};
    drive(p, snd, 1);
    for (size_t i = 0; i < wlen; i++)
        assert_int_equal(dst[i], 0);
    for (size_t i = wlen; i < len; i++)
        assert_int_equal(dst[i], 0x5a);
    free(src);
    free(dst);
}

static void test_put_withdrawn(void **state)
{
    SKIP_WITHOUT_UCX(*state);
    withdrawn(*state, 128 << 10, 128 << 10);
}

static void test_put_withdrawn_split(void **state)
{
    SKIP_WITHOUT_UCX(*state);
    withdrawn(*state, 1 << 20, 768 << 10);
}

/* Malformed requests from an authenticated peer fail that peer, with a reason; nothing is
 * written. */
static void test_malformed_put(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t len = 256 << 10;
    uint8_t *src = calloc(1, len);
    gcoll_treq_t s = req(1, 56, src, len);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    wait_unexpected(p);
    /* a request for the send's token, but another length */
    uint8_t dst[64];
    ucx_put_t m = {.send_token = gcoll_get_u64(p->t[1]->peers[0].rx.unexp->data + 24),
                   .addr = (uint64_t)(uintptr_t)dst,
                   .len = sizeof(dst),
                   .tok_addr = (uint64_t)(uintptr_t)&m.token,
                   .token = 99};
    uint8_t msg[GCOLL_UCX_PUT_LEN + 1];
    gcoll_ucx_put_encode(&m, msg);
    assert_int_equal(gcoll_ucx_send_ctl(p->t[1], 0, UCX_MSG_PUT, 0, msg, GCOLL_UCX_PUT_LEN),
                     GCOLL_OK);
    gcoll_treq_t *snd[] = {&s};
    drive(p, snd, 1);
    assert_int_equal(s.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[0]), "not the send's"));
    free(src);
}

static void test_malformed_put_len(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    uint8_t junk[GCOLL_UCX_PUT_LEN - 1] = {1, 2, 3};
    assert_int_equal(gcoll_ucx_send_ctl(p->t[1], 0, UCX_MSG_PUT, 0, junk, sizeof(junk)), GCOLL_OK);
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!p->t[0]->peers[1].rx.failed) {
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
    }
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[0]), "malformed single-copy request"));
}

/* An answer of the wrong length fails the receive waiting for it. */
static void test_malformed_putfin(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t len = 256 << 10;
    uint8_t *dst = calloc(1, len);
    gcoll_treq_t r = req(0, 57, dst, len);
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    uint8_t junk[3] = {1, 2, 3};
    assert_int_equal(gcoll_ucx_send_ctl(p->t[0], 1, UCX_MSG_PUTFIN, 0, junk, sizeof(junk)),
                     GCOLL_OK);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "malformed single-copy answer"));
    free(dst);
}

/* The request's decoder: exact length, nonzero tokens, a buffer that does not wrap, the
 * sender's part within the message; what it accepts survives an encode. */
static void test_put_decode(void **state)
{
    (void)state;
    ucx_put_t m = {.send_token = 1,
                   .addr = 4096,
                   .len = 8192,
                   .wlen = 4096,
                   .tok_addr = 64,
                   .token = 2},
              g;
    uint8_t b[GCOLL_UCX_PUT_LEN];
    gcoll_ucx_put_encode(&m, b);
    assert_null(gcoll_ucx_put_decode(b, sizeof(b), &g));
    assert_memory_equal(&m, &g, sizeof(m));
    assert_non_null(gcoll_ucx_put_decode(b, sizeof(b) - 1, &g));
    assert_non_null(gcoll_ucx_put_decode(NULL, sizeof(b), &g));
    ucx_put_t bad[] = {{.send_token = 0, .token = 2},
                       {.send_token = 1, .token = 0},
                       {.send_token = 1, .token = 2, .addr = UINT64_MAX - 10, .len = 11},
                       {.send_token = 1, .token = 2, .len = 10, .wlen = 11}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gcoll_ucx_put_encode(&bad[i], b);
        assert_non_null(gcoll_ucx_put_decode(b, sizeof(b), &g));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_withdrawn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_withdrawn_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_put, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_put_len, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_putfin, setup, teardown),
        cmocka_unit_test(test_put_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
