/* test_ucx.c: the UCX transport's single-copy path (GCOLL_UCX_CMA_MIN) between two
 * transport instances in one process: transfers either way round, a send withdrawn while
 * its message waits unexpected, a receive of another length, malformed single-copy
 * messages; what a failed peer's unexpected messages become; the registration cache; a
 * stranger's endpoint sending gcoll's active messages without the cookie. The
 * shared-memory mailbox: test_ucx_shm.c. Skips when UCX cannot run here. */
#include "ucx_pair.h"
#include "flood_util.h"

static void test_single_copy(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    /* both ends can read each other (same process): the hellos said so */
    assert_int_equal(p->t[0]->peers[1].cma_send, 1);
    assert_int_equal(p->t[1]->peers[0].cma_send, 1);
    const size_t lens[] = {128 << 10, (3 << 20) + 7};
    for (size_t i = 0; i < 2; i++) {
        transfer(p, lens[i], 1, VIA_CMA);
        transfer(p, lens[i], 0, VIA_CMA);
    }
    /* below the threshold: UCX's own protocols */
    transfer(p, (128 << 10) - 1, 1, VIA_UCX);
    transfer(p, 4097, 0, VIA_UCX);
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
    assert_int_equal(gcoll_ucx_send_ctl(p->t[0], 1, UCX_MSG_CMA, 0, junk, sizeof(junk)), GCOLL_OK);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "malformed single-copy"));
    assert_true(p->t[1]->peers[0].rx.failed);
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
    assert_int_equal(gcoll_ucx_send_ctl(p->t[1], 0, UCX_MSG_FIN, 0, junk, sizeof(junk)), GCOLL_OK);
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

/* 2 GiB that rank 1 never receives, against GCOLL_UNEXPECTED_BYTES=8mb (messages of 8 KiB,
 * below the single-copy size): whole messages UCX keeps for rank 1 count against the
 * bound, and at the bound rank 1 gives rank 0 up with GCOLL_ERR_NOMEM naming it; offers
 * whose data stays with the sender (rendezvous) hold the sender back instead. Either way
 * rank 1 holds at most the bound plus the documented overhead: 8 MiB here, UCX's own
 * receive buffers touched as they fill (measured: 5 MiB over the bound at 8 KiB messages). */
static void test_unexpected_bound(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    flood_result_t r = flood(&gcoll_ucx_ops, p->t[0], p->t[1], 8 << 10, 10);
    print_message("ucx flood: %zu MiB sent, resident size grew %zu KiB, receive: %s\n",
                  r.sent >> 20, r.rss_max >> 10, gcoll_status_string(r.recv_status));
    assert_true(r.rss_max < (8u << 20) + (8u << 20));
    /* rank 1 gave rank 0 up (whose sends UCX completes and rank 1 drops: rank 1 tells
     * rank 0 with an abort notice), or flow control held the rest back */
    int gave_up = r.recv_status == GCOLL_ERR_NOMEM;
    assert_true(gave_up || r.sent <= (8u << 20));
    if (gave_up) {
        assert_int_equal(r.recv_status, GCOLL_ERR_NOMEM);
        const char *err = gcoll_ucx_ops.last_error(p->t[1]);
        assert_non_null(strstr(err, "rank 0 sent a message of 8192 bytes that no receive"));
        assert_non_null(strstr(err, "GCOLL_UNEXPECTED_BYTES=8388608"));
        /* the sender is told (an abort notice naming the bound), within a second, without
         * receiving anything from rank 1: its next operation with rank 1 fails */
        uint64_t t0 = gcoll_time_ms();
        while (!p->t[0]->peers[1].rx.failed && gcoll_time_ms() < t0 + 2000)
            progress_both(p);
        print_message("ucx flood: the sender learnt it was given up after %llu ms: %s\n",
                      (unsigned long long)(gcoll_time_ms() - t0),
                      gcoll_ucx_ops.last_error(p->t[0]));
        assert_true(p->t[0]->peers[1].rx.failed);
        assert_true(gcoll_time_ms() - t0 < 1000);
        assert_non_null(
            strstr(gcoll_ucx_ops.last_error(p->t[0]), "rank 1 aborted with GCOLL_ERR_NOMEM"));
        assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[0]),
                               "your msgs passed GCOLL_UNEXPECTED_BYTES=8388608"));
        uint8_t one = 1;
        gcoll_treq_t s = req(1, 12345, &one, 1);
        gcoll_ucx_ops.isend(p->t[0], &s);
        assert_true(s.done);
        assert_int_equal(s.status, GCOLL_ERR_PEER);
    }
}

/* A failed peer: the receive pending from it and later ones fail with its status; a
 * message it sent whole (through the mailbox, still in the ring when it failed) is still
 * received, one whose data stayed with it (a single-copy descriptor) is not. */
static void test_peer_fail_keeps_whole(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t big = 256 << 10;
    uint8_t small[100], *src = calloc(1, big), out[100] = {0}, *bout = malloc(big);
    for (size_t i = 0; i < sizeof(small); i++)
        small[i] = (uint8_t)(i * 5 + 3);
    gcoll_treq_t s1 = req(1, 5, small, sizeof(small)), s2 = req(1, 6, src, big);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s1), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s2), GCOLL_OK);
    uint64_t deadline = gcoll_time_ms() + 5000;
    int n = 0;
    while (n < 1) { /* the descriptor waits unexpected at rank 1, the other in its ring */
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
        n = 0;
        for (gcoll_unexp_t *u = p->t[1]->peers[0].rx.unexp; u; u = u->next)
            n++;
    }
    assert_int_equal(n, 1);
    assert_int_equal(p->t[1]->peers[0].rx.unexp->tag, 6);
    uint8_t buf[8];
    gcoll_treq_t pending = req(0, 9, buf, sizeof(buf));
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &pending), GCOLL_OK);
    gcoll_ucx_peer_fail(p->t[1], 0, GCOLL_ERR_PEER);
    assert_true(pending.done);
    assert_int_equal(pending.status, GCOLL_ERR_PEER);
    gcoll_treq_t r1 = req(0, 5, out, sizeof(out)), r2 = req(0, 6, bout, big),
                 later = req(0, 10, buf, sizeof(buf));
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r1), GCOLL_OK);
    assert_true(r1.done);
    assert_int_equal(r1.status, GCOLL_OK);
    assert_memory_equal(out, small, sizeof(small));
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r2), GCOLL_OK);
    assert_true(r2.done);
    assert_int_equal(r2.status, GCOLL_ERR_PEER);
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &later), GCOLL_OK);
    assert_true(later.done);
    assert_int_equal(later.status, GCOLL_ERR_PEER);
    gcoll_ucx_ops.destroy(p->t[1]); /* before the buffers of rank 0's sends go */
    p->t[1] = NULL;
    deadline = gcoll_time_ms() + 5000;
    while (!s2.done && gcoll_time_ms() < deadline)
        gcoll_ucx_ops.progress(p->t[0], 1);
    gcoll_ucx_ops.destroy(p->t[0]);
    p->t[0] = NULL;
    free(src);
    free(bout);
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
    transfer(p, len, 1, VIA_CMA);                                /* other buffers meanwhile */
    gcoll_ucx_ops.mem_dereg(p->t[0], h);
    assert_null(gcoll_ucx_reg_lookup(p->t[0], buf, len));
    free(buf);
}

/* A process that holds no job key but has learned rank 1's worker address (here: read
 * from its blob) creates its own UCX endpoint and sends active messages as gcoll does,
 * claiming to be rank 0 and aiming at a receive rank 1 has posted. Without the receiver's
 * cookie, which only the authenticated bootstrap hands out, nothing is delivered; with it
 * (read here from the transport, which a stranger cannot do) the same message is, so the
 * cookie is what keeps it out. */
static void stranger_send(pair_t *p, ucp_worker_h w, ucp_ep_h ep, uint64_t cookie, uint64_t tag,
                          const void *data, size_t len)
{
    ucx_hdr_t h = {.type = UCX_MSG_DATA, .src = 0, .sig = 7, .cookie = cookie, .tag = tag};
    uint8_t hdr[GCOLL_UCX_HDR_LEN];
    gcoll_ucx_hdr_encode(&h, hdr);
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER};
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, GCOLL_UCX_AM_ID, hdr, sizeof(hdr), data, len, &prm);
    assert_false(UCS_PTR_IS_ERR(sp));
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (UCS_PTR_IS_PTR(sp) && ucp_request_check_status(sp) == UCS_INPROGRESS) {
        assert_true(gcoll_time_ms() < deadline);
        ucp_worker_progress(w);
        progress_both(p); /* the receiver answers UCX's wire-up */
    }
    if (UCS_PTR_IS_PTR(sp))
        ucp_request_free(sp);
}

static void test_stranger_injection(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    ucp_config_t *cfg;
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_context_h ctx;
    assert_int_equal(ucp_init(&prm, cfg, &ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w;
    assert_int_equal(ucp_worker_create(ctx, &wp, &w), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = (const ucp_address_t *)(p->blob[1] + 20),
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_ep_h e;
    assert_int_equal(ucp_ep_create(w, &ep, &e), UCS_OK);

    uint8_t got[64] = {0}, evil[64];
    memset(evil, 0x5a, sizeof(evil));
    gcoll_treq_t r = req(0, 4242, got, sizeof(got));
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    uint64_t cookie = p->t[1]->cookie;
    uint64_t guesses[] = {0, 1, cookie ^ 1, cookie ^ (1ull << 63), ~cookie, p->t[0]->cookie};
    for (size_t i = 0; i < sizeof(guesses) / sizeof(guesses[0]); i++)
        stranger_send(p, w, e, guesses[i], 4242, evil, sizeof(evil));
    uint64_t until = gcoll_time_ms() + 300;
    while (gcoll_time_ms() < until) {
        progress_both(p);
        ucp_worker_progress(w);
    }
    assert_int_equal(r.done, 0);
    assert_null(p->t[1]->peers[0].rx.unexp); /* not kept for a later receive either */
    for (size_t i = 0; i < sizeof(got); i++)
        assert_int_equal(got[i], 0);

    stranger_send(p, w, e, cookie, 4242, evil, sizeof(evil));
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!r.done) {
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
        ucp_worker_progress(w);
    }
    assert_int_equal(r.status, GCOLL_OK);
    assert_memory_equal(got, evil, sizeof(evil));

    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(e, &cp);
    while (UCS_PTR_IS_PTR(sp) && ucp_request_check_status(sp) == UCS_INPROGRESS)
        ucp_worker_progress(w);
    if (UCS_PTR_IS_PTR(sp))
        ucp_request_free(sp);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
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
        cmocka_unit_test_setup_teardown(test_peer_fail_keeps_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unexpected_bound, setup_bounded, teardown),
        cmocka_unit_test_setup_teardown(test_stranger_injection, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
