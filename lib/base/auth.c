/* auth.c: job-key challenge-response (HMAC-SHA256 from OpenSSL's libcrypto) and the
 * non-blocking acceptor shared by the bootstrap root and the TCP transport. */
#include "base/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

/* Challenge "GCA1" + nonce_s; response "GCA2" + nonce_c + plen + payload + mac_c;
 * confirmation "GCA3" + mac_s. mac_c = HMAC(key, "client" nonce_s nonce_c payload) and
 * mac_s = HMAC(key, "server" nonce_c nonce_s): the key never crosses the wire and each
 * side proves it holds the key for this connection's nonces. */
static const uint8_t MAGIC_CHALLENGE[4] = {'G', 'C', 'A', '1'};
static const uint8_t MAGIC_RESPONSE[4] = {'G', 'C', 'A', '2'};
static const uint8_t MAGIC_CONFIRM[4] = {'G', 'C', 'A', '3'};

enum { CHALLENGE_LEN = 4 + GCOLL_AUTH_NONCE, CONFIRM_LEN = 4 + GCOLL_AUTH_MAC };

static void compute_mac(const gcoll_key_t *key, const char *role, const uint8_t *n1,
                        const uint8_t *n2, const void *payload, size_t plen,
                        uint8_t mac[GCOLL_AUTH_MAC])
{
    uint8_t msg[8 + 2 * GCOLL_AUTH_NONCE + GCOLL_AUTH_MAX_PAYLOAD];
    size_t rl = strlen(role);
    memcpy(msg, role, rl);
    memcpy(msg + rl, n1, GCOLL_AUTH_NONCE);
    memcpy(msg + rl + GCOLL_AUTH_NONCE, n2, GCOLL_AUTH_NONCE);
    if (plen)
        memcpy(msg + rl + 2 * GCOLL_AUTH_NONCE, payload, plen);
    unsigned int mlen = GCOLL_AUTH_MAC;
    static const uint8_t empty = 0;
    HMAC(EVP_sha256(), key->keylen ? key->key : &empty, (int)key->keylen, msg,
         rl + 2 * GCOLL_AUTH_NONCE + plen, mac, &mlen);
}

void gcoll_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
        port = ntohs(in6->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        snprintf(buf, len, "?");
    }
}

static gcoll_status_t sock_wait(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        int left = gcoll_ms_left(deadline_ms, 1000);
        if (left == 0 && gcoll_time_ms() >= deadline_ms)
            return GCOLL_ERR_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, left);
        if (rc > 0)
            return GCOLL_OK;
        if (rc < 0 && errno != EINTR)
            return GCOLL_ERR_TRANSPORT;
    }
}

gcoll_status_t gcoll_sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ms)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            GCOLL_CHECK(sock_wait(fd, POLLOUT, deadline_ms));
            continue;
        }
        return (errno == EPIPE || errno == ECONNRESET) ? GCOLL_ERR_PEER : GCOLL_ERR_TRANSPORT;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_sock_connect(int fd, const struct sockaddr *sa, socklen_t len,
                                  uint64_t deadline_ms)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    gcoll_status_t st = GCOLL_OK;
    if (connect(fd, sa, len) != 0) {
        int e = errno;
        if (e == EINPROGRESS) {
            socklen_t el = sizeof(e);
            st = sock_wait(fd, POLLOUT, deadline_ms);
            if (st == GCOLL_ERR_TIMEOUT)
                e = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                e = errno;
        }
        if (e != 0) {
            st = e == ETIMEDOUT ? GCOLL_ERR_TIMEOUT : GCOLL_ERR_TRANSPORT;
            errno = e;
        } else
            st = GCOLL_OK;
    }
    int e = errno;
    fcntl(fd, F_SETFL, fl);
    errno = e;
    return st;
}

gcoll_status_t gcoll_sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return GCOLL_ERR_PEER;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            GCOLL_CHECK(sock_wait(fd, POLLIN, deadline_ms));
            continue;
        }
        return errno == ECONNRESET ? GCOLL_ERR_PEER : GCOLL_ERR_TRANSPORT;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_auth_client(int fd, const gcoll_key_t *key, const void *payload, size_t plen,
                                 uint64_t deadline_ms, char *err, size_t errlen)
{
    uint8_t chal[CHALLENGE_LEN];
    gcoll_status_t st;
    if (plen > GCOLL_AUTH_MAX_PAYLOAD) {
        snprintf(err, errlen, "handshake payload too large");
        return GCOLL_ERR_INTERNAL;
    }
    st = gcoll_sock_read_all(fd, chal, sizeof(chal), deadline_ms);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "no handshake challenge from the server (%s)",
                 st == GCOLL_ERR_TIMEOUT ? "timed out" : "connection closed");
        return st;
    }
    if (memcmp(chal, MAGIC_CHALLENGE, 4) != 0) {
        snprintf(err, errlen, "the server is not a gcoll peer (bad handshake magic)");
        return GCOLL_ERR_PEER;
    }
    uint8_t resp[4 + GCOLL_AUTH_NONCE + 2 + GCOLL_AUTH_MAX_PAYLOAD + GCOLL_AUTH_MAC];
    uint8_t *nonce = resp + 4;
    memcpy(resp, MAGIC_RESPONSE, 4);
    if (RAND_bytes(nonce, GCOLL_AUTH_NONCE) != 1) {
        snprintf(err, errlen, "RAND_bytes failed");
        return GCOLL_ERR_INTERNAL;
    }
    gcoll_put_u16(resp + 4 + GCOLL_AUTH_NONCE, (uint16_t)plen);
    memcpy(resp + 6 + GCOLL_AUTH_NONCE, payload, plen);
    compute_mac(key, "client", chal + 4, nonce, payload, plen, resp + 6 + GCOLL_AUTH_NONCE + plen);
    size_t rlen = 6 + GCOLL_AUTH_NONCE + plen + GCOLL_AUTH_MAC;
    st = gcoll_sock_write_all(fd, resp, rlen, deadline_ms);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "cannot send handshake response");
        return st;
    }
    uint8_t conf[CONFIRM_LEN], want[GCOLL_AUTH_MAC];
    st = gcoll_sock_read_all(fd, conf, sizeof(conf), deadline_ms);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "%s",
                 st == GCOLL_ERR_TIMEOUT
                     ? "no handshake confirmation (timed out)"
                     /* a refusal and a server that stopped both close the connection */
                     : "the server closed the connection unconfirmed: it refused the job key "
                       "(is GCOLL_JOB_KEY the same on every rank?) or it stopped");
        return st == GCOLL_ERR_TIMEOUT ? st : GCOLL_ERR_PEER;
    }
    compute_mac(key, "server", nonce, chal + 4, NULL, 0, want);
    if (memcmp(conf, MAGIC_CONFIRM, 4) != 0 || CRYPTO_memcmp(conf + 4, want, GCOLL_AUTH_MAC)) {
        snprintf(err, errlen, "the server failed to prove it holds the job key");
        return GCOLL_ERR_PEER;
    }
    return GCOLL_OK;
}

enum { S_WAIT_RESPONSE = 0, S_DONE = 1, S_FAILED = 2 };

void gcoll_auth_server_start(gcoll_auth_server_t *s, int fd, uint64_t deadline_ms)
{
    memset(s, 0, sizeof(*s));
    s->fd = fd;
    s->start_ms = gcoll_time_ms();
    s->deadline_ms = deadline_ms;
    s->state = S_WAIT_RESPONSE;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        gcoll_sockaddr_str((struct sockaddr *)&ss, s->peer, sizeof(s->peer));
    else
        snprintf(s->peer, sizeof(s->peer), "?");
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    uint8_t chal[CHALLENGE_LEN];
    memcpy(chal, MAGIC_CHALLENGE, 4);
    if (RAND_bytes(s->nonce, GCOLL_AUTH_NONCE) != 1)
        s->state = S_FAILED;
    memcpy(chal + 4, s->nonce, GCOLL_AUTH_NONCE);
    /* 20 bytes into an empty socket buffer: a short write means the socket is broken */
    if (send(fd, chal, sizeof(chal), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(chal))
        s->state = S_FAILED;
}

static int refuse(gcoll_auth_server_t *s, char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "refused connection from %s: %s", s->peer, why);
    close(s->fd);
    s->fd = -1;
    s->state = S_FAILED;
    return -1;
}

int gcoll_auth_server_step(gcoll_auth_server_t *s, const gcoll_key_t *key, char *err, size_t errlen)
{
    if (s->state == S_FAILED)
        return refuse(s, err, errlen, "socket error during handshake");
    if (s->state == S_DONE)
        return 1;
    for (;;) {
        size_t need = 6 + GCOLL_AUTH_NONCE;
        if (s->have >= need) {
            if (memcmp(s->buf, MAGIC_RESPONSE, 4) != 0)
                return refuse(s, err, errlen, "bad handshake magic (not a gcoll peer?)");
            size_t plen = gcoll_get_u16(s->buf + 4 + GCOLL_AUTH_NONCE);
            if (plen > GCOLL_AUTH_MAX_PAYLOAD)
                return refuse(s, err, errlen, "malformed handshake (payload too long)");
            need += plen + GCOLL_AUTH_MAC;
            if (s->have >= need) {
                uint8_t want[GCOLL_AUTH_MAC];
                const uint8_t *nonce_c = s->buf + 4;
                const uint8_t *payload = s->buf + 6 + GCOLL_AUTH_NONCE;
                compute_mac(key, "client", s->nonce, nonce_c, payload, plen, want);
                if (CRYPTO_memcmp(payload + plen, want, GCOLL_AUTH_MAC) != 0)
                    return refuse(s, err, errlen, "authentication failed (wrong GCOLL_JOB_KEY?)");
                uint8_t conf[CONFIRM_LEN];
                memcpy(conf, MAGIC_CONFIRM, 4);
                compute_mac(key, "server", nonce_c, s->nonce, NULL, 0, conf + 4);
                if (send(s->fd, conf, sizeof(conf), MSG_NOSIGNAL | MSG_DONTWAIT) !=
                    (ssize_t)sizeof(conf))
                    return refuse(s, err, errlen, "cannot send handshake confirmation");
                memcpy(s->payload, payload, plen);
                s->plen = plen;
                s->state = S_DONE;
                return 1;
            }
        }
        ssize_t n = recv(s->fd, s->buf + s->have, need - s->have, MSG_DONTWAIT);
        if (n > 0) {
            s->have += (size_t)n;
            continue;
        }
        if (n == 0)
            return refuse(s, err, errlen, "closed during handshake");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return refuse(s, err, errlen, strerror(errno));
        if (gcoll_time_ms() >= s->deadline_ms)
            return refuse(s, err, errlen, "handshake timed out (silent client)");
        return 0;
    }
}

/* A stranger gets at most HANDSHAKE_MS to complete its handshake; a rank's takes one
 * round trip. With MAX_PENDING handshakes unfinished, the oldest gives way to the next
 * connection once it is GRACE_MS old (until then the backlog waits), so a flood of
 * strangers can neither keep a rank out nor hold the job until its deadline, and every
 * connection, a rank's too, has at least GRACE_MS to answer the challenge. */
#define HANDSHAKE_MS 5000
#define GRACE_MS 500
#define MAX_PENDING 128
/* Refusals logged one by one per accept call; the rest are counted in one last line. */
#define MAX_LOGGED 16

typedef struct {
    int refused, logged;
} refusals_t;

static void log_refusal(refusals_t *rf, const char *why)
{
    rf->refused++;
    if (rf->logged < MAX_LOGGED) {
        rf->logged++;
        GCOLL_WARN("%s%s", why,
                   rf->logged == MAX_LOGGED ? " (further refusals are only counted)" : "");
    }
}

/* pend[] is kept in order of arrival, so pend[0] is the oldest. */
static void drop_pending(gcoll_auth_server_t *pend, int *npend, int i)
{
    if (pend[i].fd >= 0)
        close(pend[i].fd);
    memmove(&pend[i], &pend[i + 1], (size_t)(*npend - i - 1) * sizeof(*pend));
    --*npend;
}

gcoll_status_t gcoll_auth_accept(int listen_fd, const gcoll_key_t *key, int want,
                                 gcoll_accept_cb_t on_peer, void *arg, uint64_t deadline_ms,
                                 char *err, size_t errlen)
{
    return gcoll_auth_accept_tick(listen_fd, key, want, on_peer, NULL, arg, deadline_ms, err,
                                  errlen);
}

gcoll_status_t gcoll_auth_accept_tick(int listen_fd, const gcoll_key_t *key, int want,
                                      gcoll_accept_cb_t on_peer, void (*tick)(void *arg), void *arg,
                                      uint64_t deadline_ms, char *err, size_t errlen)
{
    gcoll_auth_server_t *pend = calloc(MAX_PENDING, sizeof(*pend));
    if (!pend)
        return GCOLL_ERR_NOMEM;
    int npend = 0, got = 0;
    refusals_t rf = {0, 0};
    uint64_t accept_after = 0; /* no descriptors left, or no slot old enough to give way */
    gcoll_status_t st = GCOLL_OK;
    struct pollfd pfd[MAX_PENDING + 1];
    /* non-blocking, so that draining the backlog stops when it is empty */
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    while (got < want) {
        uint64_t now = gcoll_time_ms();
        if (now >= deadline_ms) {
            snprintf(err, errlen, "timed out waiting for %d more connection(s)", want - got);
            st = GCOLL_ERR_TIMEOUT;
            break;
        }
        pfd[0] = (struct pollfd){.fd = listen_fd, .events = now >= accept_after ? POLLIN : 0};
        int wait_ms = gcoll_ms_left(deadline_ms, 100);
        if (now < accept_after)
            wait_ms = GCOLL_MIN(wait_ms, (int)(accept_after - now));
        for (int i = 0; i < npend; i++)
            pfd[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int rc = poll(pfd, (nfds_t)npend + 1, wait_ms);
        if (rc < 0 && errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            st = GCOLL_ERR_TRANSPORT;
            break;
        }
        /* Step every pending handshake: readable ones progress, expired ones are dropped. */
        for (int i = 0; i < npend;) {
            char why[256];
            int r = gcoll_auth_server_step(&pend[i], key, why, sizeof(why));
            if (r == 0) {
                i++;
                continue;
            }
            if (r < 0) {
                log_refusal(&rf, why);
            } else if (on_peer(arg, pend[i].fd, pend[i].payload, pend[i].plen, pend[i].peer) == 0) {
                got++;
                pend[i].fd = -1; /* the callback owns it now */
            } else {
                snprintf(why, sizeof(why),
                         "refused connection from %s: invalid identity in "
                         "handshake",
                         pend[i].peer);
                log_refusal(&rf, why);
            }
            drop_pending(pend, &npend, i);
        }
        if (got >= want)
            break;
        if (tick)
            tick(arg);
        /* Drain the backlog: a flood must not be taken one connection per poll. */
        while (rc > 0 && (pfd[0].revents & POLLIN)) {
            if (npend == MAX_PENDING && gcoll_time_ms() < pend[0].start_ms + GRACE_MS) {
                accept_after = pend[0].start_ms + GRACE_MS;
                break;
            }
            int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    GCOLL_WARN("accepting connections: %s (pausing for 50 ms)", strerror(errno));
                    accept_after = gcoll_time_ms() + 50;
                }
                break; /* EAGAIN: drained; ECONNABORTED and the like: the next poll retries */
            }
            if (npend == MAX_PENDING) {
                char why[256];
                snprintf(why, sizeof(why),
                         "dropped connection from %s: %d handshakes pending, "
                         "the oldest gives way",
                         pend[0].peer, MAX_PENDING);
                log_refusal(&rf, why);
                drop_pending(pend, &npend, 0);
            }
            gcoll_auth_server_start(&pend[npend++], fd,
                                    GCOLL_MIN(deadline_ms, gcoll_time_ms() + HANDSHAKE_MS));
        }
    }
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    if (rf.refused > rf.logged)
        GCOLL_WARN("refused %d connection(s) in all while waiting for %d peer(s)", rf.refused,
                   want);
    free(pend);
    return st;
}
