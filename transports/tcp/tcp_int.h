/* tcp_int.h: state shared by the TCP transport's files (tcp.c data path, tcp_setup.c life
 * cycle). Internal to the files of transports/tcp/. */
#ifndef GCOLL_TCP_INT_H
#define GCOLL_TCP_INT_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/match.h"
#include "transports/tcp/tcp.h"
#include "transports/tcp/tcp_frame.h"
#include "transports/transport.h"
#include "base/util.h"

/* Events every data socket is watched for: EPOLLRDHUP tells handle_read that the peer has
 * closed, so it reads on to the end of the stream instead of stopping at a short read. */
#define GCOLL_TCP_EV_IN (EPOLLIN | EPOLLRDHUP)

/* Bytes read at once while a header, or a payload shorter than this, is expected. */
#define GCOLL_TCP_STAGE 4096

/* SO_SNDBUF of a socket to a peer on this host (the kernel doubles it for its own
 * bookkeeping). A send there is a copy into the kernel that the receiver copies out on
 * another core: with Linux's autotuned buffer (up to tcp_wmem's 4 MiB) the sender ran
 * megabytes ahead and the receiver read them back from memory, so the buffer is set:
 * ONEWAY, and BOTHWAYS for messages of BIG bytes or more once such messages have gone both
 * ways between the two ranks at once (tcp.c's local_sndbuf). Messages under MIN fit either
 * way and leave it as it is. 2 ranks over loopback, medians of 8-30 alternated runs,
 * against 256 KiB everywhere before: scatter of 4 and 16 MiB 4% and 12% faster, reduce of
 * 1 MiB 8%, sendrecv of 1 MiB 10%; sendrecv of 4 MiB the same either way, of 16 MiB 12-25%
 * slower with 512 KiB (hence BOTHWAYS). Autotuned, sendrecv of 4, 16, 64 MiB ran at 2.4,
 * 1.9, 1.9 GB/s against 3.1, 3.0, 3.6 with 256 KiB. Not for remote peers: a link's
 * bandwidth-delay product may need more. */
#define GCOLL_TCP_LOCAL_ONEWAY (512 << 10)
#define GCOLL_TCP_LOCAL_BOTHWAYS (256 << 10)
#define GCOLL_TCP_LOCAL_BIG ((size_t)4 << 20)
#define GCOLL_TCP_LOCAL_MIN ((size_t)64 << 10)

typedef struct tx_frame {
    struct tx_frame *next;
    gcoll_treq_t *req; /* NULL for control frames */
    uint8_t hdr[GCOLL_FRAME_HDR_LEN];
    const uint8_t *data;
    size_t len;     /* payload bytes */
    size_t sent;    /* header + payload bytes sent so far */
    uint8_t *owned; /* payload owned by the frame (control frames) */
} tx_frame_t;

/* An incoming message being assembled from its frames. One that began unexpected is
 * assembled in its entry of the peer's store (u), which stays there until a receive claims
 * it (req set) or refuses it (discard set); from then on the entry is the message's. */
typedef struct rx_msg {
    struct rx_msg *next;
    uint64_t tag;
    uint32_t sig;
    size_t len;
    size_t got;
    gcoll_treq_t *req; /* matched receive, NULL while unexpected */
    gcoll_unexp_t *u;  /* storage of a message that began unexpected */
    int discard;       /* a mismatch was reported: drop the payload */
} rx_msg_t;

typedef struct {
    int fd;
    int peer;
    int open;
    tx_frame_t *txq, *txq_tail;
    int want_out;
    int sndbuf; /* SO_SNDBUF set on a socket to a local peer; 0: the kernel's */
    /* receive state: header, then payload of one frame */
    uint8_t hdr[GCOLL_FRAME_HDR_LEN];
    size_t hdr_have;
    gcoll_frame_t frame;
    rx_msg_t *msg;
    uint8_t *dst; /* NULL: discard */
    size_t left;
    uint8_t ctl[GCOLL_FRAME_MAX_CTL + 1]; /* abort reason */
} tcp_sock_t;

/* Sets a socket's SO_SNDBUF and records it (tcp_sock_t.sndbuf) when the kernel took it. */
static inline void gcoll_tcp_set_sndbuf(tcp_sock_t *s, int b)
{
    if (setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b)) == 0)
        s->sndbuf = b;
}

typedef struct {
    tcp_sock_t *socks;
    int nopen;
    int draining;          /* reading its other sockets after one was reset (tcp.c handle_read) */
    unsigned rr;           /* round-robin socket for unstriped messages */
    int local;             /* at this rank's own address: on this host, messages go unstriped */
    int bothways;          /* big messages went both ways at once (tcp.c's local_sndbuf) */
    rx_msg_t *msgs;        /* being assembled */
    gcoll_match_peer_t rx; /* posted receives, unexpected messages, failure */
} tcp_peer_t;

struct gcoll_transport {
    int rank, size, nsocks;
    size_t stripe_min;
    gcoll_key_t key;
    int listen_fd;
    int epfd;
    int wake_fd;
    char addr[128];
    tcp_peer_t *peers;
    gcoll_match_t match;
    /* A peer announced an abort. Its notice can overtake data it sent earlier on another
     * socket, so pending operations are failed only after a grace period without any
     * completion (ABORT_GRACE_MS): whatever was in flight still lands. */
    gcoll_status_t abort_status;
    uint64_t abort_quiet_since; /* last abort notice or completion, ms */
    int abort_final;            /* grace over: everything pending has failed */
    uint64_t completions;       /* requests completed successfully */
    char errmsg[512];
    uint8_t scratch[65536]; /* sink for discarded payload */
    /* Headers and small payloads are read GCOLL_TCP_STAGE bytes at a time into stage and
     * copied out, so that a small message costs one recv, not one for its header and one
     * for its payload; handle_read empties it before it returns. */
    uint8_t stage[GCOLL_TCP_STAGE];
};

/* Records the first error worth reporting; later ones only go to the log. */
static inline void set_error(gcoll_transport_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void set_error(gcoll_transport_t *t, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (t->errmsg[0] == '\0')
        snprintf(t->errmsg, sizeof(t->errmsg), "%s", msg);
}

/* Closes one socket and drops its queued frames (their requests are the caller's). */
static inline void sock_close(gcoll_transport_t *t, tcp_sock_t *s)
{
    if (s->fd >= 0) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        close(s->fd);
        s->fd = -1;
    }
    s->open = 0;
    while (s->txq) {
        tx_frame_t *f = s->txq;
        s->txq = f->next;
        free(f->owned);
        free(f);
    }
    s->txq_tail = NULL;
}

/* The data path (tcp.c), called through the ops table in tcp_setup.c. */
/* The completion hook of t->match (ctx: the transport). */
void gcoll_tcp_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st);
/* Frees a peer's messages under assembly and its store (destroy). */
void gcoll_tcp_rx_free(gcoll_transport_t *t, tcp_peer_t *p);
gcoll_status_t gcoll_tcp_isend(gcoll_transport_t *t, gcoll_treq_t *req);
gcoll_status_t gcoll_tcp_irecv(gcoll_transport_t *t, gcoll_treq_t *req);
gcoll_status_t gcoll_tcp_progress(gcoll_transport_t *t, int timeout_ms);
void gcoll_tcp_cancel(gcoll_transport_t *t, gcoll_treq_t *req);
gcoll_status_t gcoll_tcp_peek(gcoll_transport_t *t, const uint64_t *tags, int *peer_p);
void gcoll_tcp_abort(gcoll_transport_t *t, gcoll_status_t status, const char *reason);

#endif /* GCOLL_TCP_INT_H */
