/* test_match.c: the receive side the transports share (transports/match.c): arrivals in
 * any order against posted receives, unexpected messages claimed by later posts, the
 * store's byte bound, length and signature mismatches, and a failed peer failing the
 * receives pending and to come; the peek of a receive from any source across peers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transports/match.h"

/* A transport stand-in: counts completions and releases, as the hooks see them. */
typedef struct {
    gcoll_match_t m;
    gcoll_match_peer_t peer;
    char errmsg[512];
    int completions, oks, releases;
} fixture_t;

static void on_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st)
{
    fixture_t *f = ctx;
    assert_false(req->done); /* never completed twice */
    req->status = st;
    req->done = 1;
    f->completions++;
    f->oks += st == GCOLL_OK;
}

static void on_release(void *ctx, gcoll_unexp_t *u)
{
    fixture_t *f = ctx;
    (void)u;
    f->releases++;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->m = (gcoll_match_t){.errmsg = f->errmsg,
                           .errlen = sizeof(f->errmsg),
                           .prefix = "",
                           .complete = on_complete,
                           .release = on_release,
                           .ctx = f};
    gcoll_match_peer_init(&f->peer, &f->m, 3);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    gcoll_match_peer_fini(&f->peer);
    free(f);
    return 0;
}

static gcoll_treq_t rreq(uint64_t tag, void *buf, size_t len)
{
    return (gcoll_treq_t){
        .peer = 3, .tag = tag, .sig = 7, .buf = buf, .len = len, .status = GCOLL_INPROGRESS};
}

/* A message of len bytes whose byte i is seed + i. */
static void fill(uint8_t *p, size_t len, int seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed + (int)i);
}

static void assert_filled(const uint8_t *p, size_t len, int seed)
{
    for (size_t i = 0; i < len; i++)
        assert_int_equal(p[i], (uint8_t)(seed + (int)i));
}

/* Posts req the way a transport's irecv does: claim an unexpected message, else queue. */
static gcoll_status_t post(fixture_t *f, gcoll_treq_t *req)
{
    gcoll_status_t st = GCOLL_OK;
    gcoll_unexp_t *u = gcoll_match_claim(&f->peer, req, &st);
    if (!u) {
        gcoll_match_post(&f->peer, req);
        return GCOLL_OK;
    }
    if (st == GCOLL_OK)
        gcoll_match_land(&f->peer, req, u->data, u->len);
    gcoll_match_unexp_free(&f->peer, u);
    return st;
}

/* Delivers a message the way a transport's arrival does: to its receive, else kept. */
static gcoll_status_t arrive(fixture_t *f, uint64_t tag, uint32_t sig, const void *data, size_t len)
{
    gcoll_status_t st;
    gcoll_treq_t *req = gcoll_match_arrived(&f->peer, tag, len, sig, &st);
    if (req)
        gcoll_match_land(&f->peer, req, data, len);
    else if (st == GCOLL_OK &&
             !gcoll_match_keep(&f->peer, tag, sig, len, len, data, GCOLL_UNEXP_WHOLE))
        return GCOLL_ERR_NOMEM;
    return st;
}

/* ---- the store's index ----------------------------------------------------------- */

/* A store of 3000 messages (past the point where it is indexed, and through several
 * rebuilds of the index): 1000 tags, three messages each with their own payload. Each tag's
 * receives, posted in a shuffled order of tags, get its messages oldest first; a tag never
 * sent finds nothing; half-way, a failure that keeps whole messages keeps them all, still
 * claimable, and the store ends empty. */
static void test_index_many(void **state)
{
    fixture_t *f = *state;
    enum { TAGS = 1000, EACH = 3 };
    uint8_t msg[16];
    for (int k = 0; k < EACH; k++)
        for (int t = 0; t < TAGS; t++) {
            fill(msg, sizeof(msg), t * EACH + k);
            assert_int_equal(arrive(f, 0x1000 + (uint64_t)t * 7919, 7, msg, sizeof(msg)), GCOLL_OK);
        }
    assert_int_equal(f->peer.nunexp, TAGS * EACH);
    assert_non_null(f->peer.index);
    assert_null(gcoll_match_find(&f->peer, 0x999999));
    int order[TAGS];
    for (int t = 0; t < TAGS; t++)
        order[t] = t;
    srand(7);
    for (int t = TAGS - 1; t > 0; t--) {
        int j = rand() % (t + 1), x = order[t];
        order[t] = order[j];
        order[j] = x;
    }
    for (int i = 0; i < TAGS; i++) {
        if (i == TAGS / 2)
            gcoll_match_fail(&f->peer, GCOLL_ERR_PEER, GCOLL_MATCH_KEEP_WHOLE);
        int t = order[i];
        for (int k = 0; k < EACH; k++) {
            uint8_t out[16] = {0};
            gcoll_treq_t r = rreq(0x1000 + (uint64_t)t * 7919, out, sizeof(out));
            assert_int_equal(post(f, &r), GCOLL_OK);
            assert_true(r.done);
            assert_int_equal(r.status, GCOLL_OK);
            assert_filled(out, sizeof(out), t * EACH + k);
        }
        assert_null(gcoll_match_find(&f->peer, 0x1000 + (uint64_t)t * 7919));
    }
    assert_int_equal(f->peer.nunexp, 0);
    assert_null(f->peer.unexp);
    assert_null(f->peer.unexp_tail);
}

/* ---- order ------------------------------------------------------------------------ */

/* Messages arrive in another order than their receives are posted, some before their
 * receive and some after: each lands in the receive of its tag, whole. */
static void test_out_of_order(void **state)
{
    fixture_t *f = *state;
    enum { N = 6 };
    uint8_t msg[N][40], out[N][40];
    gcoll_treq_t r[N];
    for (int i = 0; i < N; i++) {
        fill(msg[i], sizeof(msg[i]), 11 * i);
        memset(out[i], 0, sizeof(out[i]));
        r[i] = rreq(100 + (uint64_t)i, out[i], sizeof(out[i]));
    }
    /* receives 5, 1 and 3 first; then messages 4, 1, 0, 5; then receives 0, 2, 4; then
     * messages 3, 2 */
    static const int first_posts[] = {5, 1, 3}, arrivals[] = {4, 1, 0, 5},
                     later_posts[] = {0, 2, 4}, late_arrivals[] = {3, 2};
    for (size_t k = 0; k < 3; k++)
        assert_int_equal(post(f, &r[first_posts[k]]), GCOLL_OK);
    for (size_t k = 0; k < 4; k++)
        assert_int_equal(arrive(f, 100 + (uint64_t)arrivals[k], 7, msg[arrivals[k]], 40), GCOLL_OK);
    assert_true(r[1].done && r[5].done);
    assert_false(r[3].done);
    assert_int_equal(f->peer.unexp_bytes, 80); /* messages 4 and 0 wait */
    for (size_t k = 0; k < 3; k++)
        assert_int_equal(post(f, &r[later_posts[k]]), GCOLL_OK);
    assert_true(r[0].done && r[4].done);
    assert_false(r[2].done);
    assert_int_equal(f->peer.unexp_bytes, 0);
    for (size_t k = 0; k < 2; k++)
        assert_int_equal(arrive(f, 100 + (uint64_t)late_arrivals[k], 7, msg[late_arrivals[k]], 40),
                         GCOLL_OK);
    for (int i = 0; i < N; i++) {
        assert_true(r[i].done);
        assert_int_equal(r[i].status, GCOLL_OK);
        assert_int_equal(r[i].nbytes, 40);
        assert_filled(out[i], 40, 11 * i);
    }
    assert_int_equal(f->oks, N);
    assert_null(f->peer.unexp);
    assert_null(f->peer.posted);
    assert_string_equal(f->errmsg, "");
}

/* An unexpected message waits until a receive claims it; an empty one and one for a
 * receive of any length too; two of one tag go oldest first. */
static void test_claim_by_later_post(void **state)
{
    fixture_t *f = *state;
    uint8_t a[16], b[16], out[32] = {0};
    fill(a, sizeof(a), 1);
    fill(b, sizeof(b), 50);
    assert_int_equal(arrive(f, 9, 7, a, sizeof(a)), GCOLL_OK);
    assert_int_equal(arrive(f, 9, 7, b, sizeof(b)), GCOLL_OK);
    assert_int_equal(arrive(f, 10, 7, NULL, 0), GCOLL_OK);
    gcoll_unexp_t *u = gcoll_match_find(&f->peer, 9);
    assert_non_null(u);
    assert_true(u->whole);
    assert_int_equal(u->len, 16);
    assert_null(gcoll_match_find(&f->peer, 11));
    assert_int_equal(f->completions, 0);

    gcoll_treq_t r = rreq(9, out, sizeof(out));
    r.flags = GCOLL_TREQ_ANYLEN; /* at most 32 bytes */
    assert_int_equal(post(f, &r), GCOLL_OK);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, 16);
    assert_filled(out, 16, 1); /* the older of the two */
    gcoll_treq_t r2 = rreq(9, out, 16);
    assert_int_equal(post(f, &r2), GCOLL_OK);
    assert_int_equal(r2.status, GCOLL_OK);
    assert_filled(out, 16, 50);
    gcoll_treq_t e = rreq(10, NULL, 0);
    assert_int_equal(post(f, &e), GCOLL_OK);
    assert_true(e.done);
    assert_int_equal(e.status, GCOLL_OK);
    assert_int_equal(e.nbytes, 0);
    assert_null(f->peer.unexp);
    assert_null(f->peer.unexp_tail);
    assert_int_equal(f->peer.unexp_bytes, 0);
    assert_int_equal(f->releases, 3);
}

/* A receive withdrawn before its message came is aborted; the message that comes later
 * waits for another receive. One never posted cannot be withdrawn. */
static void test_cancel(void **state)
{
    fixture_t *f = *state;
    uint8_t out[8], msg[8];
    fill(msg, sizeof(msg), 3);
    gcoll_treq_t r = rreq(4, out, sizeof(out)), other = rreq(5, out, sizeof(out));
    gcoll_match_post(&f->peer, &r);
    assert_int_equal(gcoll_match_cancel(&f->peer, &r), 1);
    assert_int_equal(r.status, GCOLL_ERR_ABORTED);
    assert_int_equal(gcoll_match_cancel(&f->peer, &other), 0);
    assert_false(other.done);
    assert_int_equal(arrive(f, 4, 7, msg, sizeof(msg)), GCOLL_OK);
    assert_non_null(gcoll_match_find(&f->peer, 4));
}

/* nwant counts the posted receives that are not GCOLL_TREQ_STANDING, through matching,
 * withdrawal and failure; posted_tag sees standing ones too. */
static void test_nwant(void **state)
{
    fixture_t *f = *state;
    uint8_t out[3][8], msg[8];
    fill(msg, sizeof(msg), 1);
    gcoll_treq_t st = rreq(9, out[0], 8), a = rreq(4, out[1], 8), b = rreq(5, out[2], 8);
    st.flags = GCOLL_TREQ_STANDING;
    gcoll_match_post(&f->peer, &st);
    assert_int_equal(f->peer.nwant, 0);
    assert_true(gcoll_match_posted_tag(&f->peer, 9));
    assert_false(gcoll_match_posted_tag(&f->peer, 4));
    gcoll_match_post(&f->peer, &a);
    gcoll_match_post(&f->peer, &b);
    assert_int_equal(f->peer.nwant, 2);
    assert_int_equal(arrive(f, 4, 7, msg, sizeof(msg)), GCOLL_OK);
    assert_int_equal(f->peer.nwant, 1);
    assert_int_equal(arrive(f, 9, 7, msg, sizeof(msg)), GCOLL_OK); /* the standing one */
    assert_int_equal(f->peer.nwant, 1);
    assert_int_equal(gcoll_match_cancel(&f->peer, &b), 1);
    assert_int_equal(f->peer.nwant, 0);
    b = rreq(5, out[2], 8);
    st = rreq(9, out[0], 8);
    st.flags = GCOLL_TREQ_STANDING;
    gcoll_match_post(&f->peer, &b);
    gcoll_match_post(&f->peer, &st);
    assert_int_equal(f->peer.nwant, 1);
    gcoll_match_fail_posted(&f->peer, GCOLL_ERR_PEER);
    assert_int_equal(f->peer.nwant, 0);
    assert_null(f->peer.posted);
}

/* ---- the bound ---------------------------------------------------------------------- */

/* The unexpected messages of all peers hold at most unexp_max bytes (GCOLL_UNEXPECTED_BYTES):
 * the one beyond it is refused with a message naming the peer and the setting, and room
 * comes back as messages are claimed. */
static void test_byte_bound(void **state)
{
    fixture_t *f = *state;
    f->m.unexp_max = 100;
    f->m.prefix = "verbs: ";
    uint8_t msg[100], out[100];
    fill(msg, sizeof(msg), 9);
    assert_int_equal(arrive(f, 1, 7, msg, 60), GCOLL_OK);
    assert_int_equal(arrive(f, 2, 7, msg, 40), GCOLL_OK); /* exactly full */
    assert_int_equal(f->peer.unexp_bytes, 100);
    assert_int_equal(arrive(f, 3, 7, msg, 1), GCOLL_ERR_NOMEM);
    assert_string_equal(
        f->errmsg,
        "verbs: rank 3 sent a message of 1 bytes that no receive awaits while 100 bytes of such "
        "messages are held: GCOLL_UNEXPECTED_BYTES=100 would be passed (the ranks are in "
        "different calls, or rank 3 runs ahead by more than the bound)");
    /* a rendezvous offer holds no payload: it still fits */
    gcoll_unexp_t *offer = gcoll_match_keep(&f->peer, 4, 7, 1 << 20, 0, NULL, 0);
    assert_non_null(offer);
    assert_false(offer->whole);
    gcoll_treq_t r = rreq(1, out, 60);
    assert_int_equal(post(f, &r), GCOLL_OK);
    assert_int_equal(r.status, GCOLL_OK);
    assert_filled(out, 60, 9);
    assert_int_equal(f->peer.unexp_bytes, 40);
    assert_int_equal(arrive(f, 3, 7, msg, 60), GCOLL_OK);
    assert_int_equal(f->peer.unexp_bytes, 100);
    /* the first failure stays the one reported */
    assert_int_equal(arrive(f, 5, 7, msg, 2), GCOLL_ERR_NOMEM);
    assert_string_equal(
        f->errmsg,
        "verbs: rank 3 sent a message of 1 bytes that no receive awaits while 100 bytes of such "
        "messages are held: GCOLL_UNEXPECTED_BYTES=100 would be passed (the ranks are in "
        "different calls, or rank 3 runs ahead by more than the bound)");
    /* no bound: only memory limits */
    f->m.unexp_max = 0;
    assert_int_equal(arrive(f, 5, 7, msg, 100), GCOLL_OK);
    assert_int_equal(f->peer.unexp_bytes, 200);
    assert_int_equal(f->m.unexp_held, 200);
    /* the bound is the communicator's: a second peer shares it */
    gcoll_match_peer_t other;
    gcoll_match_peer_init(&other, &f->m, 5);
    f->m.unexp_max = 250;
    f->errmsg[0] = '\0';
    assert_non_null(gcoll_match_keep(&other, 1, 7, 50, 50, msg, GCOLL_UNEXP_WHOLE));
    assert_null(gcoll_match_keep(&other, 2, 7, 1, 1, msg, GCOLL_UNEXP_WHOLE));
    assert_non_null(strstr(f->errmsg, "rank 5 sent a message of 1 bytes"));
    /* a whole message the transport keeps (storage 0, as UCX's descriptors) counts too */
    f->m.unexp_max = 260;
    assert_null(gcoll_match_keep(&other, 3, 7, 20, 0, NULL, GCOLL_UNEXP_WHOLE));
    gcoll_match_peer_fini(&other);
    assert_int_equal(f->m.unexp_held, 200);
}

/* ---- mismatches --------------------------------------------------------------------- */

/* A message meets a posted receive of another length or signature: the receive fails with
 * GCOLL_ERR_MISMATCH and the reason, and the message is dropped (not kept). */
static void test_mismatch_on_arrival(void **state)
{
    fixture_t *f = *state;
    uint8_t out[10], msg[12] = {0};
    gcoll_treq_t r = rreq(1, out, sizeof(out));
    gcoll_match_post(&f->peer, &r);
    assert_int_equal(arrive(f, 1, 7, msg, 12), GCOLL_ERR_MISMATCH);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    assert_string_equal(f->errmsg, "rank 3 sent 12 bytes where 10 were expected (counts differ)");
    assert_null(f->peer.unexp);
    assert_null(f->peer.posted);

    f->errmsg[0] = '\0';
    gcoll_treq_t s = rreq(2, out, sizeof(out));
    gcoll_match_post(&f->peer, &s);
    assert_int_equal(arrive(f, 2, 0x99, msg, 10), GCOLL_ERR_MISMATCH);
    assert_int_equal(s.status, GCOLL_ERR_MISMATCH);
    assert_string_equal(f->errmsg, "rank 3 is in a different call: another collective, or "
                                   "another count, dtype, op or root, in this call or in an "
                                   "earlier reduce, gather or scatter (signature 00000099, here "
                                   "00000007)");

    f->errmsg[0] = '\0';
    gcoll_treq_t a = rreq(3, out, sizeof(out));
    a.flags = GCOLL_TREQ_ANYLEN;
    gcoll_match_post(&f->peer, &a);
    assert_int_equal(arrive(f, 3, 7, msg, 11), GCOLL_ERR_MISMATCH);
    assert_string_equal(f->errmsg,
                        "rank 3 sent 11 bytes where at most 10 were expected (counts differ)");
    assert_int_equal(f->oks, 0);
}

/* An unexpected message meets a later receive of another length or signature: the
 * receive fails with the mismatch, the entry is handed back (the transport answers the
 * sender), and the store no longer has it. */
static void test_mismatch_on_claim(void **state)
{
    fixture_t *f = *state;
    uint8_t out[10], msg[12] = {0};
    assert_int_equal(arrive(f, 1, 7, msg, 12), GCOLL_OK);
    gcoll_treq_t r = rreq(1, out, sizeof(out));
    gcoll_status_t st = GCOLL_OK;
    gcoll_unexp_t *u = gcoll_match_claim(&f->peer, &r, &st);
    assert_non_null(u);
    assert_int_equal(st, GCOLL_ERR_MISMATCH);
    assert_true(r.done);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    assert_string_equal(f->errmsg, "rank 3 sent 12 bytes where 10 were expected (counts differ)");
    assert_null(gcoll_match_find(&f->peer, 1));
    gcoll_match_unexp_free(&f->peer, u);
    assert_int_equal(f->peer.unexp_bytes, 0);

    assert_int_equal(arrive(f, 2, 0x42, msg, 10), GCOLL_OK);
    gcoll_treq_t s = rreq(2, out, sizeof(out));
    assert_int_equal(post(f, &s), GCOLL_ERR_MISMATCH);
    assert_int_equal(s.status, GCOLL_ERR_MISMATCH);
    assert_null(f->peer.posted); /* not queued either */
    /* the tag is free again: a message of the right shape is received */
    assert_int_equal(arrive(f, 2, 7, msg, 10), GCOLL_OK);
    gcoll_treq_t again = rreq(2, out, sizeof(out));
    assert_int_equal(post(f, &again), GCOLL_OK);
    assert_int_equal(again.status, GCOLL_OK);
}

/* ---- failure ------------------------------------------------------------------------ */

/* A failed peer: its pending receives complete with its status at once, later ones at
 * their post; the messages it sent whole are still received (KEEP_WHOLE) while offers
 * whose data stayed with it are released. The first failure's status sticks. */
static void test_peer_fail_keep_whole(void **state)
{
    fixture_t *f = *state;
    uint8_t out[3][8], msg[8];
    fill(msg, sizeof(msg), 70);
    gcoll_treq_t p1 = rreq(1, out[0], 8), p2 = rreq(2, out[1], 8);
    gcoll_match_post(&f->peer, &p1);
    gcoll_match_post(&f->peer, &p2);
    assert_int_equal(arrive(f, 5, 7, msg, 8), GCOLL_OK);
    gcoll_unexp_t *offer = gcoll_match_keep(&f->peer, 6, 7, 4096, 0, NULL, 0);
    assert_non_null(offer);
    gcoll_unexp_t *partial = gcoll_match_keep(&f->peer, 7, 7, 8, 8, NULL, 0);
    assert_non_null(partial);
    f->releases = 0;

    gcoll_match_fail(&f->peer, GCOLL_ERR_PEER, GCOLL_MATCH_KEEP_WHOLE);
    assert_true(f->peer.failed);
    assert_int_equal(p1.status, GCOLL_ERR_PEER);
    assert_int_equal(p2.status, GCOLL_ERR_PEER);
    assert_null(f->peer.posted);
    assert_int_equal(f->releases, 2); /* the offer and the partial message */
    assert_null(gcoll_match_find(&f->peer, 6));
    assert_null(gcoll_match_find(&f->peer, 7));
    assert_int_equal(f->peer.unexp_bytes, 8);

    gcoll_match_fail(&f->peer, GCOLL_ERR_NOMEM, GCOLL_MATCH_DROP_ALL); /* already failed */
    assert_int_equal(f->peer.status, GCOLL_ERR_PEER);
    assert_non_null(gcoll_match_find(&f->peer, 5));

    gcoll_treq_t got = rreq(5, out[2], 8); /* sent whole before the failure */
    assert_int_equal(post(f, &got), GCOLL_OK);
    assert_int_equal(got.status, GCOLL_OK);
    assert_filled(out[2], 8, 70);
    gcoll_treq_t later = rreq(6, out[2], 8), again = rreq(8, out[2], 8);
    assert_int_equal(post(f, &later), GCOLL_OK);
    assert_true(later.done);
    assert_int_equal(later.status, GCOLL_ERR_PEER);
    assert_int_equal(post(f, &again), GCOLL_OK);
    assert_int_equal(again.status, GCOLL_ERR_PEER);
    assert_null(f->peer.posted);
}

/* With DROP_ALL nothing the peer sent survives it: a later receive of a message that
 * had arrived whole fails with the status too. */
static void test_peer_fail_drop_all(void **state)
{
    fixture_t *f = *state;
    uint8_t out[8], msg[8] = {0};
    gcoll_treq_t p = rreq(1, out, 8);
    gcoll_match_post(&f->peer, &p);
    assert_int_equal(arrive(f, 5, 7, msg, 8), GCOLL_OK);
    gcoll_match_fail(&f->peer, GCOLL_ERR_TRANSPORT, GCOLL_MATCH_DROP_ALL);
    assert_int_equal(p.status, GCOLL_ERR_TRANSPORT);
    assert_null(f->peer.unexp);
    assert_null(f->peer.unexp_tail);
    assert_int_equal(f->peer.unexp_bytes, 0);
    gcoll_treq_t later = rreq(5, out, 8);
    assert_int_equal(post(f, &later), GCOLL_OK);
    assert_int_equal(later.status, GCOLL_ERR_TRANSPORT);
    /* keep after the tail was dropped: the list is whole again */
    assert_int_equal(arrive(f, 9, 7, msg, 8), GCOLL_OK);
    assert_true(f->peer.unexp == f->peer.unexp_tail);
}

/* Failing the posted receives (a peer's abort) leaves the peer usable: later receives
 * queue as before. Tearing down forgets posted receives without completing them. */
static void test_fail_posted_and_fini(void **state)
{
    fixture_t *f = *state;
    uint8_t out[8], msg[8];
    fill(msg, sizeof(msg), 5);
    gcoll_treq_t a = rreq(1, out, 8), b = rreq(2, out, 8);
    gcoll_match_post(&f->peer, &a);
    gcoll_match_post(&f->peer, &b);
    gcoll_match_fail_posted(&f->peer, GCOLL_ERR_MISMATCH);
    assert_int_equal(a.status, GCOLL_ERR_MISMATCH);
    assert_int_equal(b.status, GCOLL_ERR_MISMATCH);
    assert_false(f->peer.failed);
    gcoll_treq_t c = rreq(3, out, 8);
    gcoll_match_post(&f->peer, &c);
    assert_false(c.done);
    assert_int_equal(arrive(f, 4, 7, msg, 8), GCOLL_OK);
    int before = f->completions;
    f->releases = 0;
    gcoll_match_peer_fini(&f->peer);
    assert_int_equal(f->completions, before);
    assert_false(c.done);
    assert_int_equal(f->releases, 1);
    assert_null(f->peer.posted);
    assert_null(f->peer.unexp);
}

/* ---- receive from any source ------------------------------------------------------ */

#define P2P(n) ((1ull << 63) | (uint64_t)(n))

/* The peek over three peers with these tags. */
static gcoll_status_t peek3(gcoll_match_peer_t *mp, uint64_t t0, uint64_t t1, uint64_t t2,
                            int *peer)
{
    gcoll_match_peek_t pk;
    gcoll_match_peek_init(&pk);
    gcoll_match_peek_add(&pk, &mp[0], t0, GCOLL_OK);
    gcoll_match_peek_add(&pk, &mp[1], t1, GCOLL_OK);
    gcoll_match_peek_add(&pk, &mp[2], t2, GCOLL_OK);
    return gcoll_match_peek_result(&pk, peer);
}

/* Three peers of one instance: the peek takes, of each peer's next message (its tag), the
 * first kept, whatever came from others or with other tags; a peer left out (tag 0) is not
 * looked at; a failed peer's whole messages still count, and once none is left its
 * failure is the answer; a transport's own "down" only when no message came. */
static void test_peek_first_come(void **state)
{
    fixture_t *f = *state;
    gcoll_match_peer_t mp[3];
    for (int i = 0; i < 3; i++)
        gcoll_match_peer_init(&mp[i], &f->m, i);
    uint8_t msg[8], out[8];
    fill(msg, 8, 40);
    gcoll_match_peek_t pk;
    int peer = 99;
    assert_int_equal(peek3(mp, P2P(0), P2P(0), P2P(0), &peer), GCOLL_OK);
    assert_int_equal(peer, -1);
    assert_non_null(gcoll_match_keep(&mp[2], P2P(0), 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    assert_non_null(gcoll_match_keep(&mp[0], P2P(1), 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    assert_non_null(gcoll_match_keep(&mp[1], P2P(0), 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    assert_non_null(gcoll_match_keep(&mp[0], (5ull << 32) | 1, 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    /* rank 0's P2P(1) came second but is not its next; rank 2's came first */
    assert_int_equal(peek3(mp, P2P(0), P2P(0), P2P(0), &peer), GCOLL_OK);
    assert_int_equal(peer, 2);
    assert_int_equal(peek3(mp, P2P(1), P2P(0), P2P(0), &peer), GCOLL_OK);
    assert_int_equal(peer, 2);
    assert_int_equal(peek3(mp, P2P(1), P2P(0), 0, &peer), GCOLL_OK);
    assert_int_equal(peer, 0);
    /* a receive takes rank 2's: rank 1's is next, then rank 0's once it has P2P(0) */
    gcoll_treq_t r = rreq(P2P(0), out, 8);
    r.peer = 2;
    gcoll_status_t st;
    gcoll_unexp_t *u = gcoll_match_claim(&mp[2], &r, &st);
    assert_non_null(u);
    assert_int_equal(st, GCOLL_OK);
    gcoll_match_land(&mp[2], &r, u->data, u->len);
    gcoll_match_unexp_free(&mp[2], u);
    assert_int_equal(peek3(mp, P2P(0), P2P(0), P2P(1), &peer), GCOLL_OK);
    assert_int_equal(peer, 1);
    assert_int_equal(peek3(mp, P2P(0), 0, P2P(1), &peer), GCOLL_OK);
    assert_int_equal(peer, -1);
    assert_non_null(gcoll_match_keep(&mp[0], P2P(0), 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    assert_int_equal(peek3(mp, P2P(0), P2P(0), P2P(1), &peer), GCOLL_OK);
    assert_int_equal(peer, 1);
    assert_int_equal(peek3(mp, P2P(0), 0, P2P(1), &peer), GCOLL_OK);
    assert_int_equal(peer, 0);
    /* rank 2 sends P2P(1) whole, then fails: its message still counts */
    assert_non_null(gcoll_match_keep(&mp[2], P2P(1), 7, 8, 8, msg, GCOLL_UNEXP_WHOLE));
    gcoll_match_fail(&mp[2], GCOLL_ERR_PEER, GCOLL_MATCH_KEEP_WHOLE);
    assert_int_equal(peek3(mp, 0, 0, P2P(1), &peer), GCOLL_OK);
    assert_int_equal(peer, 2);
    /* ... and once none is left, its failure, even with messages of other tags here */
    assert_int_equal(peek3(mp, P2P(2), P2P(1), P2P(2), &peer), GCOLL_ERR_PEER);
    assert_int_equal(peer, 2);
    /* a message from another peer comes first over a failure */
    assert_int_equal(peek3(mp, P2P(2), P2P(0), P2P(2), &peer), GCOLL_OK);
    assert_int_equal(peer, 1);
    /* the transport's own down status (a peer that closed) */
    gcoll_match_peer_t up;
    gcoll_match_peer_init(&up, &f->m, 4);
    gcoll_match_peek_init(&pk);
    gcoll_match_peek_add(&pk, &up, P2P(0), GCOLL_ERR_TRANSPORT);
    assert_int_equal(gcoll_match_peek_result(&pk, &peer), GCOLL_ERR_TRANSPORT);
    assert_int_equal(peer, 4);
    gcoll_match_peek_add(&pk, &mp[1], P2P(0), GCOLL_OK);
    assert_int_equal(gcoll_match_peek_result(&pk, &peer), GCOLL_OK);
    assert_int_equal(peer, 1);
    for (int i = 0; i < 3; i++)
        gcoll_match_peer_fini(&mp[i]);
    gcoll_match_peer_fini(&up);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_index_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_by_later_post, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nwant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_byte_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_on_arrival, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_on_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_fail_keep_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_fail_drop_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_posted_and_fini, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peek_first_come, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
