/* test_verbs.c: the verbs transport's logic, driven through the ibv wrapper seam with the
 * in-memory fake device of fake_verbs.c. These are real tests of gcoll's code (setup order,
 * QP attributes, slots and credits, chunking, matching, error mapping, registration
 * cache, malformed input), NOT of any RDMA hardware, driver or fabric: the fake moves
 * bytes with memcpy. Hardware runs are tests/integration/test-verbs.sh. */
#include <arpa/inet.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_verbs.h"
#include "util.h"
#include "verbs.h"

#define OPS gcoll_verbs_ops

/* ---- helpers -------------------------------------------------------------------------- */

typedef struct {
    gcoll_config_t cfg;
    gcoll_transport_t *t[2];
    int wake[2];
} pair_t;

typedef void (*tweak_fn)(gcoll_config_t *cfg);

static void load_cfg(gcoll_config_t *cfg)
{
    char err[256];
    assert_int_equal(gcoll_config_load(cfg, err, sizeof(err)), GCOLL_OK);
}

static gcoll_transport_t *make(pair_t *p, int rank, int size)
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

typedef struct {
    gcoll_transport_t *t;
    const void *blobs[2];
    size_t lens[2];
    gcoll_status_t st;
} conn_arg_t;

static void *connect_main(void *arg)
{
    conn_arg_t *a = arg;
    a->st = OPS.connect(a->t, a->blobs, a->lens, gcoll_time_ms() + 10000);
    return NULL;
}

/* Two ranks in one process, connected for real over loopback TCP (the side channel) and
 * the fake device; rank 1 connects on a thread since connect blocks on its peer. */
static pair_t *pair_open(tweak_fn tweak)
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

static void pair_close(pair_t *p)
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

static int setup(void **state)
{
    (void)state;
    unsetenv("GCOLL_IB_HCA");
    fake_verbs_install();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fake_verbs_uninstall();
    return 0;
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
        for (int i = 0; i < 2; i++)
            if (p->t[i])
                assert_int_equal(OPS.progress(p->t[i], 0), GCOLL_OK);
    }
}

static void idle(pair_t *p, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 2; i++)
            if (p->t[i])
                OPS.progress(p->t[i], 0);
}

static gcoll_treq_t req(int peer, uint64_t tag, void *buf, size_t len)
{
    return (gcoll_treq_t){.peer = peer, .tag = tag, .sig = 7, .buf = buf, .len = len};
}

static void check_transfer(pair_t *p, size_t len, int recv_first)
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

static void tw_qps2(gcoll_config_t *c)
{
    c->ib_qps_per_peer = 2;
    c->ib_mtu = IBV_MTU_1024;
    c->ib_timeout = 14;
    c->ib_retry_cnt = 5;
}

/* ---- probe and device choice ------------------------------------------------------------ */

static void test_probe_enosys(void **state)
{
    (void)state;
    char why[256] = "";
    fake_cfg.list_mode = FAKE_LIST_ENOSYS;
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "ENOSYS"));
    assert_non_null(strstr(why, "rdma link add"));
    fake_cfg.list_mode = FAKE_LIST_EMPTY;
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "empty list"));
    /* create refuses the same way, without leaking */
    gcoll_config_t cfg;
    load_cfg(&cfg);
    gcoll_transport_params_t params = {
        .rank = 0, .size = 1, .cfg = &cfg, .local_ip = "127.0.0.1", .wake_fd = -1};
    gcoll_transport_t *t = NULL;
    assert_int_equal(OPS.create(&params, &t), GCOLL_ERR_UNSUPPORTED);
    assert_null(t);
    gcoll_config_free(&cfg);
    assert_int_equal(fake_stats.live_ctx, 0);
}

static void test_probe_ports(void **state)
{
    (void)state;
    char why[256] = "";
    fake_cfg.port_state[0] = IBV_PORT_DOWN;
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "no active port"));
    assert_non_null(strstr(why, "fake_0:1 down"));
    assert_int_equal(fake_stats.live_ctx, 0);
    fake_cfg.port_state[0] = IBV_PORT_ACTIVE;
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_OK);
    setenv("GCOLL_IB_HCA", "mlx5_0:1", 1);
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "GCOLL_IB_HCA='mlx5_0:1'"));
    setenv("GCOLL_IB_HCA", "fake_1", 1);
    assert_int_equal(OPS.probe(why, sizeof(why)), GCOLL_OK);
    unsetenv("GCOLL_IB_HCA");
    /* GCOLL_IB_HCA picks the device the transport opens */
    gcoll_config_t cfg;
    load_cfg(&cfg);
    cfg.ib_hca = strdup("fake_1:1");
    gcoll_transport_params_t params = {
        .rank = 0, .size = 1, .cfg = &cfg, .local_ip = "127.0.0.1", .wake_fd = -1};
    gcoll_transport_t *t = NULL;
    assert_int_equal(OPS.create(&params, &t), GCOLL_OK);
    assert_string_equal(t->dev_name, "fake_1");
    assert_int_equal(t->port, 1);
    OPS.destroy(t);
    gcoll_config_free(&cfg);
    assert_int_equal(fake_stats.live_ctx, 0);
}

/* The real libibverbs through dlopen: on this build machine there is no RDMA device, so
 * probe must fail with a reason (ENOSYS, empty list, or library missing), never crash. */
static void test_probe_real_library(void **state)
{
    (void)state;
    fake_verbs_uninstall();
    char why[256] = "";
    gcoll_status_t st = OPS.probe(why, sizeof(why));
    if (st != GCOLL_OK) {
        assert_int_equal(st, GCOLL_ERR_UNSUPPORTED);
        assert_true(strlen(why) > 10);
        print_message("real verbs here: %s\n", why);
    }
    fake_verbs_install();
}

static void test_hca_match(void **state)
{
    (void)state;
    assert_true(gcoll_vb_hca_match(NULL, "mlx5_0", 1));
    assert_true(gcoll_vb_hca_match("", "mlx5_0", 1));
    assert_true(gcoll_vb_hca_match("mlx5", "mlx5_3", 2)); /* prefix, as NCCL */
    assert_false(gcoll_vb_hca_match("=mlx5", "mlx5_3", 1));
    assert_true(gcoll_vb_hca_match("=mlx5_3", "mlx5_3", 1));
    assert_true(gcoll_vb_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_1", 2));
    assert_false(gcoll_vb_hca_match("mlx5_0:1,mlx5_1:2", "mlx5_1", 1));
    assert_false(gcoll_vb_hca_match("^mlx5_0", "mlx5_0", 1));
    assert_true(gcoll_vb_hca_match("^mlx5_0", "rxe0", 1));
    assert_false(gcoll_vb_hca_match("rxe0:2", "rxe0", 1));
}

/* ---- connection setup ------------------------------------------------------------------ */

static void test_connect_order_and_attrs(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_qps2);
    assert_int_equal(fake_stats.bad_transitions, 0);
    assert_true(fake_stats.seq_create_cq < fake_stats.seq_first_qp);
    for (int side = 0; side < 2; side++) {
        gcoll_transport_t *t = p->t[side], *o = p->t[1 - side];
        assert_int_equal(t->nqp, 2);
        for (int q = 0; q < 2; q++) {
            gcoll_vb_qp_t *mine = &t->peers[1 - side].qps[q];
            gcoll_vb_qp_t *theirs = &o->peers[side].qps[q];
            const fake_qp_info_t *i = fake_verbs_qp_by_num(mine->qp->qp_num);
            assert_non_null(i);
            assert_int_equal(i->state, IBV_QPS_RTS);
            /* INIT, then receives, then RTR, then RTS; nothing sent during setup */
            assert_true(i->seq_init > 0 && i->seq_init < i->seq_first_recv);
            assert_true(i->seq_first_recv < i->seq_rtr && i->seq_rtr < i->seq_rts);
            assert_int_equal(i->seq_first_send, 0);
            /* INIT */
            assert_int_equal(i->init.port_num, 1);
            assert_int_equal(i->init.pkey_index, 0);
            assert_true(i->init.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
            /* RTR: aimed at the peer's matching QP and its initial PSN */
            assert_int_equal(i->rtr.dest_qp_num, theirs->qp->qp_num);
            assert_int_equal(i->rtr.rq_psn, theirs->psn);
            assert_int_equal(i->rtr.path_mtu, IBV_MTU_1024); /* GCOLL_IB_MTU below active */
            assert_int_equal(i->rtr.ah_attr.dlid, 0x11);
            assert_int_equal(i->rtr.ah_attr.is_global, 0); /* IB, same subnet: no GRH */
            assert_int_equal(i->rtr.ah_attr.port_num, 1);
            assert_int_equal(i->rtr.min_rnr_timer, 12);
            assert_int_equal(i->rtr.max_dest_rd_atomic, 1);
            /* RTS: our PSN, configured timeout and retries, RNR retried forever */
            assert_int_equal(i->rts.sq_psn, mine->psn);
            assert_int_equal(i->rts.timeout, 14);
            assert_int_equal(i->rts.retry_cnt, 5);
            assert_int_equal(i->rts.rnr_retry, 7);
            assert_true(mine->psn <= 0xffffff);
            assert_int_equal(i->max_recv_wr, (uint32_t)t->rq_depth);
        }
        /* every peer knows where to write */
        assert_true(t->peers[1 - side].ring_raddr ==
                    (uintptr_t)(o->rx_mem + (size_t)side * o->nslots * o->slot_size));
        assert_int_equal(t->peers[1 - side].ring_rkey, o->rx_mr->rkey);
    }
    check_transfer(p, 1000, 1);
    pair_close(p);
}

static void test_connect_roce(void **state)
{
    (void)state;
    fake_cfg.link_layer = IBV_LINK_LAYER_ETHERNET;
    fake_cfg.active_mtu = IBV_MTU_2048;
    pair_t *p = pair_open(NULL);
    for (int side = 0; side < 2; side++) {
        gcoll_transport_t *t = p->t[side], *o = p->t[1 - side];
        assert_true(t->roce);
        assert_int_equal(t->gid_index, 1); /* the IPv4-mapped GID */
        const fake_qp_info_t *i = fake_verbs_qp_by_num(t->peers[1 - side].qps[0].qp->qp_num);
        assert_int_equal(i->rtr.ah_attr.is_global, 1);
        assert_int_equal(i->rtr.ah_attr.grh.sgid_index, 1);
        assert_memory_equal(i->rtr.ah_attr.grh.dgid.raw, o->gid.raw, 16);
        assert_int_equal(i->rtr.ah_attr.grh.dgid.raw[10], 0xff);
        assert_int_equal(i->rtr.path_mtu, IBV_MTU_2048);
    }
    check_transfer(p, 50000, 0);
    pair_close(p);
}

static void tw_gid0(gcoll_config_t *c)
{
    c->ib_gid_index = 0;
}

static void test_connect_gid_index(void **state)
{
    (void)state;
    fake_cfg.link_layer = IBV_LINK_LAYER_ETHERNET;
    pair_t *p = pair_open(tw_gid0);
    assert_int_equal(p->t[0]->gid_index, 0);
    const fake_qp_info_t *i = fake_verbs_qp_by_num(p->t[0]->peers[1].qps[0].qp->qp_num);
    assert_int_equal(i->rtr.ah_attr.grh.sgid_index, 0);
    pair_close(p);
}

static void tw_slots8(gcoll_config_t *c)
{
    c->ib_eager_slots = 8;
}

static void test_connect_geometry_mismatch(void **state)
{
    (void)state;
    pair_t *p = calloc(1, sizeof(*p));
    load_cfg(&p->cfg);
    p->wake[0] = p->wake[1] = -1;
    p->t[0] = make(p, 0, 2);
    tw_slots8(&p->cfg);
    p->t[1] = make(p, 1, 2);
    uint8_t blob[2][256];
    size_t len[2] = {256, 256};
    for (int i = 0; i < 2; i++)
        assert_int_equal(OPS.address(p->t[i], blob[i], &len[i]), GCOLL_OK);
    conn_arg_t a[2];
    for (int i = 0; i < 2; i++)
        a[i] = (conn_arg_t){.t = p->t[i], .blobs = {blob[0], blob[1]}, .lens = {len[0], len[1]}};
    /* a malformed blob is refused before anything is dialled */
    uint8_t bad[256];
    memcpy(bad, blob[1], len[1]);
    bad[0] = 'X';
    const void *bb[2] = {blob[0], bad};
    assert_int_equal(OPS.connect(p->t[0], bb, len, gcoll_time_ms() + 1000), GCOLL_ERR_INVALID);
    assert_non_null(strstr(OPS.last_error(p->t[0]), "malformed verbs address"));
    p->t[0]->errmsg[0] = '\0';
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, connect_main, &a[1]), 0);
    connect_main(&a[0]);
    pthread_join(th, NULL);
    assert_int_equal(a[0].st, GCOLL_ERR_MISMATCH);
    assert_non_null(strstr(OPS.last_error(p->t[0]), "GCOLL_IB_EAGER_SLOTS"));
    pair_close(p);
}

/* ---- data path --------------------------------------------------------------------------- */

static void test_transfer(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    size_t em = p->t[0]->eager_max;
    const size_t lens[] = {0, 1, 100, em, em + 1, 100003, 3 << 20};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        check_transfer(p, lens[i], 1);
        check_transfer(p, lens[i], 0);
    }
    assert_int_equal(fake_stats.rnr, 0);
    pair_close(p);
}

static void tw_small_msg(gcoll_config_t *c)
{
    c->ib_qps_per_peer = 2;
}

/* No single write exceeds the port's max_msg_sz: slots shrink to it, rendezvous chunks. */
static void test_chunking(void **state)
{
    (void)state;
    fake_cfg.max_msg_sz = 4096;
    pair_t *p = pair_open(tw_small_msg);
    assert_int_equal(p->t[0]->chunk_max, 4096);
    assert_true(p->t[0]->slot_size <= 4096);
    uint64_t c0 = p->t[0]->n_chunks;
    check_transfer(p, 100000, 1);
    assert_int_equal(p->t[0]->n_chunks - c0, (100000 + 4095) / 4096);
    check_transfer(p, 4096 * 8, 0);
    assert_true(fake_stats.max_write <= 4096);
    pair_close(p);
}

static void tw_chunk(gcoll_config_t *c)
{
    c->ib_chunk = 10000;
}

static void test_chunk_setting(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_chunk);
    check_transfer(p, 100000, 1);
    assert_int_equal(p->t[0]->n_chunks, 10);
    assert_int_equal(fake_stats.max_write, 10000);
    pair_close(p);
}

static void tw_slots4(gcoll_config_t *c)
{
    c->ib_eager_slots = 4;
}

/* Many more messages than slots: the sender stops at its credits, the receiver returns
 * credits (without a slot of its own) as it frees slots, the ring wraps many times. */
static void test_credits_many_outstanding(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_slots4);
    enum { N = 50 };
    static uint32_t src[N][64], dst[N][64];
    gcoll_treq_t s[N], r[N], *all[2 * N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < 64; i++)
            src[k][i] = (uint32_t)(k * 1000 + i);
        s[k] = req(1, 1000 + k, src[k], sizeof(src[k]));
        r[k] = req(0, 1000 + k, dst[k], sizeof(dst[k]));
        all[k] = &s[k];
        all[N + k] = &r[k];
    }
    for (int k = 0; k < N; k++)
        assert_int_equal(OPS.isend(p->t[0], &s[k]), GCOLL_OK);
    gcoll_vb_peer_t *tx = &p->t[0]->peers[1], *rx = &p->t[1]->peers[0];
    /* the receiver has not looked yet: exactly one ring's worth left */
    assert_int_equal(fake_stats.writes, 4);
    assert_int_equal(tx->tx_seq, 4);
    assert_int_equal(tx->tx_acked, 0);
    assert_true(p->t[0]->n_stalls > 0);
    /* receives posted in reverse: matching is by tag, not order */
    for (int k = N - 1; k >= 0; k--)
        assert_int_equal(OPS.irecv(p->t[1], &r[k]), GCOLL_OK);
    drive(p, all, 2 * N);
    for (int k = 0; k < N; k++) {
        assert_int_equal(s[k].status, GCOLL_OK);
        assert_int_equal(r[k].status, GCOLL_OK);
        assert_memory_equal(src[k], dst[k], sizeof(src[k]));
    }
    idle(p, 5);
    assert_int_equal(tx->tx_seq, N);                       /* wrapped N / 4 times */
    assert_int_equal(rx->rx_head, N);                      /* every slot freed, in order */
    assert_true(tx->tx_seq - tx->tx_acked < 4);            /* credits never exceed the ring */
    assert_int_equal(tx->tx_seq - tx->tx_acked, rx->owed); /* the rest is still owed */
    assert_true(p->t[1]->n_credit_msgs > 0);
    assert_int_equal(fake_stats.rnr, 0);
    /* credits ride along with traffic the other way instead of costing a message */
    uint64_t cm = p->t[1]->n_credit_msgs;
    uint64_t owed = rx->owed;
    char b = 0, c = 0;
    gcoll_treq_t back = req(0, 5, &b, 1), got = req(1, 5, &c, 1);
    OPS.irecv(p->t[0], &got);
    OPS.isend(p->t[1], &back);
    gcoll_treq_t *two[] = {&back, &got};
    drive(p, two, 2);
    if (owed)
        assert_int_equal(rx->owed, 0);
    assert_int_equal(p->t[1]->n_credit_msgs, cm);
    pair_close(p);
}

static void tw_slots4_qp2(gcoll_config_t *c)
{
    c->ib_eager_slots = 4;
    c->ib_qps_per_peer = 2;
}

/* With several QPs slots can land out of order; credits return only for the contiguous
 * prefix of freed slots, because the sender reuses slots in order. */
static void test_credits_out_of_order(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_slots4_qp2);
    uint8_t src[4][10], dst[4][10];
    gcoll_treq_t s[4], r[4], *all[8];
    fake_verbs_hold(1);
    for (int k = 0; k < 4; k++) {
        memset(src[k], 'a' + k, 10);
        s[k] = req(1, 10 + k, src[k], 10);
        r[k] = req(0, 10 + k, dst[k], 10);
        all[k] = &s[k];
        all[4 + k] = &r[k];
        OPS.irecv(p->t[1], &r[k]);
        OPS.isend(p->t[0], &s[k]);
    }
    gcoll_vb_peer_t *rx = &p->t[1]->peers[0];
    assert_int_equal(fake_verbs_release(1, 3), 3); /* slots 3, 2, 1 land; 0 is late */
    gcoll_vb_drain(p->t[1]);
    assert_int_equal(rx->rx_count, 3);
    assert_int_equal(rx->rx_head, 0);
    assert_int_equal(rx->owed, 0);
    assert_true(rx->rx_done[1] && rx->rx_done[2] && rx->rx_done[3]);
    assert_true(r[3].done && r[1].done && !r[0].done);
    assert_int_equal(fake_verbs_release(0, -1), 1);
    gcoll_vb_drain(p->t[1]);
    assert_int_equal(rx->rx_head, 4);
    assert_int_equal(rx->owed, 4);
    fake_verbs_hold(0);
    drive(p, all, 8);
    for (int k = 0; k < 4; k++)
        assert_memory_equal(src[k], dst[k], 10);
    idle(p, 5);
    assert_int_equal(p->t[0]->peers[1].tx_acked, 4);
    pair_close(p);
}

/* Rendezvous and eager messages mixed, many in flight, over 2 QPs with small chunks. */
static void tw_mix(gcoll_config_t *c)
{
    c->ib_qps_per_peer = 2;
    c->ib_eager_slots = 4;
    c->ib_chunk = 3000;
}

static void test_many_mixed(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_mix);
    enum { N = 24 };
    uint8_t *src[N], *dst[N];
    gcoll_treq_t s[N], r[N], *all[2 * N];
    for (int k = 0; k < N; k++) {
        size_t len = (k % 3 == 0) ? 20000 + (size_t)k : (size_t)k * 50;
        src[k] = malloc(len + 1);
        dst[k] = calloc(1, len + 1);
        for (size_t i = 0; i < len; i++)
            src[k][i] = (uint8_t)(i + (size_t)k);
        s[k] = req(1, 500 + k, src[k], len);
        r[k] = req(0, 500 + k, dst[k], len);
        all[k] = &s[k];
        all[N + k] = &r[k];
    }
    for (int k = 0; k < N; k += 2) /* half posted before, half after the sends */
        OPS.irecv(p->t[1], &r[k]);
    for (int k = 0; k < N; k++)
        OPS.isend(p->t[0], &s[k]);
    for (int k = 1; k < N; k += 2)
        OPS.irecv(p->t[1], &r[k]);
    drive(p, all, 2 * N);
    for (int k = 0; k < N; k++) {
        assert_int_equal(r[k].status, GCOLL_OK);
        if (s[k].len)
            assert_memory_equal(src[k], dst[k], s[k].len);
        assert_int_equal(dst[k][s[k].len], 0);
        free(src[k]);
        free(dst[k]);
    }
    assert_int_equal(fake_stats.rnr, 0);
    pair_close(p);
}

static void test_anylen_self_zero(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    char msg[] = "hello", buf[64] = {0};
    gcoll_treq_t s = req(1, 5, msg, sizeof(msg)), r = req(0, 5, buf, sizeof(buf));
    r.flags = GCOLL_TREQ_ANYLEN;
    OPS.irecv(p->t[1], &r);
    OPS.isend(p->t[0], &s);
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, sizeof(msg));
    assert_string_equal(buf, "hello");
    /* ANYLEN over rendezvous: 50000 bytes into a 100000-byte receive */
    uint8_t *big = malloc(100000), *into = calloc(1, 100000);
    memset(big, 0x3c, 100000);
    s = req(1, 6, big, 50000);
    r = req(0, 6, into, 100000);
    r.flags = GCOLL_TREQ_ANYLEN;
    OPS.isend(p->t[0], &s);
    idle(p, 3);
    OPS.irecv(p->t[1], &r);
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, 50000);
    assert_memory_equal(big, into, 50000);
    assert_int_equal(into[50000], 0);
    /* sends to oneself are delivered in memory, any size, either order */
    gcoll_treq_t ss = req(0, 9, big, 100000), rs = req(0, 9, into, 100000);
    memset(into, 0, 100000);
    OPS.isend(p->t[0], &ss);
    OPS.irecv(p->t[0], &rs);
    assert_true(ss.done && rs.done);
    assert_int_equal(rs.status, GCOLL_OK);
    assert_memory_equal(big, into, 100000);
    rs = req(0, 10, buf, sizeof(msg));
    ss = req(0, 10, msg, sizeof(msg));
    OPS.irecv(p->t[0], &rs);
    OPS.isend(p->t[0], &ss);
    assert_true(rs.done);
    /* zero-length messages both ways */
    gcoll_treq_t z1 = req(1, 11, NULL, 0), z2 = req(0, 11, NULL, 0);
    gcoll_treq_t z3 = req(0, 12, NULL, 0), z4 = req(1, 12, NULL, 0);
    OPS.isend(p->t[0], &z1);
    OPS.irecv(p->t[1], &z2);
    OPS.isend(p->t[1], &z3);
    OPS.irecv(p->t[0], &z4);
    gcoll_treq_t *four[] = {&z1, &z2, &z3, &z4};
    drive(p, four, 4);
    assert_int_equal(z2.status, GCOLL_OK);
    assert_int_equal(z4.status, GCOLL_OK);
    assert_int_equal(z2.nbytes, 0);
    free(big);
    free(into);
    pair_close(p);
}

/* A length or signature mismatch fails the receive (never an overrun) and the link goes on. */
static void test_mismatch(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    uint8_t a[100] = {1}, b[100];
    memset(b, 0xee, sizeof(b));
    gcoll_treq_t s = req(1, 1, a, 100), r = req(0, 1, b, 99);
    OPS.irecv(p->t[1], &r);
    OPS.isend(p->t[0], &s);
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    assert_int_equal(b[0], 0xee); /* nothing written */
    assert_non_null(strstr(OPS.last_error(p->t[1]), "counts differ"));
    /* unexpected first, then a receive with another signature */
    s = req(1, 2, a, 100);
    r = req(0, 2, b, 100);
    r.sig = 8;
    OPS.isend(p->t[0], &s);
    idle(p, 5);
    OPS.irecv(p->t[1], &r);
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    /* rendezvous: the receiver refuses, so the sender fails too instead of waiting */
    uint8_t *big = calloc(1, 200000), *small = calloc(1, 150000);
    s = req(1, 3, big, 200000);
    r = req(0, 3, small, 150000);
    OPS.irecv(p->t[1], &r);
    OPS.isend(p->t[0], &s);
    drive(p, both, 2);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    assert_int_equal(s.status, GCOLL_ERR_MISMATCH);
    assert_non_null(strstr(OPS.last_error(p->t[0]), "refused"));
    free(big);
    free(small);
    check_transfer(p, 5000, 1);
    check_transfer(p, 50000, 1);
    pair_close(p);
}

/* ---- failures ---------------------------------------------------------------------------- */

/* Every work-completion error reaches the request as a gcoll status, named in the message;
 * pending receives from that peer fail with it too. */
static void test_completion_errors(void **state)
{
    (void)state;
    const gcoll_ibv_ops_t *ibv;
    for (int s = IBV_WC_LOC_LEN_ERR; s <= IBV_WC_TM_RNDV_INCOMPLETE; s++) {
        fake_verbs_install();
        assert_int_equal(gcoll_ibv_get(&ibv, NULL, 0), GCOLL_OK);
        pair_t *p = pair_open(NULL);
        uint8_t buf[100] = {0}, in[10];
        gcoll_treq_t pending = req(1, 99, in, sizeof(in)), other = req(0, 98, in, sizeof(in));
        OPS.irecv(p->t[0], &pending);
        OPS.irecv(p->t[1], &other);
        fake_verbs_fail_sends(1, (enum ibv_wc_status)s);
        gcoll_treq_t snd = req(1, 1, buf, sizeof(buf));
        assert_int_equal(OPS.isend(p->t[0], &snd), GCOLL_OK);
        gcoll_treq_t *two[] = {&snd, &pending};
        drive(p, two, 2);
        gcoll_status_t want = gcoll_vb_wc_status((enum ibv_wc_status)s);
        assert_true(want < 0);
        assert_int_equal(snd.status, want);
        assert_int_equal(pending.status, want);
        const char *err = OPS.last_error(p->t[0]);
        assert_non_null(strstr(err, gcoll_vb_wc_name((enum ibv_wc_status)s)));
        assert_non_null(strstr(err, ibv->wc_status_str((enum ibv_wc_status)s)));
        assert_non_null(strstr(err, "rank 1"));
        /* later operations with that peer fail at once */
        gcoll_treq_t again = req(1, 2, buf, 10);
        OPS.isend(p->t[0], &again);
        assert_true(again.done);
        assert_int_equal(again.status, want);
        /* the other rank learns it too (its side channel closes): no waiting for a timeout */
        gcoll_treq_t *o[] = {&other};
        drive(p, o, 1);
        assert_int_equal(other.status, GCOLL_ERR_PEER);
        idle(p, 3); /* flushed receives after the failure are not new errors */
        assert_non_null(strstr(OPS.last_error(p->t[0]), gcoll_vb_wc_name((enum ibv_wc_status)s)));
        pair_close(p);
    }
    /* the mapping the issue names */
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_RETRY_EXC_ERR), GCOLL_ERR_PEER);
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_RNR_RETRY_EXC_ERR), GCOLL_ERR_PEER);
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_REM_ACCESS_ERR), GCOLL_ERR_TRANSPORT);
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_WR_FLUSH_ERR), GCOLL_ERR_TRANSPORT);
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_LOC_PROT_ERR), GCOLL_ERR_INTERNAL);
    assert_int_equal(gcoll_vb_wc_status(IBV_WC_SUCCESS), GCOLL_OK);
    assert_int_equal(gcoll_vb_wc_status((enum ibv_wc_status)200), GCOLL_ERR_TRANSPORT);
    assert_string_equal(gcoll_vb_wc_name((enum ibv_wc_status)200), "IBV_WC_(unknown)");
}

static void test_abort(void **state)
{
    (void)state;
    const gcoll_status_t causes[2] = {GCOLL_ERR_MISMATCH, GCOLL_ERR_TIMEOUT};
    const gcoll_status_t seen[2] = {GCOLL_ERR_MISMATCH, GCOLL_ERR_PEER};
    for (int i = 0; i < 2; i++) {
        pair_t *p = pair_open(NULL);
        uint8_t buf[64];
        gcoll_treq_t r = req(0, 77, buf, sizeof(buf));
        OPS.irecv(p->t[1], &r);
        OPS.abort(p->t[0], causes[i], "counts differ");
        gcoll_treq_t *one[] = {&r};
        drive(p, one, 1);
        assert_int_equal(r.status, seen[i]);
        assert_non_null(strstr(OPS.last_error(p->t[1]), "rank 0 aborted: counts differ"));
        pair_close(p);
    }
}

static void tw_slots2(gcoll_config_t *c)
{
    c->ib_eager_slots = 2;
}

static void test_cancel(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_slots2);
    uint8_t buf[64] = {0};
    gcoll_treq_t r = req(0, 99, buf, sizeof(buf));
    OPS.irecv(p->t[1], &r);
    OPS.cancel(p->t[1], &r);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_ERR_ABORTED);
    /* a send still waiting for credits is withdrawn without touching the link */
    gcoll_treq_t s[4];
    for (int k = 0; k < 4; k++) {
        s[k] = req(1, 200 + k, buf, 8);
        OPS.isend(p->t[0], &s[k]);
    }
    assert_false(s[3].done);
    OPS.cancel(p->t[0], &s[3]);
    assert_true(s[3].done);
    assert_int_equal(s[3].status, GCOLL_ERR_ABORTED);
    /* an eager send already copied out: only the request is forgotten */
    assert_false(s[0].done);
    OPS.cancel(p->t[0], &s[0]);
    assert_int_equal(s[0].status, GCOLL_ERR_ABORTED);
    gcoll_treq_t rr[3];
    for (int k = 0; k < 3; k++) {
        rr[k] = req(0, 200 + k, buf, 8);
        OPS.irecv(p->t[1], &rr[k]);
    }
    gcoll_treq_t *w[] = {&s[1], &s[2], &rr[0], &rr[1], &rr[2]};
    drive(p, w, 5);
    check_transfer(p, 100, 1);
    /* a rendezvous under way cannot be withdrawn: the peer connection goes */
    uint8_t *big = calloc(1, 100000);
    gcoll_treq_t bs = req(1, 300, big, 100000);
    OPS.isend(p->t[0], &bs);
    idle(p, 2);
    OPS.cancel(p->t[0], &bs);
    assert_int_equal(bs.status, GCOLL_ERR_ABORTED);
    assert_true(p->t[0]->peers[1].failed);
    free(big);
    pair_close(p);
}

static void test_peer_closed(void **state)
{
    (void)state;
    /* a peer that leaves with our receive pending fails it (GCOLL_ERR_PEER) */
    pair_t *p = pair_open(NULL);
    uint8_t buf[64];
    gcoll_treq_t r = req(0, 77, buf, sizeof(buf));
    OPS.irecv(p->t[1], &r);
    OPS.destroy(p->t[0]);
    p->t[0] = NULL;
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_non_null(strstr(OPS.last_error(p->t[1]), "closed with operations pending"));
    pair_close(p);
    /* a peer that leaves cleanly after sending: its message is still received */
    p = pair_open(NULL);
    char msg[] = "bye";
    gcoll_treq_t s = req(1, 5, msg, sizeof(msg));
    OPS.isend(p->t[0], &s);
    gcoll_treq_t *sone[] = {&s};
    drive(p, sone, 1);
    OPS.destroy(p->t[0]);
    p->t[0] = NULL;
    idle(p, 5);
    assert_true(p->t[1]->peers[0].closed);
    r = req(0, 5, buf, sizeof(msg));
    OPS.irecv(p->t[1], &r);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_OK);
    assert_string_equal((char *)buf, "bye");
    r = req(0, 6, buf, 4);
    OPS.irecv(p->t[1], &r);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    pair_close(p);
}

typedef struct {
    int delay_ms;
    int wake_fd;
} later_t;

static void *release_later(void *arg)
{
    later_t *l = arg;
    usleep((useconds_t)l->delay_ms * 1000);
    if (l->wake_fd >= 0) {
        uint64_t one = 1;
        assert_int_equal(write(l->wake_fd, &one, sizeof(one)), sizeof(one));
    } else {
        fake_verbs_release(0, -1);
    }
    return NULL;
}

/* progress blocks on the completion channel and the wake fd, and returns on either. */
static void test_progress_blocks(void **state)
{
    (void)state;
    pair_t *p = calloc(1, sizeof(*p));
    load_cfg(&p->cfg);
    p->wake[0] = -1;
    p->wake[1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->t[0] = make(p, 0, 2);
    p->t[1] = make(p, 1, 2);
    uint8_t blob[2][256];
    size_t len[2] = {256, 256};
    for (int i = 0; i < 2; i++)
        OPS.address(p->t[i], blob[i], &len[i]);
    conn_arg_t a[2];
    for (int i = 0; i < 2; i++)
        a[i] = (conn_arg_t){.t = p->t[i], .blobs = {blob[0], blob[1]}, .lens = {len[0], len[1]}};
    pthread_t th;
    pthread_create(&th, NULL, connect_main, &a[1]);
    connect_main(&a[0]);
    pthread_join(th, NULL);
    assert_int_equal(a[1].st, GCOLL_OK);
    /* nothing to do: waits the whole timeout */
    uint64_t t0 = gcoll_time_ms();
    assert_int_equal(OPS.progress(p->t[1], 150), GCOLL_OK);
    assert_true(gcoll_time_ms() - t0 >= 140);
    /* a message arriving while blocked ends the wait through the channel event */
    char m[8] = "x", in[8];
    gcoll_treq_t r = req(0, 1, in, 8), s = req(1, 1, m, 8);
    OPS.irecv(p->t[1], &r);
    fake_verbs_hold(1);
    OPS.isend(p->t[0], &s);
    fake_verbs_hold(0);
    later_t l = {.delay_ms = 50, .wake_fd = -1};
    pthread_create(&th, NULL, release_later, &l);
    t0 = gcoll_time_ms();
    while (!r.done && gcoll_time_ms() - t0 < 3000)
        OPS.progress(p->t[1], 3000);
    pthread_join(th, NULL);
    assert_true(r.done);
    assert_true(gcoll_time_ms() - t0 < 2000);
    /* the wake fd (abort) ends the wait as well */
    l = (later_t){.delay_ms = 50, .wake_fd = p->wake[1]};
    pthread_create(&th, NULL, release_later, &l);
    t0 = gcoll_time_ms();
    OPS.progress(p->t[1], 3000);
    pthread_join(th, NULL);
    assert_true(gcoll_time_ms() - t0 < 2000);
    close(p->wake[1]);
    pair_close(p);
}

/* ---- malformed input ---------------------------------------------------------------------- */

static void test_header_codec(void **state)
{
    (void)state;
    uint8_t b[GCOLL_VB_HDR_LEN + 16];
    gcoll_vb_hdr_t h = {.type = GCOLL_VB_MSG_DATA,
                        .sig = 0xabcdef01,
                        .tag = 0x1122334455667788ull,
                        .len = 16,
                        .credits = 3},
                   g;
    gcoll_vb_hdr_encode(&h, b);
    assert_null(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN + 16, 100, &g));
    assert_int_equal(g.sig, h.sig);
    assert_true(g.tag == h.tag);
    assert_int_equal(g.credits, 3);
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN + 15, 100, &g),
                        "payload length disagrees with the bytes written");
    assert_string_equal(gcoll_vb_hdr_decode(b, 10, 100, &g), "message shorter than its header");
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN + 16, 15, &g),
                        "eager payload larger than a slot");
    b[2] = 9;
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN + 16, 100, &g),
                        "unsupported protocol version");
    gcoll_vb_hdr_encode(&h, b);
    b[47] = 1;
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN + 16, 100, &g),
                        "reserved header byte set");
    h = (gcoll_vb_hdr_t){.type = GCOLL_VB_MSG_RTS, .len = 0};
    gcoll_vb_hdr_encode(&h, b);
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN, 100, &g), "empty rendezvous");
    h = (gcoll_vb_hdr_t){.type = GCOLL_VB_MSG_CTS, .len = 5, .id2 = 0x40000000};
    gcoll_vb_hdr_encode(&h, b);
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN, 100, &g),
                        "rendezvous id out of range");
    h = (gcoll_vb_hdr_t){.type = GCOLL_VB_MSG_NACK};
    gcoll_vb_hdr_encode(&h, b);
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN, 100, &g),
                        "refusal without a status");
    h.type = 0;
    gcoll_vb_hdr_encode(&h, b);
    assert_string_equal(gcoll_vb_hdr_decode(b, GCOLL_VB_HDR_LEN, 100, &g), "unknown message type");
}

/* One malformed arrival at rank 1 from rank 0: bytes placed in the slot (if any) and a
 * receive completion with imm and byte_len, as a broken or hostile peer could make. */
typedef struct {
    const char *why;
    int write_slot; /* put hdr into slot idx first */
    gcoll_vb_hdr_t hdr;
    int corrupt_magic;
    uint32_t imm;
    uint32_t byte_len;
} bad_case_t;

static void run_bad_case(const bad_case_t *c)
{
    pair_t *p = pair_open(NULL);
    gcoll_transport_t *t = p->t[1];
    uint8_t buf[64];
    gcoll_treq_t r = req(0, 77, buf, sizeof(buf));
    OPS.irecv(t, &r);
    if (c->write_slot) {
        uint8_t *slot = t->rx_mem; /* rank 0's ring, slot 0 */
        gcoll_vb_hdr_encode(&c->hdr, slot);
        if (c->corrupt_magic)
            slot[0] ^= 0xff;
    }
    assert_int_equal(fake_verbs_inject_recv(t->peers[0].qps[0].qp->qp_num, c->imm, c->byte_len), 0);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_TRANSPORT);
    const char *err = OPS.last_error(t);
    if (!strstr(err, c->why))
        fail_msg("expected '%s' in '%s'", c->why, err);
    assert_non_null(strstr(err, "malformed message from rank 0"));
    pair_close(p);
}

static void test_malformed_input(void **state)
{
    (void)state;
    const uint32_t S = GCOLL_VB_IMM_SLOT, H = GCOLL_VB_HDR_LEN;
    const bad_case_t cases[] = {
        {"bad magic", 1, {.type = GCOLL_VB_MSG_DATA, .tag = 77, .len = 4}, 1, S, H + 4},
        {"payload length disagrees",
         1,
         {.type = GCOLL_VB_MSG_DATA, .tag = 77, .len = 40},
         0,
         S,
         H + 4},
        {"eager payload larger than a slot",
         1,
         {.type = GCOLL_VB_MSG_DATA, .tag = 77, .len = 1u << 20},
         0,
         S,
         H + (1u << 20)},
        {"unknown message type", 1, {.type = 9}, 0, S, H},
        {"shorter than its header", 1, {.type = GCOLL_VB_MSG_DATA}, 0, S, 12},
        {"slot index out of range", 0, {0}, 0, gcoll_vb_imm(GCOLL_VB_IMM_SLOT, 16), H},
        {"returned more credits", 0, {0}, 0, gcoll_vb_imm(GCOLL_VB_IMM_CREDIT, 5), 0},
        {"returned more credits", 1, {.type = GCOLL_VB_MSG_DATA, .tag = 1, .credits = 2}, 0, S, H},
        {"end of an unknown rendezvous", 0, {0}, 0, gcoll_vb_imm(GCOLL_VB_IMM_FIN, 3), 0},
        {"clear-to-send for an unknown rendezvous",
         1,
         {.type = GCOLL_VB_MSG_CTS, .len = 100000, .id1 = 4},
         0,
         S,
         H},
        {"refusal of an unknown rendezvous", 1, {.type = GCOLL_VB_MSG_NACK, .status = 6}, 0, S, H},
        {"unknown immediate type", 0, {0}, 0, 0xc0000000u, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_bad_case(&cases[i]);
}

/* A slot written again before its credit came back (a peer ignoring flow control). */
static void test_credit_overrun(void **state)
{
    (void)state;
    pair_t *p = pair_open(tw_slots2);
    gcoll_transport_t *t = p->t[1];
    uint8_t buf[8];
    gcoll_treq_t r = req(0, 999, buf, sizeof(buf));
    OPS.irecv(t, &r);
    gcoll_vb_hdr_t h = {.type = GCOLL_VB_MSG_DATA, .tag = 1};
    uint32_t qpn = t->peers[0].qps[0].qp->qp_num;
    for (int k = 0; k < 2; k++) { /* slots 0 and 1 fill the ring */
        h.tag = 1 + (uint64_t)k;
        gcoll_vb_hdr_encode(&h, t->rx_mem + (size_t)k * t->slot_size);
        assert_int_equal(
            fake_verbs_inject_recv(qpn, gcoll_vb_imm(0, (uint32_t)k), GCOLL_VB_HDR_LEN), 0);
        gcoll_vb_drain(t);
    }
    /* pretend no credit went back: slot 0 written again is a flow-control violation */
    t->peers[0].rx_head = 0;
    h.tag = 3;
    gcoll_vb_hdr_encode(&h, t->rx_mem);
    assert_int_equal(fake_verbs_inject_recv(qpn, gcoll_vb_imm(0, 0), GCOLL_VB_HDR_LEN), 0);
    gcoll_treq_t *one[] = {&r};
    drive(p, one, 1);
    assert_int_equal(r.status, GCOLL_ERR_TRANSPORT);
    assert_non_null(strstr(OPS.last_error(t), "no credit"));
    pair_close(p);
}

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
        cmocka_unit_test(test_hca_match),
        cmocka_unit_test(test_header_codec),
        cmocka_unit_test_setup_teardown(test_probe_enosys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_ports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_probe_real_library, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_order_and_attrs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_roce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_gid_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_geometry_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credits_many_outstanding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credits_out_of_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_anylen_self_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_completion_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credit_overrun, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regcache_unit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_regcache_transport, setup, teardown),
        cmocka_unit_test_setup_teardown(test_comm_over_fake, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
