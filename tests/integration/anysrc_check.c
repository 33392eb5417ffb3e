/* anysrc_check: receives from any source (gcoll_recv_any, gcoll_irecv_any) across processes,
 * through the public API only.
 *   anysrc_check all       any number of ranks (>= 2): every rank in turn receives from
 *                          all others with receives from any source only (small messages,
 *                          blocking and not, then large ones past the eager sizes); each
 *                          message must come exactly once, from the rank the call names,
 *                          and a rank's messages in the order it sent them. With 3 ranks
 *                          or more, rounds that mix them with receives that name the
 *                          sender (a named receive issued first gets that rank's first
 *                          message; one issued after an any-source receive gets the next
 *                          message that receive left). A message to oneself; collectives
 *                          between the phases.
 *   anysrc_check errors    any number of ranks: refused inside a group, bad arguments; the
 *                          communicator works after them
 *   anysrc_check mismatch  3 ranks: rank 1 sends 6 floats, rank 0 receives 4 from any
 *                          source: GCOLL_ERR_MISMATCH naming rank 1, nothing written past
 *   anysrc_check dead      3 ranks: rank 1 dies; rank 0's receive from any source fails
 *                          with GCOLL_ERR_PEER well within GCOLL_TIMEOUT_MS (30 s)
 *   anysrc_check timeout   3 ranks, GCOLL_TIMEOUT_MS=2s: nobody sends (the others sleep
 *                          5 s); rank 0's receive fails with GCOLL_ERR_TIMEOUT after 2 s
 * Every payload starts with its sender and its index among the messages that sender sent
 * the receiver, then bytes of a pattern of both, computed again on the receiving side and
 * compared whole (bytes are moved: bit equality holds). Exit status 0 when all passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcoll.h"

#define CHECK_PROG "anysrc_check"
#include "p2p_common.h"

static int rank, size, failures;

/* A message of n int32: [sender, index, pattern...]. */
static void fill(int32_t *b, size_t n, int src, int idx)
{
    b[0] = src;
    b[1] = idx;
    for (size_t i = 2; i < n; i++)
        b[i] = (int32_t)((uint32_t)src * 2654435761u ^ (uint32_t)idx * 40503u ^ (uint32_t)i);
}

/* Checks a received message against its claimed sender src: the sender it carries, and the
 * index it should have (next[src], the count of src's messages received so far), then
 * counts it. */
static void check_msg(const int32_t *b, size_t n, int src, int *next, const char *how)
{
    if (src < 0 || src >= size) {
        CHECK(0, "%s: source %d out of range", how, src);
        return;
    }
    CHECK(b[0] == src, "%s: the call says rank %d sent it, the message says %d", how, src, b[0]);
    CHECK(b[1] == next[src], "%s: rank %d's message %d came where its message %d was due", how, src,
          b[1], next[src]);
    int32_t *want = malloc(n * sizeof(*want));
    fill(want, n, src, next[src]);
    size_t i = 2;
    while (i < n && b[i] == want[i])
        i++;
    CHECK(i == n, "%s: from rank %d, element %zu of %zu wrong", how, src, i, n);
    free(want);
    next[src]++;
}

static void fence(gcoll_comm_t *c)
{
    int32_t v = 1;
    CHECK(gcoll_allreduce(c, &v, &v, 1, GCOLL_INT32, GCOLL_SUM) == GCOLL_OK && v == size,
          "allreduce between phases");
}

/* Every rank in turn is the receiver; every other sends it k messages of n int32, and it
 * takes them all with receives from any source (blocking and nonblocking by turns). */
static void all_to_one(gcoll_comm_t *c, size_t n, int k)
{
    int32_t *b = malloc(n * sizeof(*b));
    int *next = calloc((size_t)size, sizeof(*next));
    for (int recv = 0; recv < size; recv++) {
        if (rank != recv) {
            for (int m = 0; m < k; m++) {
                fill(b, n, rank, m);
                CHECK(gcoll_send(c, b, n, GCOLL_INT32, recv) == GCOLL_OK, "send %d to %d", m, recv);
            }
        } else {
            memset(next, 0, (size_t)size * sizeof(*next));
            for (int m = 0; m < k * (size - 1); m++) {
                int src = 12345;
                memset(b, 0xee, n * sizeof(*b));
                gcoll_status_t st;
                if (m & 1) {
                    gcoll_request_t *rq = NULL;
                    st = gcoll_irecv_any(c, b, n, GCOLL_INT32, &src, &rq);
                    if (st == GCOLL_OK)
                        st = gcoll_wait(rq);
                } else {
                    st = gcoll_recv_any(c, b, n, GCOLL_INT32, &src);
                }
                CHECK(st == GCOLL_OK, "receive %d from any source: %s", m, gcoll_status_string(st));
                if (st != GCOLL_OK)
                    break;
                CHECK(src != rank, "receive %d: from itself, which sent nothing", m);
                check_msg(b, n, src, next, m & 1 ? "gcoll_irecv_any" : "gcoll_recv_any");
            }
            for (int s = 0; s < size; s++)
                CHECK(next[s] == (s == rank ? 0 : k), "%d messages of %zu from rank %d, sent %d",
                      next[s], n, s, s == rank ? 0 : k);
        }
        fence(c);
    }
    free(next);
    free(b);
}

/* Rank 0 receives; rank 1 and the last rank send. Part a: rank 1 sends two, and a receive
 * from rank 1 issued before one from any source must get the first. Part b (after an
 * allreduce): rank 1 sends two and the last rank one; any, from 1, any: whichever the
 * first any takes, the named receive gets rank 1's next and the second any the rest.
 * Repeated, so that both orders of arrival happen. */
static void mixed(gcoll_comm_t *c, int rounds)
{
    enum { N = 5 };
    int32_t b[4][N];
    int last = size - 1;
    int *next = calloc((size_t)size, sizeof(*next));
    int first_last = 0; /* rounds whose first any-source receive took the last rank's */
    for (int round = 0; round < rounds; round++) {
        int blocking = round & 1;
        if (rank == 1 || rank == last) {
            for (int part = 0; part < 2; part++) {
                int k = rank == 1 ? 2 : part;
                for (int m = 0; m < k; m++) {
                    fill(b[0], N, rank, next[rank]++);
                    CHECK(gcoll_send(c, b[0], N, GCOLL_INT32, 0) == GCOLL_OK, "send");
                }
                if (part == 0)
                    fence(c);
            }
        } else if (rank != 0) {
            fence(c);
        } else {
            gcoll_request_t *rq[4] = {NULL};
            int src[4] = {-5, -5, -5, -5};
            memset(b, 0xee, sizeof(b));
            /* a: named, then any (only rank 1's two messages of this part are sent) */
            CHECK(gcoll_irecv(c, b[0], N, GCOLL_INT32, 1, &rq[0]) == GCOLL_OK, "irecv from 1");
            if (blocking)
                CHECK(gcoll_recv_any(c, b[1], N, GCOLL_INT32, &src[1]) == GCOLL_OK, "recv_any");
            else
                CHECK(gcoll_irecv_any(c, b[1], N, GCOLL_INT32, &src[1], &rq[1]) == GCOLL_OK,
                      "irecv_any");
            for (int i = 0; i < 2; i++)
                if (rq[i])
                    CHECK(gcoll_wait(rq[i]) == GCOLL_OK, "wait a%d", i);
            check_msg(b[0], N, 1, next, "named receive issued first");
            CHECK(src[1] == 1, "round %d: the any-source receive after the named one got rank %d",
                  round, src[1]);
            check_msg(b[1], N, src[1] >= 0 ? src[1] : 0, next, "any-source after a named one");
            fence(c);
            /* b: any, from 1, any */
            rq[0] = rq[1] = NULL;
            CHECK(gcoll_irecv_any(c, b[0], N, GCOLL_INT32, &src[0], &rq[0]) == GCOLL_OK,
                  "irecv_any");
            if (blocking)
                CHECK(gcoll_recv(c, b[1], N, GCOLL_INT32, 1) == GCOLL_OK, "recv from 1");
            else
                CHECK(gcoll_irecv(c, b[1], N, GCOLL_INT32, 1, &rq[1]) == GCOLL_OK, "irecv");
            CHECK(gcoll_irecv_any(c, b[2], N, GCOLL_INT32, &src[2], &rq[2]) == GCOLL_OK,
                  "irecv_any");
            for (int i = 0; i < 3; i++)
                if (rq[i])
                    CHECK(gcoll_wait(rq[i]) == GCOLL_OK, "wait b%d", i);
            /* in issue order: each receive got its sender's next message */
            check_msg(b[0], N, src[0], next, "first any-source");
            check_msg(b[1], N, 1, next, "named receive between two any-source ones");
            check_msg(b[2], N, src[2], next, "second any-source");
            first_last += src[0] == last;
            CHECK((src[0] == last) + (src[2] == last) == 1,
                  "round %d: the last rank's one message went to %d receives", round,
                  (src[0] == last) + (src[2] == last));
        }
        fence(c);
    }
    if (rank == 0)
        printf("mixed: the first any-source receive took rank %d's message in %d of %d rounds, "
               "rank 1's in the others\n",
               last, first_last, rounds);
    if (rank == 0)
        CHECK(next[1] == 4 * rounds && next[last] == rounds, "counts %d and %d after %d rounds",
              next[1], next[last], rounds);
    free(next);
}

/* A message to oneself, the only one on its way: taken from oneself. */
static void self_any(gcoll_comm_t *c)
{
    int32_t s[9], r[9];
    int src = -7;
    fill(s, 9, rank, 0);
    memset(r, 0, sizeof(r));
    CHECK(gcoll_send(c, s, 9, GCOLL_INT32, rank) == GCOLL_OK, "send to self");
    CHECK(gcoll_recv_any(c, r, 9, GCOLL_INT32, &src) == GCOLL_OK, "recv_any of one's own");
    CHECK(src == rank, "the message to oneself came from %d", src);
    CHECK(memcmp(s, r, sizeof(s)) == 0, "the message to oneself changed");
    fence(c);
}

static void run_errors(gcoll_comm_t *c)
{
    float x = 1;
    int src = 5;
    gcoll_request_t *rq = NULL;
    CHECK(gcoll_group_start(c) == GCOLL_OK, "group_start");
    CHECK(gcoll_recv_any(c, &x, 1, GCOLL_FLOAT32, &src) == GCOLL_ERR_INVALID,
          "recv_any in a group");
    CHECK(strstr(gcoll_comm_last_error(c), "group") != NULL, "the error says why: %s",
          gcoll_comm_last_error(c));
    CHECK(src == -1, "source after a refused call: %d", src);
    CHECK(gcoll_irecv_any(c, &x, 1, GCOLL_FLOAT32, &src, &rq) == GCOLL_ERR_INVALID,
          "irecv_any in a group");
    CHECK(gcoll_group_end(c) == GCOLL_OK, "group_end of an empty group");
    CHECK(gcoll_recv_any(c, NULL, 3, GCOLL_FLOAT32, &src) == GCOLL_ERR_INVALID, "NULL buffer");
    CHECK(gcoll_irecv_any(c, &x, 1, GCOLL_FLOAT32, &src, NULL) == GCOLL_ERR_INVALID,
          "NULL request");
    CHECK(gcoll_recv_any(c, &x, 1, (gcoll_dtype_t)99, NULL) == GCOLL_ERR_INVALID, "bad dtype");
    CHECK(gcoll_recv_any(NULL, &x, 1, GCOLL_FLOAT32, NULL) == GCOLL_ERR_INVALID, "NULL comm");
    /* -1 stays a peer out of range for the named receive */
    CHECK(gcoll_recv(c, &x, 1, GCOLL_FLOAT32, -1) == GCOLL_ERR_INVALID, "recv from -1");
    /* count 0 from any source, and source NULL */
    if (size > 1) {
        if (rank == 1)
            CHECK(gcoll_send(c, NULL, 0, GCOLL_UINT8, 0) == GCOLL_OK, "empty send");
        if (rank == 0)
            CHECK(gcoll_recv_any(c, NULL, 0, GCOLL_UINT8, NULL) == GCOLL_OK, "empty recv_any");
    }
    int32_t v = 1;
    CHECK(gcoll_allreduce(c, &v, &v, 1, GCOLL_INT32, GCOLL_SUM) == GCOLL_OK && v == size,
          "allreduce after refused calls");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    gcoll_comm_t *c = NULL;
    if (gcoll_comm_init(&c) != GCOLL_OK) {
        fprintf(stderr, "anysrc_check: init failed: %s\n", gcoll_last_error());
        return 2;
    }
    rank = gcoll_comm_rank(c);
    size = gcoll_comm_size(c);
    int clean = 1;
    if (strcmp(mode, "all") == 0 && size >= 2) {
        all_to_one(c, 37, 6);
        all_to_one(c, 300001, 2); /* 1.2 MB: past every transport's eager size */
        self_any(c);
        if (size >= 3)
            mixed(c, 12);
        all_to_one(c, 3, 1); /* again after the mixed rounds: the counts went on */
    } else if (strcmp(mode, "errors") == 0) {
        run_errors(c);
    } else if (strcmp(mode, "mismatch") == 0 && size == 3) {
        clean = 0;
        float b[8];
        for (int i = 0; i < 8; i++)
            b[i] = (float)i;
        if (rank == 1) {
            gcoll_status_t st = gcoll_send(c, b, 6, GCOLL_FLOAT32, 0);
            CHECK(st == GCOLL_OK || st == GCOLL_ERR_MISMATCH || st == GCOLL_ERR_PEER, "send: %s",
                  gcoll_status_string(st));
        } else if (rank == 0) {
            float r[8];
            int src = 9;
            for (int i = 0; i < 8; i++)
                r[i] = -1;
            gcoll_status_t st = gcoll_recv_any(c, r, 4, GCOLL_FLOAT32, &src);
            CHECK(st == GCOLL_ERR_MISMATCH, "recv_any of 4 from a send of 6: %s",
                  gcoll_status_string(st));
            CHECK(src == 1, "the mismatch's source: %d", src);
            CHECK(r[4] == -1 && r[5] == -1, "written past the receive's 4 floats");
            CHECK(strstr(gcoll_comm_last_error(c), "count or dtype") != NULL,
                  "the error says why: %s", gcoll_comm_last_error(c));
            printf("mismatch reported: %s\n", gcoll_comm_last_error(c));
            gcoll_comm_abort(c);
        } else {
            float r[4];
            /* waits for rank 0, which aborts instead of sending */
            gcoll_status_t st = gcoll_recv(c, r, 4, GCOLL_FLOAT32, 0);
            CHECK(st != GCOLL_OK, "recv from rank 0, which never sends, succeeded");
        }
    } else if ((strcmp(mode, "dead") == 0 || strcmp(mode, "timeout") == 0) && size == 3) {
        clean = 0;
        int dead = strcmp(mode, "dead") == 0;
        fence(c);
        if (dead && rank == 1)
            _exit(0); /* dies without sending or saying goodbye */
        if (rank == 0) {
            float r[4];
            int src = 9;
            double t0 = now_s();
            gcoll_status_t st = gcoll_recv_any(c, r, 4, GCOLL_FLOAT32, &src);
            double dt = now_s() - t0;
            gcoll_status_t want = dead ? GCOLL_ERR_PEER : GCOLL_ERR_TIMEOUT;
            CHECK(st == want, "recv_any: %s, want %s", gcoll_status_string(st),
                  gcoll_status_string(want));
            CHECK(src == -1, "source after no message: %d", src);
            /* dead: GCOLL_TIMEOUT_MS=30s, the death is seen, not waited out; timeout: 2 s */
            CHECK(dead ? dt < 15.0 : dt > 1.5 && dt < 12.0, "%s after %.1f s", mode, dt);
            printf("recv_any %s: %s after %.2f s (%s)\n", mode, gcoll_status_string(st), dt,
                   gcoll_comm_last_error(c));
            gcoll_comm_abort(c);
        } else if (dead) {
            float r[4];
            gcoll_status_t st = gcoll_recv(c, r, 4, GCOLL_FLOAT32, 0);
            CHECK(st != GCOLL_OK, "recv from rank 0, which never sends, succeeded");
        } else {
            /* alive and silent past rank 0's timeout (a wait of its own would time out as
             * soon and abort, failing rank 0 with GCOLL_ERR_PEER first) */
            sleep(5);
            gcoll_comm_abort(c);
        }
    } else {
        fprintf(stderr, "anysrc_check: unknown mode %s for %d ranks\n", mode, size);
        return 2;
    }
    if (clean)
        CHECK(gcoll_comm_destroy(c) == GCOLL_OK, "destroy");
    else
        gcoll_comm_destroy(c);
    if (failures == 0)
        fprintf(stderr, "anysrc_check rank %d: %s ok\n", rank, mode);
    return failures ? 1 : 0;
}
