/* test_ucx_shm.c: the UCX transport's shared-memory mailbox (GCOLL_UCX_SHM_MAX) between two
 * transport instances in one process: the mailbox size both agree on (mesh_max), transfers
 * through it, a full mailbox, its records wrapping, a full ring's sends waiting for room,
 * records held in the ring until a receive waits, the head told in steps or when asked, a malformed
 * record, a stale record of an earlier lap, an abort behind a message, the CPU each rank publishes,
 * the doorbell that wakes a sleeping receiver. Skips when UCX cannot run here. */
#include "ucx_pair.h"

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

/* While records stay in the ring (no receive wants them yet), the receiver tells the sender
 * how far it has read only in steps of a 32nd of the ring, so that a sender running
 * ahead reads that line once a step; as soon as the ring is empty it tells at once, so the
 * sender then has the whole ring. 8-byte records take 64 bytes, 32 to a step. */
static void test_mailbox_head_step(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    gcoll_transport_t *t0 = p->t[0], *t1 = p->t[1];
    enum { N = 200, REC = 64, STEP = GCOLL_UCX_SHM_RING / 32, RING = GCOLL_UCX_SHM_RING / REC };
    static uint64_t v[RING], got[N];
    gcoll_treq_t s[RING], r[N];
    for (int i = 0; i < N; i++) {
        v[i] = (uint64_t)i * 3 + 1;
        s[i] = req(1, 1000 + (uint64_t)i, &v[i], 8);
        assert_int_equal(gcoll_ucx_ops.isend(t0, &s[i]), GCOLL_OK);
        assert_true(s[i].done);
    }
    for (int i = 0; i < N; i++) {
        r[i] = req(0, 1000 + (uint64_t)i, &got[i], 8);
        assert_int_equal(gcoll_ucx_ops.irecv(t1, &r[i]), GCOLL_OK);
        assert_int_equal(gcoll_ucx_shm_poll(t1), 1); /* this one; the next stays */
        assert_true(r[i].done);
        assert_true(got[i] == v[i]);
        uint64_t head = (uint64_t)(i + 1) * REC;
        assert_int_equal(t1->peers[0].shm_head, head);
        if (i + 1 < N)
            assert_int_equal(t1->peers[0].shm_head_pub, head / STEP * STEP);
        else /* empty: told */
            assert_int_equal(t1->peers[0].shm_head_pub, head);
    }
    assert_null(t1->peers[0].rx.unexp);
    /* the sender sees the whole ring free: a ring's worth goes at once, none waits */
    unsigned long waits = t0->st_shm_waits, full = t0->st_shm_full;
    for (int i = 0; i < RING; i++) {
        s[i] = req(1, 5000 + (uint64_t)i, &v[i], 8);
        assert_int_equal(gcoll_ucx_ops.isend(t0, &s[i]), GCOLL_OK);
        assert_true(s[i].done);
    }
    assert_int_equal(t0->st_shm_waits, waits);
    assert_int_equal(t0->st_shm_full, full);
    assert_int_equal(t0->nshm_wait, 0);
    uint64_t sink[RING];
    for (int i = 0; i < RING; i++) {
        r[0] = req(0, 5000 + (uint64_t)i, &sink[i], 8);
        assert_int_equal(gcoll_ucx_ops.irecv(t1, &r[0]), GCOLL_OK);
        gcoll_treq_t *one = &r[0];
        drive(p, &one, 1);
        assert_true(sink[i] == v[i]);
    }
}

/* A sender that waits for room asks for the head after 25 us: a receiver that took a
 * record but holds the next (less than a step read) then tells it at its next look, and
 * the waiting send goes into the ring rather than through UCX; the ask ends with the
 * wait. */
static void test_mailbox_ask(void **state)
{
    pair_t *p = *state;
    SKIP_WITHOUT_UCX(p);
    gcoll_transport_t *t0 = p->t[0], *t1 = p->t[1];
    enum { RING = GCOLL_UCX_SHM_RING / 64 };
    /* the stall stretched from 100 us to 4 s (the ask: 1 s), so that a slow run (valgrind)
     * never sends through UCX on its own */
    t0->shm_stall_limit_ns = 4000000000ull;
    static uint64_t v[RING + 1], got[RING + 1];
    static gcoll_treq_t s[RING + 1], r[RING + 1];
    for (int i = 0; i <= RING; i++) {
        v[i] = (uint64_t)i * 7 + 5;
        s[i] = req(1, 100 + (uint64_t)i, &v[i], 8);
        assert_int_equal(gcoll_ucx_ops.isend(t0, &s[i]), GCOLL_OK);
        assert_int_equal(s[i].done, i < RING); /* the last finds the ring full */
    }
    unsigned long full = t0->st_shm_full, sends = t0->st_shm_sends;
    r[0] = req(0, 100, &got[0], 8);
    assert_int_equal(gcoll_ucx_ops.irecv(t1, &r[0]), GCOLL_OK);
    assert_int_equal(gcoll_ucx_shm_poll(t1), 1);
    assert_true(r[0].done && got[0] == v[0]);
    assert_int_equal(t1->peers[0].shm_head_pub, 0); /* one record read, the rest held */
    gcoll_ucx_ops.progress(t0, 0);
    assert_false(s[RING].done);
    /* it has waited 2 s: past the ask, short of the stall (set, not slept) */
    t0->peers[1].shm_stall_ns = gcoll_time_ns() - 2000000000ull;
    gcoll_ucx_ops.progress(t0, 0); /* asks */
    assert_int_equal(t0->peers[1].shm_asked, 1);
    assert_false(s[RING].done);
    assert_int_equal(gcoll_ucx_shm_poll(t1), 0); /* nothing wanted: only tells */
    assert_int_equal(t1->peers[0].shm_head_pub, 64);
    gcoll_ucx_ops.progress(t0, 0);
    assert_true(s[RING].done);
    assert_int_equal(t0->st_shm_full, full); /* not through UCX */
    assert_int_equal(t0->st_shm_sends - sends, 1);
    assert_int_equal(t0->nshm_wait, 0);
    assert_int_equal(t0->peers[1].shm_asked, 0); /* waits no more: asks no more */
    for (int i = 1; i <= RING; i++) {
        r[i] = req(0, 100 + (uint64_t)i, &got[i], 8);
        assert_int_equal(gcoll_ucx_ops.irecv(t1, &r[i]), GCOLL_OK);
        gcoll_treq_t *one = &r[i];
        drive(p, &one, 1);
        assert_true(got[i] == v[i]);
    }
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
        /* the receive waits first and the receiver looks at its head before the record is
         * written there: it must find nothing (not old payload taken for a record) */
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
        assert_int_equal(gcoll_ucx_shm_poll(p->t[1]), 0);
        assert_false(r.done);
        assert_null(p->t[1]->peers[0].rx.unexp);
        assert_int_equal(gcoll_ucx_ops.isend(p->t[0], &s), GCOLL_OK);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mailbox, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup_shm8k, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_max, setup_shm0, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_head_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_ask, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_stale_lap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_abort_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_cpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_bell, setup_quiet, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
