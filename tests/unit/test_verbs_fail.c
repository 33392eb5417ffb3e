/* test_verbs_fail.c: the verbs transport under failure and malformed input, with the fake
 * device of fake_verbs.c (completion errors, abort, cancel, a peer gone, bad headers). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_verbs.h"
#include "base/util.h"
#include "transports/verbs/verbs.h"
#include "verbs_pair.h"

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

/* A peer that fails (not one that leaves cleanly, test_peer_closed) leaves the whole
 * messages it sent before, as on tcp and ucx: one that waited unexpected is received
 * after the failure; a receive of anything else fails with the failure's status. */
static void test_failure_keeps_whole(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    char msg[] = "early";
    gcoll_treq_t s = req(0, 5, msg, sizeof(msg));
    OPS.isend(p->t[1], &s);
    gcoll_treq_t *sone[] = {&s};
    drive(p, sone, 1);
    idle(p, 3); /* rank 0 holds it unexpected */
    uint8_t buf[16];
    gcoll_treq_t pending = req(1, 9, buf, sizeof(buf));
    OPS.irecv(p->t[0], &pending);
    fake_verbs_fail_sends(1, IBV_WC_RETRY_EXC_ERR);
    gcoll_treq_t snd = req(1, 1, buf, sizeof(buf));
    assert_int_equal(OPS.isend(p->t[0], &snd), GCOLL_OK);
    gcoll_treq_t *two[] = {&snd, &pending};
    drive(p, two, 2);
    assert_int_equal(snd.status, GCOLL_ERR_PEER);
    assert_int_equal(pending.status, GCOLL_ERR_PEER);
    gcoll_treq_t r = req(1, 5, buf, sizeof(msg));
    OPS.irecv(p->t[0], &r);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, sizeof(msg));
    assert_memory_equal(buf, msg, sizeof(msg));
    gcoll_treq_t r2 = req(1, 6, buf, sizeof(msg));
    OPS.irecv(p->t[0], &r2);
    assert_true(r2.done);
    assert_int_equal(r2.status, GCOLL_ERR_PEER);
    pair_close(p);
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
    assert_true(p->t[0]->peers[1].rx.failed);
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

/* A peer killed (SIGKILL) runs no closing protocol: the kernel resets its side channel
 * (unread data, or as here SO_LINGER 0) and its queue pairs go silent. The survivor's
 * pending receive and its rendezvous send to it fail with GCOLL_ERR_PEER at once, not at
 * a timeout, and the reason says the rank exited or died, never "malformed". */
static void test_peer_killed(void **state)
{
    (void)state;
    pair_t *p = pair_open(NULL);
    uint8_t in[64];
    uint8_t *big = calloc(1, 100000);
    gcoll_treq_t r = req(1, 77, in, sizeof(in)), s = req(1, 78, big, 100000);
    OPS.irecv(p->t[0], &r);
    assert_int_equal(OPS.isend(p->t[0], &s), GCOLL_OK);
    idle(p, 3); /* the offer reaches rank 1, which has no receive for it */
    assert_false(r.done);
    assert_false(s.done);
    gcoll_transport_t *dead = p->t[1];
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(dead->peers[0].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(dead->peers[0].fd);
    dead->peers[0].fd = -1;
    p->t[1] = NULL; /* never progressed again */
    uint64_t t0 = gcoll_time_ms();
    gcoll_treq_t *two[] = {&r, &s};
    drive(p, two, 2);
    assert_true(gcoll_time_ms() - t0 < 1000);
    assert_int_equal(r.status, GCOLL_ERR_PEER);
    assert_int_equal(s.status, GCOLL_ERR_PEER);
    const char *err = OPS.last_error(p->t[0]);
    assert_non_null(strstr(err, "rank 1"));
    assert_non_null(strstr(err, "died"));
    assert_null(strstr(err, "malformed"));
    p->t[1] = dead;
    pair_close(p);
    free(big);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_codec),
        cmocka_unit_test_setup_teardown(test_completion_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_keeps_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credit_overrun, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
