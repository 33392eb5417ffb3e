/* test_bootstrap.c: the rendezvous messages' parsers, and the acceptor under strangers
 * (silent, garbage, stalled, wrong key, a flood past its pending limit) in one process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

/* Valgrind runs the acceptor and its clients too slowly for the timing bar. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include "base/auth.h"
#include "core/bootstrap.h"
#include "base/util.h"

/* ---- messages ---------------------------------------------------------------------- */

static size_t make_hello(uint8_t *buf, const char *match, const char *blob)
{
    gcoll_bs_hello_t h = {.rank = 2,
                          .size = 3,
                          .hash = 0x0123456789abcdefull,
                          .match = match,
                          .mlen = strlen(match),
                          .blob = (const uint8_t *)blob,
                          .blen = strlen(blob) + 1};
    snprintf(h.version, sizeof(h.version), "9.8.7");
    return gcoll_bs_hello_encode(&h, buf);
}

static void test_hello(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = make_hello(buf, "compressor=none", "127.0.0.1 4000");
    assert_int_equal(gcoll_bs_hello_encode(&(gcoll_bs_hello_t){.mlen = 15, .blen = 15}, NULL), n);
    gcoll_bs_hello_t h;
    size_t need = 0;
    const char *why = NULL;
    assert_int_equal(gcoll_bs_hello_parse(buf, n, &h, &need, &why), 1);
    assert_int_equal(need, n);
    assert_int_equal(h.rank, 2);
    assert_int_equal(h.size, 3);
    assert_true(h.hash == 0x0123456789abcdefull);
    assert_string_equal(h.version, "9.8.7");
    assert_int_equal(h.mlen, 15);
    assert_memory_equal(h.match, "compressor=none", 15);
    assert_string_equal((const char *)h.blob, "127.0.0.1 4000");
    /* every truncation asks for more than it has, never for less */
    for (size_t len = 0; len < n; len++) {
        assert_int_equal(gcoll_bs_hello_parse(buf, len, &h, &need, &why), 0);
        assert_true(need > len && need <= n);
    }
    /* bad magic; fields longer than the limit are refused before anything is read */
    buf[0] ^= 1;
    assert_int_equal(gcoll_bs_hello_parse(buf, n, &h, &need, &why), -1);
    assert_non_null(why);
    buf[0] ^= 1;
    gcoll_put_u16(buf + 36, GCOLL_BS_MAX_FIELD + 1);
    assert_int_equal(gcoll_bs_hello_parse(buf, 38, &h, &need, &why), -1);
    n = make_hello(buf, "", "x");
    gcoll_put_u32(buf + 38, 0xffffffffu);
    assert_int_equal(gcoll_bs_hello_parse(buf, 42, &h, &need, &why), -1);
}

static size_t make_reply(uint8_t *buf, int32_t status, const char *msg, uint32_t n,
                         const char *const *blobs)
{
    uint8_t *p = buf;
    gcoll_put_u32(p, 0x32424347u);
    gcoll_put_u32(p + 4, (uint32_t)status);
    gcoll_put_u16(p + 8, (uint16_t)strlen(msg));
    memcpy(p + 10, msg, strlen(msg));
    p += 10 + strlen(msg);
    gcoll_put_u32(p, n);
    p += 4;
    for (uint32_t i = 0; i < n; i++) {
        gcoll_put_u32(p, (uint32_t)strlen(blobs[i]));
        memcpy(p + 4, blobs[i], strlen(blobs[i]));
        p += 4 + strlen(blobs[i]);
    }
    return (size_t)(p - buf);
}

static void test_reply(void **state)
{
    (void)state;
    static const char *const blobs[3] = {"a", "bb", ""};
    uint8_t buf[256];
    gcoll_bs_reply_t r;
    size_t need = 0;
    const char *why = NULL;
    size_t n = make_reply(buf, 0, "", 3, blobs);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), 1);
    assert_int_equal(need, n);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.tlen, 4 + 1 + 4 + 2 + 4);
    for (size_t len = 0; len < n; len++) {
        assert_int_equal(gcoll_bs_reply_parse(buf, len, 3, &r, &need, &why), 0);
        assert_true(need > len && need <= n);
    }
    /* more entries than ranks */
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 2, &r, &need, &why), -1);
    /* a refusal carries its reason and no table */
    n = make_reply(buf, GCOLL_ERR_MISMATCH, "versions differ", 0, NULL);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), 1);
    assert_int_equal(r.status, GCOLL_ERR_MISMATCH);
    assert_memory_equal(r.msg, "versions differ", r.mlen);
    n = make_reply(buf, GCOLL_ERR_MISMATCH, "", 3, blobs);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), -1);
    /* statuses gcoll does not have */
    n = make_reply(buf, 1, "", 0, NULL);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), -1);
    n = make_reply(buf, -1000, "", 0, NULL);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), -1);
    /* an entry longer than the limit */
    n = make_reply(buf, 0, "", 1, blobs);
    gcoll_put_u32(buf + 14, GCOLL_BS_MAX_FIELD + 1);
    assert_int_equal(gcoll_bs_reply_parse(buf, n, 3, &r, &need, &why), -1);
}

/* ---- the acceptor under strangers ---------------------------------------------------- */

static const gcoll_key_t job_key = {(const uint8_t *)"the-job-key", 11};
static struct sockaddr_in listen_addr;

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&listen_addr, sizeof(listen_addr)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

typedef struct {
    const gcoll_key_t *key;
    uint32_t id;
    gcoll_status_t st;
    int fd;
} client_t;

static void *client_main(void *arg)
{
    client_t *c = arg;
    uint8_t id[8];
    gcoll_put_u32(id, c->id);
    gcoll_put_u32(id + 4, 3);
    char err[256];
    c->fd = dial();
    c->st = c->fd < 0 ? GCOLL_ERR_TRANSPORT
                      : gcoll_auth_client(c->fd, c->key, id, sizeof(id), gcoll_time_ms() + 30000,
                                          err, sizeof(err));
    return NULL;
}

static int accepted[4];

static int on_peer(void *arg, int fd, const void *payload, size_t plen, const char *peer)
{
    (void)arg;
    (void)peer;
    uint32_t id = plen == 8 ? gcoll_get_u32(payload) : 0;
    if (id < 1 || id > 2 || accepted[id])
        return -1;
    accepted[id] = fd;
    return 0;
}

static void test_accept_strangers(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    listen_addr =
        (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(listen_addr);
    assert_int_equal(bind(lfd, (struct sockaddr *)&listen_addr, sl), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&listen_addr, &sl), 0);
    assert_int_equal(listen(lfd, 1024), 0);
    /* queued before the acceptor runs: 300 silent connections (more than it keeps
     * pending), garbage, a stalled handshake, early closes */
    enum { NSILENT = 300 };
    int strangers[NSILENT + 8], ns = 0;
    for (int i = 0; i < NSILENT; i++)
        assert_true((strangers[ns++] = dial()) >= 0);
    static const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    strangers[ns] = dial();
    assert_int_equal(send(strangers[ns++], junk, sizeof(junk), MSG_NOSIGNAL), sizeof(junk));
    static const char part[6] = {'G', 'C', 'A', '2', 0, 0};
    strangers[ns] = dial();
    assert_int_equal(send(strangers[ns++], part, sizeof(part), MSG_NOSIGNAL), sizeof(part));
    for (int i = 0; i < 3; i++)
        close(dial());
    /* then a wrong key and the two ranks, each after the flood */
    gcoll_key_t wrong = {(const uint8_t *)"guess", 5};
    client_t c[3] = {{&wrong, 1, 0, -1}, {&job_key, 1, 0, -1}, {&job_key, 2, 0, -1}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &c[i]), 0);
    uint64_t t0 = gcoll_time_ms();
    char err[256] = "";
    memset(accepted, 0, sizeof(accepted));
    gcoll_status_t st =
        gcoll_auth_accept(lfd, &job_key, 2, on_peer, NULL, t0 + 30000, err, sizeof(err));
    uint64_t took = gcoll_time_ms() - t0;
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    if (st != GCOLL_OK || c[1].st != GCOLL_OK || c[2].st != GCOLL_OK)
        print_message("acceptor: %s (%s) after %llu ms; clients %d %d %d\n",
                      gcoll_status_string(st), err, (unsigned long long)took, c[0].st, c[1].st,
                      c[2].st);
    assert_int_equal(st, GCOLL_OK);
    assert_int_not_equal(c[0].st, GCOLL_OK);
    assert_int_equal(c[1].st, GCOLL_OK);
    assert_int_equal(c[2].st, GCOLL_OK);
    assert_true(accepted[1] > 0 && accepted[2] > 0);
    /* the flood costs the ranks at most the acceptor's grace period (0.5 s) per slot
     * round, never a stranger's whole handshake deadline (5 s) */
    if (!RUNNING_ON_VALGRIND)
        assert_true(took < 3000);
    for (int i = 0; i < 3; i++)
        if (c[i].fd >= 0)
            close(c[i].fd);
    close(accepted[1]);
    close(accepted[2]);
    for (int i = 0; i < ns; i++)
        close(strangers[i]);
    close(lfd);
}

/* Nobody comes: the acceptor gives up at its deadline with a reason. */
static void test_accept_deadline(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 16), 0);
    char err[256] = "";
    uint64_t t0 = gcoll_time_ms();
    assert_int_equal(gcoll_auth_accept(lfd, &job_key, 1, on_peer, NULL, t0 + 300, err, sizeof(err)),
                     GCOLL_ERR_TIMEOUT);
    assert_true(gcoll_time_ms() - t0 < 2000);
    assert_non_null(strstr(err, "timed out"));
    close(lfd);
}

/* A connect to an address that never answers gives up at the deadline. */
static void test_connect_deadline(void **state)
{
    (void)state;
    /* a listener whose backlog is full leaves the next SYN unanswered */
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sl), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    assert_int_equal(listen(lfd, 0), 0);
    int fds[8], nf = 0;
    gcoll_status_t st = GCOLL_OK;
    uint64_t t0 = 0;
    while (nf < 8 && st == GCOLL_OK) {
        fds[nf] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        t0 = gcoll_time_ms();
        st = gcoll_sock_connect(fds[nf++], (struct sockaddr *)&sa, sl, t0 + 300);
    }
    assert_int_equal(st, GCOLL_ERR_TIMEOUT);
    assert_true(gcoll_time_ms() - t0 < 2000);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    close(lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello),
        cmocka_unit_test(test_reply),
        cmocka_unit_test(test_accept_strangers),
        cmocka_unit_test(test_accept_deadline),
        cmocka_unit_test(test_connect_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
