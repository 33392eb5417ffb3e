/* test_ucx.c: the UCX transport's single-copy path (GCOLL_UCX_CMA_MIN) and shared-memory
 * mailbox (GCOLL_UCX_SHM_MAX) between two transport instances in one process: transfers
 * either way round, a send withdrawn while its message waits unexpected, a receive of
 * another length, malformed single-copy messages; a full mailbox, its records wrapping,
 * a full ring's sends waiting for room, records held in the ring until a receive waits, a
 * malformed record, an abort behind a message, the doorbell
 * that wakes a sleeping receiver; what a failed peer's unexpected messages become; the registration
 * cache; a stranger's endpoint sending gcoll's active messages without the cookie. Skips when UCX
 * cannot run here. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"
#include "flood_util.h"

typedef struct {
    gcoll_config_t cfg, cfg1; /* rank 0's and rank 1's */
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
    p->cfg.ucx_shm_max = 4096;
    if (getenv("GCOLL_TEST_UNEXPECTED_BOUND"))
        p->cfg.unexpected_bytes = 8 << 20;
    p->cfg1 = p->cfg;
    if (getenv("GCOLL_TEST_SHM_MAX1")) /* rank 1's GCOLL_UCX_SHM_MAX */
        p->cfg1.ucx_shm_max = strtoul(getenv("GCOLL_TEST_SHM_MAX1"), NULL, 10);
    for (int r = 0; r < 2; r++) {
        gcoll_transport_params_t params = {.rank = r,
                                           .size = 2,
                                           .cfg = r ? &p->cfg1 : &p->cfg,
                                           .local_ip = "127.0.0.1",
                                           .key = {(const uint8_t *)"k", 1},
                                           .wake_fd = -1};
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

/* setup with one environment variable set for it alone */
static int setup_with(void **state, const char *name, const char *value)
{
    setenv(name, value, 1);
    int rc = setup(state);
    unsetenv(name);
    return rc;
}

/* With GCOLL_UNEXPECTED_BYTES=8mb. */
static int setup_bounded(void **state)
{
    return setup_with(state, "GCOLL_TEST_UNEXPECTED_BOUND", "1");
}

/* Without UCX's keepalive, which would wake a sleeping receiver every second anyway. */
static int setup_quiet(void **state)
{
    return setup_with(state, "UCX_KEEPALIVE_INTERVAL", "60s");
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

#define SKIP_WITHOUT_UCX(p)                                                                        \
    do {                                                                                           \
        if (!(p))                                                                                  \
            skip();                                                                                \
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
    while (!p->t[1]->peers[0].rx.unexp) {
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
    }
}

enum { VIA_UCX, VIA_CMA, VIA_SHM };

static void transfer(pair_t *p, size_t len, int recv_first, int via)
{
    uint8_t *src = malloc(len + 1), *dst = calloc(1, len + 1);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + len);
    unsigned long sends = p->t[0]->st_cma_sends, recvs = p->t[1]->st_cma_recvs;
    unsigned long shm_sends = p->t[0]->st_shm_sends, shm_recvs = p->t[1]->st_shm_recvs;
    gcoll_treq_t s = req(1, 1000 + len, src, len), r = req(0, 1000 + len, dst, len);
    if (recv_first)
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    if (via == VIA_SHM)
        assert_int_equal(s.done, 1); /* copied into the mailbox: complete at once */
    if (!recv_first && via == VIA_SHM) {
        /* no receive waits: the record stays in the ring (ucx_shm.c's poll_ring) */
        for (int i = 0; i < 3; i++)
            progress_both(p);
        assert_null(p->t[1]->peers[0].rx.unexp);
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    } else if (!recv_first) {
        wait_unexpected(p);
        if (via == VIA_CMA)
            assert_int_equal(s.done, 0); /* the send waits for the read */
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    }
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(s.status, GCOLL_OK);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, len);
    assert_memory_equal(src, dst, len);
    assert_int_equal(p->t[0]->st_cma_sends - sends, (unsigned long)(via == VIA_CMA));
    assert_int_equal(p->t[1]->st_cma_recvs - recvs, (unsigned long)(via == VIA_CMA));
    assert_int_equal(p->t[0]->st_shm_sends - shm_sends, (unsigned long)(via == VIA_SHM));
    assert_int_equal(p->t[1]->st_shm_recvs - shm_recvs, (unsigned long)(via == VIA_SHM));
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
        transfer(p, lens[i], 1, VIA_CMA);
        transfer(p, lens[i], 0, VIA_CMA);
    }
    /* below the threshold: UCX's own protocols */
    transfer(p, (128 << 10) - 1, 1, VIA_UCX);
    transfer(p, 4097, 0, VIA_UCX);
}

/* Rank 1 with another GCOLL_UCX_SHM_MAX (8 KiB, or 0: no mailbox). */
static int setup_shm8k(void **state)
{
    return setup_with(state, "GCOLL_TEST_SHM_MAX1", "8192");
}

static int setup_shm0(void **state)
{
    return setup_with(state, "GCOLL_TEST_SHM_MAX1", "0");
}

/* mesh_max: both ranks agree on the least mailbox size of the pair, and on 0 when one
 * side has no mailbox (whose small messages then go through UCX). */
static void test_mesh_max(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    size_t want = p->cfg1.ucx_shm_max ? GCOLL_MIN(p->cfg.ucx_shm_max, p->cfg1.ucx_shm_max) : 0;
    assert_int_equal(gcoll_ucx_ops.mesh_max(p->t[0]), want);
    assert_int_equal(gcoll_ucx_ops.mesh_max(p->t[1]), want);
    if (!want) {
        assert_null(p->t[0]->peers[1].shm_ring);
        transfer(p, 8, 1, VIA_UCX);
    }
}

/* Up to GCOLL_UCX_SHM_MAX bytes: through the peer's mailbox, both sides said so in their
 * hellos; empty messages too. */
static void test_mailbox(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    assert_non_null(p->t[0]->peers[1].shm_ring);
    assert_non_null(p->t[1]->peers[0].shm_ring);
    assert_int_equal(p->t[0]->nshm_senders, 1);
    assert_int_equal(p->t[1]->peers[0].shm_from, 1);
    const size_t lens[] = {0, 8, 40, 41, 1000, 4096};
    for (size_t i = 0; i < GCOLL_ARRAY_SIZE(lens); i++) {
        transfer(p, lens[i], 1, VIA_SHM);
        transfer(p, lens[i], 0, VIA_SHM);
    }
    transfer(p, 4097, 1, VIA_UCX);
}

/* A mailbox ring that fills (the receiver not polling) holds the rest back until there is
 * room, or sends them through UCX if the receiver stands still (as it may here, when the
 * test runs slowly); every message arrives whole whichever way it went, received in
 * another order, over several laps of the ring (records padded at its end). */
static void test_mailbox_full(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    enum { N = 40 };
    static uint8_t src[N][4096], dst[N][4096];
    gcoll_treq_t s[N], r[N], *all[2 * N];
    unsigned long full = p->t[0]->st_shm_full, via_shm = p->t[0]->st_shm_sends,
                  waits = p->t[0]->st_shm_waits;
    for (int lap = 0; lap < 5; lap++) {
        for (int i = 0; i < N; i++) {
            size_t len = 1000 + (size_t)((i * 977 + lap * 131) % 3097);
            for (size_t j = 0; j < len; j++)
                src[i][j] = (uint8_t)(i + j * 7 + lap);
            s[i] = req(1, (uint64_t)lap << 32 | (uint64_t)i, src[i], len);
            r[i] = req(0, (uint64_t)lap << 32 | (uint64_t)i, dst[i], len);
            assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s[i]), GCOLL_OK);
            gcoll_ucx_ops.progress(p->t[0], 0); /* the sender only */
        }
        for (int i = N - 1; i >= 0; i--) /* newest first */
            assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r[i]), GCOLL_OK);
        for (int i = 0; i < N; i++) {
            all[i] = &s[i];
            all[N + i] = &r[i];
        }
        drive(p, all, 2 * N);
        for (int i = 0; i < N; i++) {
            assert_int_equal(s[i].status, GCOLL_OK);
            assert_int_equal(r[i].status, GCOLL_OK);
            assert_int_equal(r[i].nbytes, s[i].len);
            assert_memory_equal(src[i], dst[i], s[i].len);
        }
    }
    /* the ring filled: sends waited for room (or, the receiver standing still, went
     * through UCX); most went through the mailbox */
    assert_true(p->t[0]->st_shm_waits > waits || p->t[0]->st_shm_full > full);
    assert_true(p->t[0]->st_shm_sends - via_shm > 5 * 10);
    assert_int_equal(p->t[0]->nshm_wait, 0);
}

/* Sends that find the ring full wait for room: written once the receiver drains it (none
 * through UCX), withdrawn by cancel; through UCX once the receiver's head has stood still
 * for SHM_STALL_NS (100 us; here 2 ms), after which the ring is used again as soon as it
 * has room; failed with the peer. 15 records of 4096 bytes fill a 64 KiB ring. */
static void test_mailbox_wait(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    enum { N = 20, L = 4096 };
    static uint8_t src[N][L], dst[N][L];
    gcoll_treq_t s[N], r[N], *all[2 * N];
    gcoll_transport_t *t0 = p->t[0];
    for (int round = 0; round < 2; round++) {
        unsigned long full = t0->st_shm_full, via_shm = t0->st_shm_sends;
        int waiting = 0;
        for (int i = 0; i < N; i++) {
            memset(src[i], i + 16 * round, L);
            s[i] = req(1, (uint64_t)(100 * round + i), src[i], L);
            assert_int_equal(gcoll_ucx_ops.isend(t0, &s[i]), GCOLL_OK);
            waiting += !s[i].done;
        }
        assert_true(waiting >= N - 15);
        assert_int_equal(t0->nshm_wait, (unsigned)waiting);
        assert_int_equal(t0->st_shm_full, full);
        if (round == 0) {
            gcoll_ucx_ops.cancel(t0, &s[N - 1]); /* waiting: withdrawn */
            assert_int_equal(s[N - 1].done, 1);
            assert_int_equal(s[N - 1].status, GCOLL_ERR_ABORTED);
            assert_int_equal(t0->nshm_wait, (unsigned)waiting - 1);
        }
        int n = 0;
        for (int i = 0; i < N; i++) {
            if (round == 0 && i == N - 1)
                continue;
            memset(dst[i], 0xee, L);
            r[i] = req(0, (uint64_t)(100 * round + i), dst[i], L);
            all[n++] = &s[i];
            all[n++] = &r[i];
        }
        if (round == 0) {
            for (int i = 0; i < N - 1; i++)
                assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r[i]), GCOLL_OK);
            assert_true(gcoll_ucx_shm_poll(p->t[1]) > 0); /* the receiver drains */
            gcoll_ucx_ops.progress(t0, 0);
            assert_int_equal(t0->nshm_wait, 0);
            assert_int_equal(t0->st_shm_full, full); /* all through the ring */
            assert_int_equal(t0->st_shm_sends - via_shm, N - 1);
        } else {
            usleep(2000);                  /* the receiver stands still */
            gcoll_ucx_ops.progress(t0, 0); /* the sender only: to UCX (which completes them) */
            assert_int_equal(t0->nshm_wait, 0);
            assert_int_equal(t0->st_shm_full - full, (unsigned long)waiting);
            assert_int_equal(t0->peers[1].shm_stalled, 1);
            for (int i = 0; i < N; i++)
                assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r[i]), GCOLL_OK);
        }
        drive(p, all, n);
        for (int i = 0; i < n; i++)
            assert_int_equal(all[i]->status, GCOLL_OK);
        for (int i = 0; i < n / 2; i++)
            assert_memory_equal(src[i], dst[i], L);
        assert_null(p->t[1]->peers[0].rx.unexp); /* the withdrawn one never came */
    }
    /* drained: the ring again */
    unsigned long via_shm = t0->st_shm_sends;
    transfer(p, 8, 0, VIA_SHM);
    assert_int_equal(t0->st_shm_sends - via_shm, 1);
    assert_int_equal(t0->peers[1].shm_stalled, 0);
    /* full again, then the peer fails: the waiting sends fail with it */
    for (int i = 0; i < N; i++) {
        s[i] = req(1, (uint64_t)(300 + i), src[i], L);
        assert_int_equal(gcoll_ucx_ops.isend(t0, &s[i]), GCOLL_OK);
    }
    assert_false(s[N - 1].done);
    gcoll_ucx_peer_fail(t0, 1, GCOLL_ERR_PEER);
    assert_int_equal(t0->nshm_wait, 0);
    assert_int_equal(s[N - 1].done, 1);
    assert_int_equal(s[N - 1].status, GCOLL_ERR_PEER);
}

/* Records no receive waits for stay in the ring: one for a standing receive's tag is
 * taken in (into that receive), the rest stay until a receive waits, and all come in
 * when a receive from any source looks. */
static void test_mailbox_hold(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    gcoll_transport_t *t1 = p->t[1];
    uint64_t a = 11, b = 22, c = 33, probe = 0, got = 0;
    gcoll_treq_t st = req(0, 77, &probe, 8);
    st.flags = GCOLL_TREQ_STANDING;
    assert_int_equal(gcoll_ucx_ops.irecv(t1, &st), GCOLL_OK);
    assert_int_equal(t1->peers[0].rx.nwant, 0);
    gcoll_treq_t s1 = req(1, 77, &a, 8), s2 = req(1, 5, &b, 8), s3 = req(1, 6, &c, 8);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s1), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s2), GCOLL_OK);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s3), GCOLL_OK);
    assert_true(s1.done && s2.done && s3.done);
    assert_int_equal(gcoll_ucx_shm_poll(t1), 1); /* the standing receive's */
    assert_true(st.done);
    assert_true(probe == a);
    for (int i = 0; i < 3; i++)
        gcoll_ucx_ops.progress(t1, 0);
    assert_null(t1->peers[0].rx.unexp);  /* 5 and 6 still in the ring */
    gcoll_treq_t r = req(0, 6, &got, 8); /* waits: 5 comes in unexpected, then 6 */
    assert_int_equal(gcoll_ucx_ops.irecv(t1, &r), GCOLL_OK);
    assert_int_equal(t1->peers[0].rx.nwant, 1);
    assert_int_equal(gcoll_ucx_shm_poll(t1), 2);
    assert_true(r.done);
    assert_true(got == c);
    assert_int_equal(t1->peers[0].rx.nwant, 0);
    assert_non_null(t1->peers[0].rx.unexp);
    assert_int_equal(t1->peers[0].rx.unexp->tag, 5);
    /* a receive from any source sees what the ring holds */
    uint64_t d = 44, tags[2] = {9, 0};
    gcoll_treq_t s4 = req(1, 9, &d, 8);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s4), GCOLL_OK);
    int peer = -2;
    assert_int_equal(gcoll_ucx_ops.peek(t1, tags, &peer), GCOLL_OK);
    assert_int_equal(peer, 0);
}

/* A record whose length field is out of bounds (a broken peer writes into our mailbox)
 * fails that peer with a reason; nothing is delivered. */
static void test_mailbox_malformed(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    transfer(p, 8, 1, VIA_SHM); /* the first record: the ring's next is at byte 64 */
    uint8_t dst[64];
    gcoll_treq_t r = req(0, 3, dst, sizeof(dst));
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    uint8_t *rec = p->t[0]->peers[1].shm_ring + 128 + 64; /* control block, then records */
    gcoll_put_u64(rec + 8, 3);
    gcoll_put_u32(rec + 16, 7);
    gcoll_put_u32(rec + 20, GCOLL_UCX_SHM_RING); /* longer than any record may be */
    __atomic_store_n((uint64_t *)rec, 64 + 1, __ATOMIC_RELEASE);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "malformed shared-memory"));
    assert_true(p->t[1]->peers[0].rx.failed);
}

/* An abort goes down the ring behind the messages before it: a receiver that polls only
 * its mailbox (as gcoll_ucx_drive may, several rounds in a row) takes the message first,
 * then the abort, which fails the sender. */
static void test_mailbox_abort(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    uint64_t src = 0x1122334455667788ull, dst = 0;
    gcoll_treq_t s = req(1, 9, &src, 8), r = req(0, 9, &dst, 8);
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    assert_int_equal(s.done, 1);
    gcoll_ucx_ops.abort(p->t[0], GCOLL_ERR_ABORTED, "gcoll_comm_abort was called");
    assert_int_equal(gcoll_ucx_shm_poll(p->t[1]), 2); /* the message, then the abort */
    assert_true(p->t[1]->aborted);
    assert_true(p->t[1]->peers[0].rx.failed);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "rank 0 aborted"));
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "gcoll_comm_abort was called"));
    /* the message came before the abort: it is still received */
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.status, GCOLL_OK);
    assert_true(dst == src);
}

/* An abort record whose reason is longer than an abort may carry is malformed. */
static void test_mailbox_abort_malformed(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    transfer(p, 8, 1, VIA_SHM); /* the next record is at byte 64 */
    uint8_t *rec = p->t[0]->peers[1].shm_ring + 128 + 64;
    gcoll_put_u64(rec + 8, (uint64_t)(int64_t)GCOLL_ERR_ABORTED);
    gcoll_put_u32(rec + 16, 1u << 20); /* the reason's length */
    gcoll_put_u32(rec + 20, 0xfffffffeu);
    __atomic_store_n((uint64_t *)rec, 64 + 1, __ATOMIC_RELEASE);
    assert_int_equal(gcoll_ucx_shm_poll(p->t[1]), 0);
    assert_false(p->t[1]->aborted);
    assert_true(p->t[1]->peers[0].rx.failed);
    assert_non_null(strstr(gcoll_ucx_ops.last_error(p->t[1]), "abort reason length"));
}

/* Payload bytes left in the ring from an earlier lap are never taken for a record: here the
 * 104-byte messages (two lines each) carry, where their second line starts, the very word
 * the receiver expects at that spot in the next lap (65536 + 128 + 1), and the receiver
 * polls while the sender has not written there yet. */
static void test_mailbox_stale_lap(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    transfer(p, 8, 1, VIA_SHM); /* records then start at 64 + 128 i, the next lap at 128 i */
    uint32_t src[26] = {0}, dst[26];
    src[10] = 65536 + 128 + 1;
    for (int i = 0; i < 1100; i++) {
        gcoll_treq_t s = req(1, 500 + (uint64_t)i, src, sizeof(src)),
                     r = req(0, 500 + (uint64_t)i, dst, sizeof(dst));
        assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
        gcoll_treq_t *both[] = {&s, &r};
        drive(p, both, 2);
        assert_int_equal(r.status, GCOLL_OK);
        assert_memory_equal(src, dst, sizeof(src));
        assert_null(p->t[1]->peers[0].rx.unexp); /* nothing made up */
    }
    assert_false(p->t[1]->peers[0].rx.failed);
}

/* Where the peer runs (peer_shares_cpu): both instances poll on this thread's CPU (pinned
 * here), so each sees the other on its own CPU; a peer published elsewhere is on another
 * one; no mailbox (itself) is unknown. */
static void test_peer_cpu(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    cpu_set_t old, one;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    int cpu = sched_getcpu();
    assert_true(cpu >= 0);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    progress_both(p);
    assert_int_equal(gcoll_ucx_ops.peer_shares_cpu(p->t[0], 1), 1);
    assert_int_equal(gcoll_ucx_ops.peer_shares_cpu(p->t[1], 0), 1);
    assert_int_equal(gcoll_ucx_ops.peer_shares_cpu(p->t[0], 0), -1);
    assert_int_equal(gcoll_ucx_ops.peer_shares_cpu(p->t[0], 2), -1);
    __atomic_store_n((int *)(p->t[0]->shm_box + 128), cpu + 2, __ATOMIC_RELAXED);
    assert_int_equal(gcoll_ucx_ops.peer_shares_cpu(p->t[1], 0), 0);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
}

typedef struct {
    gcoll_transport_t *t;
    gcoll_treq_t *r;
    uint64_t woke_ms;
} sleeper_t;

static void *sleep_in_progress(void *arg)
{
    sleeper_t *a = arg;
    uint64_t end = gcoll_time_ms() + 10000;
    while (!a->r->done && gcoll_time_ms() < end)
        gcoll_ucx_ops.progress(a->t, 4000); /* sleeps: nothing arrives for a while */
    a->woke_ms = gcoll_time_ms();
    return NULL;
}

/* A receiver asleep in epoll is woken by the sender's doorbell: without it the message
 * would wait in the mailbox until the 4-second sleep ran out (UCX's keepalive, which
 * would wake it within a second, is off: setup_quiet). */
static void test_mailbox_bell(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
    gcoll_treq_t s = req(1, 11, src, 8), r = req(0, 11, dst, 8);
    assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    unsigned long bells = p->t[0]->st_shm_bells, sleeps = p->t[1]->st_sleeps;
    sleeper_t a = {p->t[1], &r, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sleep_in_progress, &a), 0);
    uint64_t until = gcoll_time_ms() + 5000;
    while (p->t[1]->st_sleeps == sleeps && gcoll_time_ms() < until)
        usleep(1000);
    usleep(100000); /* well inside epoll_wait */
    uint64_t sent = gcoll_time_ms();
    assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
    assert_int_equal(s.done, 1);
    while (!r.done && gcoll_time_ms() < until + 5000)
        gcoll_ucx_ops.progress(p->t[0], 1); /* the doorbell's own send */
    pthread_join(th, NULL);
    assert_int_equal(r.status, GCOLL_OK);
    assert_memory_equal(src, dst, 8);
    assert_int_equal(p->t[0]->st_shm_bells - bells, 1);
    assert_true(a.woke_ms - sent < 1000);
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
        cmocka_unit_test_setup_teardown(test_mailbox, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup_shm8k, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup_shm0, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_stale_lap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_abort_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_cpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_bell, setup_quiet, teardown),
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
