/* p2p_check: point-to-point and group calls across processes, through the public API only.
 *   p2p_check [all]   any number of ranks: every dtype between every pair (blocking,
 *                     nonblocking, counts 0, 1, odd and 1 MiB+), order of several messages
 *                     to one peer, sends to oneself, ring shifts of blocking calls inside
 *                     a group, groups of allreduces (fused) and of nonblocking calls, and
 *                     point-to-point interleaved with allreduce, broadcast and a compressed
 *                     allreduce on the same communicator
 *   p2p_check errors  any number of ranks: peers out of range, bad arguments, group misuse
 *   p2p_check mismatch  2 ranks: rank 0 sends 6 floats, rank 1 receives 4: rank 1 gets
 *                       GCOLL_ERR_MISMATCH and nothing past its 4 floats is written
 *   p2p_check dead    2 ranks: rank 0 exits without sending; rank 1's receive fails with
 *                     GCOLL_ERR_PEER well within GCOLL_TIMEOUT_MS
 * Payloads are byte patterns of (sender, receiver, message, index) computed on both sides;
 * received bytes are compared whole (point-to-point moves bytes: bit equality holds). The
 * allreduces sum small integers, exact in every dtype used. Exit status 0 when every check
 * passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcoll.h"

#define CHECK_PROG "p2p_check"
#include "p2p_common.h"

static int rank, size, failures;

static uint8_t pat(int src, int dst, int msg, size_t i)
{
    return (uint8_t)(src * 31 + dst * 17 + msg * 7 + (int)(i * 13) + (int)(i >> 8));
}

static void fill(uint8_t *b, size_t n, int src, int dst, int msg)
{
    for (size_t i = 0; i < n; i++)
        b[i] = pat(src, dst, msg, i);
}

/* index of the first byte that differs from the pattern, or n */
static size_t first_bad(const uint8_t *b, size_t n, int src, int dst, int msg)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != pat(src, dst, msg, i))
            return i;
    return n;
}

static const gcoll_dtype_t dtypes[] = {
    GCOLL_FLOAT32, GCOLL_FLOAT16, GCOLL_BFLOAT16,    GCOLL_FLOAT64,    GCOLL_INT32,
    GCOLL_INT64,   GCOLL_BOOL,    GCOLL_INT8,        GCOLL_UINT8,      GCOLL_INT16,
    GCOLL_UINT32,  GCOLL_UINT64,  GCOLL_FLOAT8_E4M3, GCOLL_FLOAT8_E5M2};
#define NDT ((int)(sizeof(dtypes) / sizeof(dtypes[0])))

/* Every ordered pair (a, b), a != b: a sends count elements to b, blocking or not; pairs
 * are visited in the same order everywhere, so blocking calls never wait in a cycle. */
static void pairs(gcoll_comm_t *c, gcoll_dtype_t dt, size_t count, int msg, int nonblocking)
{
    size_t bytes = count * gcoll_dtype_size(dt);
    uint8_t *b = malloc(bytes + 1);
    for (int a = 0; a < size; a++)
        for (int d = 0; d < size; d++) {
            if (a == d || (rank != a && rank != d))
                continue;
            gcoll_status_t st;
            gcoll_request_t *req = NULL;
            if (rank == a) {
                fill(b, bytes, a, d, msg);
                st = nonblocking ? gcoll_isend(c, b, count, dt, d, &req)
                                 : gcoll_send(c, b, count, dt, d);
            } else {
                memset(b, 0xee, bytes);
                st = nonblocking ? gcoll_irecv(c, b, count, dt, a, &req)
                                 : gcoll_recv(c, b, count, dt, a);
            }
            if (st == GCOLL_OK && req)
                st = gcoll_wait(req);
            CHECK(st == GCOLL_OK, "%s %zu %s %d->%d: %s", nonblocking ? "nonblocking" : "blocking",
                  count, gcoll_dtype_name(dt), a, d, gcoll_status_string(st));
            if (rank == d && st == GCOLL_OK) {
                size_t i = first_bad(b, bytes, a, d, msg);
                CHECK(i == bytes, "%zu %s from %d: byte %zu wrong", count, gcoll_dtype_name(dt), a,
                      i);
            }
        }
    free(b);
}

/* Three messages of different lengths from every rank to every other, all posted before
 * any is waited for: each lands in the receive posted in the same place. */
static void ordering(gcoll_comm_t *c)
{
    enum { M = 3 };
    static const size_t len[M] = {100, 100, 100}; /* same length: only order tells them apart */
    uint8_t *sb = malloc((size_t)size * M * 100), *rb = malloc((size_t)size * M * 100);
    gcoll_request_t **rq = calloc((size_t)size * M * 2, sizeof(*rq));
    int n = 0;
    CHECK(gcoll_group_start(c) == GCOLL_OK, "group_start");
    for (int p = 0; p < size; p++) {
        if (p == rank)
            continue;
        for (int m = 0; m < M; m++) {
            uint8_t *s = sb + ((size_t)p * M + m) * 100, *r = rb + ((size_t)p * M + m) * 100;
            fill(s, len[m], rank, p, 10 + m);
            memset(r, 0, len[m]);
            CHECK(gcoll_isend(c, s, len[m], GCOLL_UINT8, p, &rq[n++]) == GCOLL_OK, "isend");
            CHECK(gcoll_irecv(c, r, len[m], GCOLL_UINT8, p, &rq[n++]) == GCOLL_OK, "irecv");
        }
    }
    int done = 1;
    if (n)
        gcoll_test(rq[0], &done);
    CHECK(n == 0 || done == 0, "a grouped request completed before gcoll_group_end");
    CHECK(gcoll_group_end(c) == GCOLL_OK, "group_end of %d transfers", n);
    for (int i = 0; i < n; i++)
        CHECK(gcoll_wait(rq[i]) == GCOLL_OK, "wait %d", i);
    for (int p = 0; p < size; p++)
        for (int m = 0; p != rank && m < M; m++) {
            size_t i = first_bad(rb + ((size_t)p * M + m) * 100, len[m], p, rank, 10 + m);
            CHECK(i == len[m], "message %d from rank %d out of order (byte %zu)", m, p, i);
        }
    free(sb);
    free(rb);
    free(rq);
}

/* A ring shift written as a blocking send then a blocking receive, inside a group. */
static void ring_shift(gcoll_comm_t *c, gcoll_dtype_t dt, size_t count, int msg)
{
    size_t bytes = count * gcoll_dtype_size(dt);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    uint8_t *s = malloc(bytes + 1), *r = malloc(bytes + 1);
    fill(s, bytes, rank, right, msg);
    memset(r, 0, bytes);
    gcoll_status_t st = gcoll_group_start(c);
    if (st == GCOLL_OK)
        st = gcoll_send(c, s, count, dt, right);
    if (st == GCOLL_OK)
        st = gcoll_recv(c, r, count, dt, left);
    gcoll_status_t st2 = gcoll_group_end(c);
    CHECK(st == GCOLL_OK && st2 == GCOLL_OK, "ring shift of %zu %s: %s / %s", count,
          gcoll_dtype_name(dt), gcoll_status_string(st), gcoll_status_string(st2));
    size_t i = first_bad(r, bytes, left, rank, msg);
    CHECK(i == bytes, "ring shift of %zu %s: byte %zu from rank %d wrong", count,
          gcoll_dtype_name(dt), i, left);
    free(s);
    free(r);
}

/* Blocking send to oneself, then the receive. */
static void self_send(gcoll_comm_t *c)
{
    uint8_t s[257], r[257];
    fill(s, sizeof(s), rank, rank, 77);
    memset(r, 0, sizeof(r));
    CHECK(gcoll_send(c, s, sizeof(s), GCOLL_INT8, rank) == GCOLL_OK, "send to self");
    CHECK(gcoll_recv(c, r, sizeof(r), GCOLL_INT8, rank) == GCOLL_OK, "recv from self");
    CHECK(memcmp(s, r, sizeof(s)) == 0, "message to self changed");
}

/* A group of allreduces (fused: one dtype and op, small) and one of another dtype, with
 * nonblocking handles; sums of rank-dependent integers, exact. */
static void fused(gcoll_comm_t *c)
{
    enum { N = 5 };
    static const size_t cnt[N] = {1, 7, 0, 300, 33};
    float *f[N];
    int64_t i64[9];
    gcoll_request_t *rq[N + 1];
    CHECK(gcoll_group_start(c) == GCOLL_OK, "group_start");
    for (int k = 0; k < N; k++) {
        f[k] = malloc((cnt[k] + 1) * sizeof(float));
        for (size_t i = 0; i < cnt[k]; i++)
            f[k][i] = (float)(rank + 1) * (float)(k + 1) + (float)(i % 5);
        CHECK(gcoll_iallreduce(c, f[k], f[k], cnt[k], GCOLL_FLOAT32, GCOLL_SUM, &rq[k]) == GCOLL_OK,
              "iallreduce %d in a group", k);
    }
    for (int i = 0; i < 9; i++)
        i64[i] = rank * 1000 + i;
    CHECK(gcoll_allreduce(c, i64, i64, 9, GCOLL_INT64, GCOLL_MAX) == GCOLL_OK,
          "blocking allreduce in a group");
    /* a compressed allreduce among them (fp16 of small integers and their sums: exact) */
    gcoll_compressor_t *comp = NULL;
    gcoll_tensor_state_t *ts = NULL;
    float g[100], out[100];
    for (int i = 0; i < 100; i++)
        g[i] = (float)(i % 9 - 4);
    CHECK(gcoll_compressor_create("fp16", &comp) == GCOLL_OK &&
              gcoll_state_create(comp, 100, &ts) == GCOLL_OK,
          "fp16 state");
    CHECK(gcoll_compressed_allreduce(c, ts, g, out, 100, GCOLL_SUM) == GCOLL_OK,
          "compressed allreduce in a group");
    CHECK(gcoll_group_end(c) == GCOLL_OK, "group_end");
    for (int i = 0; i < 100; i++)
        if (out[i] != (float)(size * (i % 9 - 4))) {
            CHECK(0, "compressed allreduce in a group [%d] = %g", i, out[i]);
            break;
        }
    gcoll_state_destroy(ts);
    gcoll_compressor_destroy(comp);
    for (int k = 0; k < N; k++) {
        CHECK(gcoll_wait(rq[k]) == GCOLL_OK, "wait %d", k);
        double sr = (double)size * (size + 1) / 2;
        for (size_t i = 0; i < cnt[k]; i++) {
            float want = (float)(sr * (k + 1) + (double)size * (double)(i % 5));
            if (f[k][i] != want) {
                CHECK(0, "fused allreduce %d [%zu] = %g, want %g", k, i, f[k][i], want);
                break;
            }
        }
        free(f[k]);
    }
    for (int i = 0; i < 9; i++)
        CHECK(i64[i] == (int64_t)(size - 1) * 1000 + i, "int64 max [%d] = %lld", i,
              (long long)i64[i]);
}

/* Point-to-point between collectives: rank 0 sends to the last rank before an allreduce,
 * which receives after it, then a broadcast and a compressed allreduce. */
static void interleaved(gcoll_comm_t *c, gcoll_compressor_t *comp)
{
    int last = size - 1;
    uint8_t m[64];
    gcoll_request_t *rq = NULL;
    if (rank == 0) {
        fill(m, sizeof(m), 0, last, 90);
        CHECK(gcoll_isend(c, m, sizeof(m), GCOLL_UINT8, last, &rq) == GCOLL_OK, "isend");
    }
    int32_t v = rank + 1;
    CHECK(gcoll_allreduce(c, &v, &v, 1, GCOLL_INT32, GCOLL_SUM) == GCOLL_OK, "allreduce");
    CHECK(v == size * (size + 1) / 2, "allreduce between p2p = %d", v);
    if (rank == last) {
        memset(m, 0, sizeof(m));
        CHECK(gcoll_recv(c, m, sizeof(m), GCOLL_UINT8, 0) == GCOLL_OK, "recv");
        CHECK(first_bad(m, sizeof(m), 0, last, 90) == sizeof(m), "message across an allreduce");
    }
    if (rq)
        CHECK(gcoll_wait(rq) == GCOLL_OK, "wait isend");
    int64_t b[3] = {rank, rank, rank};
    CHECK(gcoll_broadcast(c, b, 3, GCOLL_INT64, last) == GCOLL_OK, "broadcast");
    CHECK(b[0] == last && b[2] == last, "broadcast got %lld", (long long)b[0]);
    if (comp) {
        float g[256], out[256];
        for (int i = 0; i < 256; i++)
            g[i] = (float)((i % 7) - 3);
        gcoll_tensor_state_t *ts = NULL;
        CHECK(gcoll_state_create(comp, 256, &ts) == GCOLL_OK, "state");
        CHECK(gcoll_compressed_allreduce(c, ts, g, out, 256, GCOLL_SUM) == GCOLL_OK,
              "compressed allreduce");
        gcoll_state_destroy(ts);
        /* fp16 of small integers is exact, and so are their sums */
        for (int i = 0; i < 256; i++)
            if (out[i] != (float)(size * ((i % 7) - 3))) {
                CHECK(0, "compressed allreduce [%d] = %g", i, out[i]);
                break;
            }
    }
    if (size > 1 && rank <= 1) { /* after the compressed one: a pair's exchange again */
        int peer = 1 - rank;
        double x = rank + 0.5, y = -1;
        CHECK(gcoll_group_start(c) == GCOLL_OK, "group_start");
        gcoll_send(c, &x, 1, GCOLL_FLOAT64, peer);
        gcoll_recv(c, &y, 1, GCOLL_FLOAT64, peer);
        CHECK(gcoll_group_end(c) == GCOLL_OK, "group_end");
        CHECK(y == peer + 0.5, "exchange after the compressed allreduce: %g", y);
    }
}

static int run_all(gcoll_comm_t *c)
{
    static const size_t counts[] = {0, 1, 3, 17, 1001};
    int msg = 0;
    for (int d = 0; d < NDT; d++)
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            pairs(c, dtypes[d], counts[k], msg++, (int)(k & 1));
            ring_shift(c, dtypes[d], counts[k], msg++);
        }
    /* large: beyond the transports' eager sizes (rendezvous where they have one) */
    pairs(c, GCOLL_FLOAT32, (size_t)1 << 20, msg++, 0);
    pairs(c, GCOLL_UINT8, (3u << 20) + 5, msg++, 1);
    ring_shift(c, GCOLL_FLOAT32, (size_t)1 << 21, msg++);
    ordering(c);
    self_send(c);
    fused(c);
    gcoll_compressor_t *comp = NULL;
    if (gcoll_compressor_create("fp16", &comp) != GCOLL_OK)
        CHECK(0, "compressor fp16");
    interleaved(c, comp);
    gcoll_compressor_destroy(comp);
    return 0;
}

static void run_errors(gcoll_comm_t *c)
{
    float x = 1;
    gcoll_request_t *rq = NULL;
    CHECK(gcoll_send(c, &x, 1, GCOLL_FLOAT32, size) == GCOLL_ERR_INVALID, "peer == size");
    CHECK(strstr(gcoll_last_error(), "peer") != NULL, "error names the peer: %s",
          gcoll_last_error());
    CHECK(gcoll_recv(c, &x, 1, GCOLL_FLOAT32, -1) == GCOLL_ERR_INVALID, "peer -1");
    CHECK(gcoll_isend(c, &x, 1, GCOLL_FLOAT32, 0, NULL) == GCOLL_ERR_INVALID, "NULL request");
    CHECK(gcoll_send(c, NULL, 3, GCOLL_FLOAT32, 0) == GCOLL_ERR_INVALID, "NULL buffer");
    CHECK(gcoll_send(c, &x, 1, (gcoll_dtype_t)99, 0) == GCOLL_ERR_INVALID, "bad dtype");
    CHECK(gcoll_send(NULL, &x, 1, GCOLL_FLOAT32, 0) == GCOLL_ERR_INVALID, "NULL comm");
    CHECK(gcoll_group_end(c) == GCOLL_ERR_INVALID, "group_end without start");
    CHECK(gcoll_group_start(c) == GCOLL_OK, "group_start");
    CHECK(gcoll_isend(c, &x, 1, GCOLL_FLOAT32, rank, &rq) == GCOLL_OK, "isend to self");
    CHECK(gcoll_wait(rq) == GCOLL_ERR_INVALID, "wait inside the group");
    gcoll_comm_t *dup = NULL;
    CHECK(gcoll_comm_dup(c, &dup) == GCOLL_ERR_INVALID, "dup inside a group");
    float y = 0;
    CHECK(gcoll_recv(c, &y, 1, GCOLL_FLOAT32, rank) == GCOLL_OK, "recv from self");
    CHECK(gcoll_group_end(c) == GCOLL_OK, "group_end");
    CHECK(gcoll_wait(rq) == GCOLL_OK && y == 1, "self exchange in a group");
    /* the communicator still works after the refused calls */
    int32_t v = 1;
    CHECK(gcoll_allreduce(c, &v, &v, 1, GCOLL_INT32, GCOLL_SUM) == GCOLL_OK && v == size,
          "allreduce after refused calls");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    gcoll_comm_t *c = NULL;
    if (gcoll_comm_init(&c) != GCOLL_OK) {
        fprintf(stderr, "p2p_check: init failed: %s\n", gcoll_last_error());
        return 2;
    }
    rank = gcoll_comm_rank(c);
    size = gcoll_comm_size(c);
    if (strcmp(mode, "all") == 0) {
        run_all(c);
    } else if (strcmp(mode, "errors") == 0) {
        run_errors(c);
    } else if (strcmp(mode, "mismatch") == 0 && size == 2) {
        float b[8];
        for (int i = 0; i < 8; i++)
            b[i] = (float)i;
        if (rank == 0) {
            gcoll_status_t st = gcoll_send(c, b, 6, GCOLL_FLOAT32, 1);
            /* the send may be gone before rank 1 refuses it, or fail with its refusal */
            CHECK(st == GCOLL_OK || st == GCOLL_ERR_MISMATCH || st == GCOLL_ERR_PEER, "send: %s",
                  gcoll_status_string(st));
        } else {
            float r[8];
            for (int i = 0; i < 8; i++)
                r[i] = -1;
            gcoll_status_t st = gcoll_recv(c, r, 4, GCOLL_FLOAT32, 0);
            CHECK(st == GCOLL_ERR_MISMATCH, "recv of 4 from a send of 6: %s",
                  gcoll_status_string(st));
            CHECK(r[4] == -1 && r[5] == -1, "written past the receive's 4 floats");
            CHECK(strstr(gcoll_comm_last_error(c), "count or dtype") != NULL,
                  "the error says why: %s", gcoll_comm_last_error(c));
            printf("mismatch reported: %s\n", gcoll_comm_last_error(c));
        }
        gcoll_comm_abort(c);
    } else if (strcmp(mode, "dead") == 0 && size == 2) {
        int32_t v = 1;
        CHECK(gcoll_allreduce(c, &v, &v, 1, GCOLL_INT32, GCOLL_SUM) == GCOLL_OK, "allreduce");
        if (rank == 0)
            _exit(0); /* dies without sending or saying goodbye */
        double t0 = now_s();
        float r[4];
        gcoll_status_t st = gcoll_recv(c, r, 4, GCOLL_FLOAT32, 0);
        double dt = now_s() - t0;
        CHECK(st == GCOLL_ERR_PEER, "recv from a dead peer: %s", gcoll_status_string(st));
        /* the test runs with GCOLL_TIMEOUT_MS=30s: the death is seen, not waited out */
        CHECK(dt < 15.0, "the dead peer took %.1f s to be noticed", dt);
        printf("recv from a dead peer: %s after %.2f s\n", gcoll_status_string(st), dt);
        gcoll_comm_abort(c);
    } else {
        fprintf(stderr, "p2p_check: unknown mode %s for %d ranks\n", mode, size);
        return 2;
    }
    if (strcmp(mode, "all") == 0 || strcmp(mode, "errors") == 0)
        CHECK(gcoll_comm_destroy(c) == GCOLL_OK, "destroy");
    else
        gcoll_comm_destroy(c);
    if (failures == 0)
        fprintf(stderr, "p2p_check rank %d: %s ok\n", rank, mode);
    return failures ? 1 : 0;
}
