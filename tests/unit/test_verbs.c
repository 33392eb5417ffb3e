/* test_verbs.c: the verbs transport's logic, driven through the ibv wrapper seam with the
 * in-memory fake device of fake_verbs.c. These are real tests of gcoll's code (setup order,
 * QP attributes, slots and credits, chunking, matching, error mapping, registration
 * cache, malformed input), NOT of any RDMA hardware, driver or fabric: the fake moves
 * bytes with memcpy. Hardware runs are tests/integration/test-verbs.sh.
 * This program: probe, connection setup and the data path; test_verbs_fail.c and
 * test_verbs_reg.c hold the rest, verbs_pair.c the helpers they share. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_verbs.h"
#include "base/util.h"
#include "transports/verbs/verbs.h"
#include "verbs_pair.h"

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
/* Point-to-point's tags (the top bit and a per-peer count, lib/core/group.c) between a
 * collective's: eager and rendezvous sizes, all sent before any receive, received in
 * another order, each landing where its tag says. */
static void test_p2p_tags(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    enum { N = 4 };
    const size_t lens[N] = {8, 200000, 0, 3000};
    const uint64_t tags[N] = {(1ull << 63) | 0, (1ull << 63) | 1, (7ull << 32) | 3,
                              (1ull << 63) | 2};
    static uint8_t src[N][200000], dst[N][200000];
    gcoll_treq_t s[N], r[N], *all[2 * N];
    for (int k = 0; k < N; k++) {
        for (size_t i = 0; i < lens[k]; i++)
            src[k][i] = (uint8_t)(k * 37 + i * 11);
        memset(dst[k], 0xee, lens[k]);
        s[k] = req(1, tags[k], src[k], lens[k]);
        r[k] = req(0, tags[k], dst[k], lens[k]);
        all[k] = &s[k];
        all[N + k] = &r[k];
    }
    for (int k = 0; k < N; k++)
        assert_int_equal(OPS.isend(p->t[0], &s[k]), GCOLL_OK);
    idle(p, 20);
    for (int k = N - 1; k >= 0; k--)
        assert_int_equal(OPS.irecv(p->t[1], &r[k]), GCOLL_OK);
    drive(p, all, 2 * N);
    for (int k = 0; k < N; k++) {
        assert_int_equal(r[k].status, GCOLL_OK);
        assert_memory_equal(src[k], dst[k], lens[k]);
    }
    pair_close(p);
}

/* A receive from any source over verbs (lib/core/group.c's use of the peek): rank 1 looks
 * for the next point-to-point message from rank 0 and from itself. A rendezvous offer from
 * rank 0 that came first is taken before a later eager message to itself, each then
 * received whole from the peer the peek named; a message with another tag is not seen. */
static void test_p2p_any(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    const uint64_t P = 1ull << 63;
    static uint8_t big[200000], bigout[200000];
    uint8_t self[8] = {1, 2, 3, 4, 5, 6, 7, 8}, selfout[8] = {0};
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 7 + 3);
    uint64_t tags[2] = {P | 0, P | 0};
    int peer = 99;
    assert_int_equal(OPS.peek(p->t[1], tags, &peer), GCOLL_OK);
    assert_int_equal(peer, -1);
    gcoll_treq_t s0 = req(1, P | 0, big, sizeof(big)), s1 = req(1, (3ull << 32) | 1, self, 8);
    assert_int_equal(OPS.isend(p->t[0], &s0), GCOLL_OK);
    assert_int_equal(OPS.isend(p->t[0], &s1), GCOLL_OK); /* a collective's: never peeked */
    idle(p, 20);
    gcoll_treq_t ss = req(1, P | 0, self, 8);
    assert_int_equal(OPS.isend(p->t[1], &ss), GCOLL_OK);
    assert_int_equal(OPS.peek(p->t[1], tags, &peer), GCOLL_OK);
    assert_int_equal(peer, 0);
    gcoll_treq_t r0 = req(0, P | 0, bigout, sizeof(bigout));
    assert_int_equal(OPS.irecv(p->t[1], &r0), GCOLL_OK);
    gcoll_treq_t *first[] = {&s0, &r0};
    drive(p, first, 2);
    assert_int_equal(r0.status, GCOLL_OK);
    assert_memory_equal(big, bigout, sizeof(big));
    tags[0] = P | 1; /* rank 0's next */
    assert_int_equal(OPS.peek(p->t[1], tags, &peer), GCOLL_OK);
    assert_int_equal(peer, 1);
    gcoll_treq_t rs = req(1, P | 0, selfout, 8);
    assert_int_equal(OPS.irecv(p->t[1], &rs), GCOLL_OK);
    gcoll_treq_t *second[] = {&ss, &rs};
    drive(p, second, 2);
    assert_memory_equal(self, selfout, 8);
    tags[1] = P | 1;
    assert_int_equal(OPS.peek(p->t[1], tags, &peer), GCOLL_OK);
    assert_int_equal(peer, -1);
    gcoll_treq_t rc = req(0, (3ull << 32) | 1, selfout, 8); /* the collective's message */
    assert_int_equal(OPS.irecv(p->t[1], &rc), GCOLL_OK);
    gcoll_treq_t *third[] = {&s1, &rc};
    drive(p, third, 2);
    pair_close(p);
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hca_match),
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
        cmocka_unit_test_setup_teardown(test_p2p_tags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_p2p_any, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
