/* auth.h: mutual HMAC-SHA256 challenge-response on a fresh TCP connection, so that only
 * holders of the job key join a job; the server side never blocks. */
#ifndef GCOLL_AUTH_H
#define GCOLL_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gcoll.h"

#define GCOLL_AUTH_MAX_PAYLOAD 64
#define GCOLL_AUTH_NONCE 16
#define GCOLL_AUTH_MAC 32

typedef struct {
    const uint8_t *key;
    size_t keylen;
} gcoll_key_t;

/* Client side: runs the handshake on a connected socket (blocking or not; this polls),
 * sending payload (at most GCOLL_AUTH_MAX_PAYLOAD bytes) authenticated. Fails by
 * deadline_ms with a message in err. */
gcoll_status_t gcoll_auth_client(int fd, const gcoll_key_t *key, const void *payload, size_t plen,
                                 uint64_t deadline_ms, char *err, size_t errlen);

/* Server side, one instance per accepted connection, driven by poll readiness. */
typedef struct {
    int fd;
    int state;
    uint64_t start_ms, deadline_ms;
    uint8_t nonce[GCOLL_AUTH_NONCE];
    uint8_t buf[4 + GCOLL_AUTH_NONCE + 2 + GCOLL_AUTH_MAX_PAYLOAD + GCOLL_AUTH_MAC];
    size_t have;
    uint8_t payload[GCOLL_AUTH_MAX_PAYLOAD];
    size_t plen;
    char peer[64]; /* printable address for log lines */
} gcoll_auth_server_t;

/* Takes ownership of fd (made non-blocking) and sends the challenge. */
void gcoll_auth_server_start(gcoll_auth_server_t *s, int fd, uint64_t deadline_ms);
/* Advances on readability: 1 = authenticated (payload valid), 0 = in progress,
 * -1 = refused (reason in err; fd closed). Also call on timeout (deadline checked). */
int gcoll_auth_server_step(gcoll_auth_server_t *s, const gcoll_key_t *key, char *err,
                           size_t errlen);

/* Accepts connections on a listening socket and authenticates them concurrently: a silent,
 * garbage-sending or wrong-key client is dropped and logged without stalling the others.
 * Returns once want authenticated connections have been handed to on_peer (which returns
 * 0 to keep the connection, -1 to drop it as invalid), or by deadline_ms. */
typedef int (*gcoll_accept_cb_t)(void *arg, int fd, const void *payload, size_t plen,
                                 const char *peer);
gcoll_status_t gcoll_auth_accept(int listen_fd, const gcoll_key_t *key, int want,
                                 gcoll_accept_cb_t on_peer, void *arg, uint64_t deadline_ms,
                                 char *err, size_t errlen);
/* The same, calling tick(arg) at least every 100 ms while it waits (progress notes). */
gcoll_status_t gcoll_auth_accept_tick(int listen_fd, const gcoll_key_t *key, int want,
                                      gcoll_accept_cb_t on_peer, void (*tick)(void *arg), void *arg,
                                      uint64_t deadline_ms, char *err, size_t errlen);

/* Printable "ip:port" of a socket address. */
void gcoll_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len);

/* Blocking-with-deadline helpers on a socket (poll-based). */
gcoll_status_t gcoll_sock_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ms);
gcoll_status_t gcoll_sock_read_all(int fd, void *buf, size_t len, uint64_t deadline_ms);
/* connect() that gives up at deadline_ms (GCOLL_ERR_TIMEOUT) instead of the kernel's SYN
 * retries (about two minutes); other failures return GCOLL_ERR_TRANSPORT with errno set. */
gcoll_status_t gcoll_sock_connect(int fd, const struct sockaddr *sa, socklen_t len,
                                  uint64_t deadline_ms);

#endif /* GCOLL_AUTH_H */
