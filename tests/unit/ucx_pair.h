/* ucx_pair.h: two UCX transport instances of one process connected to each other (rank 0
 * and rank 1), the harness of test_ucx and test_ucx_shm: setups (rank 1 may get its own
 * configuration), progress of both, and a transfer checked for the path it took. */
#ifndef GCOLL_TEST_UCX_PAIR_H
#define GCOLL_TEST_UCX_PAIR_H

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

static inline void *connect_one(void *arg)
{
    conn_arg_t *a = arg;
    const void *blobs[2] = {a->p->blob[0], a->p->blob[1]};
    a->p->st[a->rank] =
        gcoll_ucx_ops.connect(a->p->t[a->rank], blobs, a->p->len, gcoll_time_ms() + 20000);
    return NULL;
}

static inline int setup(void **state)
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
static inline int setup_with(void **state, const char *name, const char *value)
{
    setenv(name, value, 1);
    int rc = setup(state);
    unsetenv(name);
    return rc;
}

/* With GCOLL_UNEXPECTED_BYTES=8mb. */
static inline int setup_bounded(void **state)
{
    return setup_with(state, "GCOLL_TEST_UNEXPECTED_BOUND", "1");
}

/* Without UCX's keepalive, which would wake a sleeping receiver every second anyway. */
static inline int setup_quiet(void **state)
{
    return setup_with(state, "UCX_KEEPALIVE_INTERVAL", "60s");
}

static inline int teardown(void **state)
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

static inline void progress_both(pair_t *p)
{
    for (int r = 0; r < 2; r++)
        gcoll_ucx_ops.progress(p->t[r], 0);
}

/* Drives both sides until every request is done (5 s: a test failure). */
static inline void drive(pair_t *p, gcoll_treq_t **reqs, int n)
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

static inline gcoll_treq_t req(int peer, uint64_t tag, void *buf, size_t len)
{
    return (gcoll_treq_t){.peer = peer, .tag = tag, .sig = 7, .buf = buf, .len = len};
}

/* Until rank 1 holds an unexpected message from rank 0. */
static inline void wait_unexpected(pair_t *p)
{
    uint64_t deadline = gcoll_time_ms() + 5000;
    while (!p->t[1]->peers[0].rx.unexp) {
        assert_true(gcoll_time_ms() < deadline);
        progress_both(p);
    }
}

/* VIA_PUT: a receive made with GCOLL_TREQ_RECEIVER_BUSY that the sender writes;
 * VIA_PUT_READ: one made so that the receiver reads all the same (the sender cannot write). */
enum { VIA_UCX, VIA_CMA, VIA_SHM, VIA_PUT, VIA_PUT_READ };

static inline void transfer(pair_t *p, size_t len, int recv_first, int via)
{
    uint8_t *src = malloc(len + 1), *dst = calloc(1, len + 1);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + len);
    unsigned long sends = p->t[0]->st_cma_sends, recvs = p->t[1]->st_cma_recvs;
    unsigned long puts = p->t[1]->st_cma_puts;
    int cma = via == VIA_CMA || via == VIA_PUT || via == VIA_PUT_READ;
    unsigned long shm_sends = p->t[0]->st_shm_sends, shm_recvs = p->t[1]->st_shm_recvs;
    gcoll_treq_t s = req(1, 1000 + len, src, len), r = req(0, 1000 + len, dst, len);
    if (via == VIA_PUT || via == VIA_PUT_READ)
        r.flags = GCOLL_TREQ_RECEIVER_BUSY;
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
        if (cma)
            assert_int_equal(s.done, 0); /* the send waits for the read (or the request) */
        assert_int_equal(gcoll_ucx_ops.irecv(p->t[1], &r), GCOLL_OK);
    }
    gcoll_treq_t *both[] = {&s, &r};
    drive(p, both, 2);
    assert_int_equal(s.status, GCOLL_OK);
    assert_int_equal(r.status, GCOLL_OK);
    assert_int_equal(r.nbytes, len);
    assert_memory_equal(src, dst, len);
    assert_int_equal(p->t[0]->st_cma_sends - sends, (unsigned long)cma);
    assert_int_equal(p->t[1]->st_cma_recvs - recvs, (unsigned long)cma);
    assert_int_equal(p->t[1]->st_cma_puts - puts, (unsigned long)(via == VIA_PUT));
    assert_int_equal(p->t[0]->st_shm_sends - shm_sends, (unsigned long)(via == VIA_SHM));
    assert_int_equal(p->t[1]->st_shm_recvs - shm_recvs, (unsigned long)(via == VIA_SHM));
    free(src);
    free(dst);
}

#endif /* GCOLL_TEST_UCX_PAIR_H */
