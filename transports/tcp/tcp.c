/* tcp.c: the TCP transport's data path: non-blocking sockets under epoll, several per
 * peer, tagged length-prefixed frames, large messages striped over the sockets. */
#include <errno.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transports/tcp/tcp_int.h"

#define ABORT_GRACE_MS 200

static void complete(gcoll_treq_t *req, gcoll_status_t st)
{
    if (req->done)
        return;
    req->status = st;
    req->done = 1;
}

/* Status for a peer that went away: after an abort notice its departure is part of
 * that abort (and keeps a mismatch a mismatch), otherwise the peer failed. */
static gcoll_status_t gone_status(const gcoll_transport_t *t)
{
    return t->abort_status < 0 ? t->abort_status : GCOLL_ERR_PEER;
}

/* Successful completions also count as progress for the abort grace period. */
static void complete_ok(gcoll_transport_t *t, gcoll_treq_t *req)
{
    t->completions++;
    complete(req, GCOLL_OK);
}

void gcoll_tcp_complete(void *ctx, gcoll_treq_t *req, gcoll_status_t st)
{
    if (st == GCOLL_OK)
        complete_ok(ctx, req);
    else
        complete(req, st);
}

/* Whether a message under assembly still sits in the peer's store (not yet claimed). */
static int msg_in_store(const rx_msg_t *m)
{
    return m->u && !m->req && !m->discard;
}

/* Unlinks a message under assembly and frees it, with its storage unless that is still
 * the store's. */
static void msg_free(tcp_peer_t *p, rx_msg_t *m)
{
    for (rx_msg_t **pp = &p->msgs; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    if (!msg_in_store(m))
        gcoll_match_unexp_free(&p->rx, m->u);
    free(m);
}

void gcoll_tcp_rx_free(gcoll_transport_t *t, tcp_peer_t *p)
{
    (void)t;
    while (p->msgs)
        msg_free(p, p->msgs);
    gcoll_match_peer_fini(&p->rx);
}

/* ---------------------------------------------------------------------------------- */
/* Peer failure                                                                         */

/* Fails everything pending with this peer; later posts to it fail at once. The messages
 * it sent whole stay for their receives (an orderly close follows the peer's last
 * message, whose receive may come later). */
static void peer_fail(gcoll_transport_t *t, int peer, gcoll_status_t st)
{
    tcp_peer_t *p = &t->peers[peer];
    if (p->rx.failed)
        return;
    for (rx_msg_t *m = p->msgs; m; m = m->next)
        if (m->req)
            complete(m->req, st);
    while (p->msgs)
        msg_free(p, p->msgs);
    gcoll_match_fail(&p->rx, st, GCOLL_MATCH_KEEP_WHOLE);
    for (int i = 0; i < t->nsocks; i++) {
        tcp_sock_t *s = &p->socks[i];
        for (tx_frame_t *f = s->txq; f; f = f->next)
            if (f->req)
                complete(f->req, st);
        sock_close(t, s);
    }
    p->nopen = 0;
}

/* Drops a socket's queued frames, failing their requests. A frame partly on the wire
 * keeps its place (the stream must stay framed for the abort notice behind it) but gets
 * its own copy of the payload, since the caller's buffer is about to go away. */
static void abandon_tx(gcoll_transport_t *t, tcp_sock_t *s, gcoll_status_t st)
{
    tx_frame_t *keep = (s->txq && s->txq->sent > 0) ? s->txq : NULL; /* only the head can be */
    if (keep && keep->req && keep->len) {
        uint8_t *copy = malloc(keep->len);
        if (!copy) {
            complete(keep->req, st);
            sock_close(t, s); /* cannot keep the stream framed: give the connection up */
            return;
        }
        memcpy(copy, keep->data, keep->len);
        keep->owned = copy;
        keep->data = copy;
    }
    while (s->txq) {
        tx_frame_t *f = s->txq;
        s->txq = f->next;
        if (f->req)
            complete(f->req, st);
        f->req = NULL;
        if (f != keep) {
            free(f->owned);
            free(f);
        }
    }
    s->txq = s->txq_tail = keep;
    if (keep)
        keep->next = NULL;
}

/* A peer announced an abort: fail every pending operation with st and refuse new ones,
 * but keep the connections open, so that this rank's own notice still reaches the others
 * (closing them would tell the others a different story: that this rank died). */
static void fail_pending_all(gcoll_transport_t *t, gcoll_status_t st)
{
    t->abort_status = st;
    t->abort_final = 1;
    for (int i = 0; i < t->size; i++) {
        tcp_peer_t *p = &t->peers[i];
        for (int k = 0; k < t->nsocks; k++) {
            tcp_sock_t *s = &p->socks[k];
            abandon_tx(t, s, st);
            if (s->msg && s->msg->req && !s->msg->u)
                s->dst = NULL; /* the rest of this frame is dropped */
        }
        gcoll_match_fail_posted(&p->rx, st);
        for (rx_msg_t *m = p->msgs; m; m = m->next) {
            if (m->req) {
                complete(m->req, st);
                m->req = NULL;
                m->discard = 1;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* Matching                                                                             */

static void finish_msg(gcoll_transport_t *t, tcp_peer_t *p, rx_msg_t *m)
{
    if (m->req) {
        if (m->u && !m->discard)
            memcpy(m->req->buf, m->u->data, m->len);
        m->req->nbytes = m->len;
        complete_ok(t, m->req);
    } else if (msg_in_store(m)) {
        m->u->whole = 1; /* stays in the store until a receive claims it */
        m->u->priv = NULL;
    }
    msg_free(p, m);
}

/* Finds or creates the message a frame belongs to. NULL with *st set on failure; NULL
 * with *st GCOLL_OK and *whole set when the tag's message already arrived whole and waits
 * in the store (more of it than its length, unless it is empty). */
static rx_msg_t *rx_msg_for(gcoll_transport_t *t, int peer, const gcoll_frame_t *f,
                            gcoll_status_t *st, int *whole)
{
    tcp_peer_t *p = &t->peers[peer];
    rx_msg_t *m = p->msgs;
    while (m && m->tag != f->tag)
        m = m->next;
    gcoll_unexp_t *w = m ? NULL : gcoll_match_find(&p->rx, f->tag);
    size_t len = m ? m->len : w ? w->len : 0;
    uint32_t sig = m ? m->sig : w ? w->sig : 0;
    if ((m || w) && (len != f->msg_len || sig != f->sig)) {
        set_error(t,
                  "malformed frame from rank %d: message length or signature changed "
                  "between frames of tag %llx",
                  peer, (unsigned long long)f->tag);
        *st = GCOLL_ERR_TRANSPORT;
        return NULL;
    }
    if (m)
        return m;
    if (w) {
        *whole = 1;
        return NULL;
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        *st = GCOLL_ERR_NOMEM;
        return NULL;
    }
    m->tag = f->tag;
    m->sig = f->sig;
    m->len = f->msg_len;
    gcoll_status_t mst;
    gcoll_treq_t *req = gcoll_match_arrived(&p->rx, m->tag, m->len, m->sig, &mst);
    if (mst != GCOLL_OK) {
        m->discard = 1; /* the receive has failed with the mismatch */
    } else if (req) {
        m->req = req;
    } else {
        m->u = gcoll_match_keep(&p->rx, m->tag, m->sig, m->len, m->len, NULL, 0);
        if (!m->u) {
            free(m);
            *st = GCOLL_ERR_NOMEM;
            return NULL;
        }
        m->u->priv = m;
    }
    m->next = p->msgs;
    p->msgs = m;
    return m;
}

/* ---------------------------------------------------------------------------------- */
/* Receive path                                                                         */

static void sock_eof(gcoll_transport_t *t, tcp_sock_t *s)
{
    tcp_peer_t *p = &t->peers[s->peer];
    sock_close(t, s);
    /* Data precedes the FIN on each socket, so the peer is gone only when all are shut. */
    if (--p->nopen > 0)
        return;
    int busy = p->rx.posted != NULL || p->msgs != NULL;
    for (int i = 0; i < t->nsocks && !busy; i++)
        busy = p->socks[i].txq != NULL;
    if (busy) {
        set_error(t,
                  "connection to rank %d closed with operations pending (rank %d exited "
                  "or died)",
                  s->peer, s->peer);
        GCOLL_WARN("%s", t->errmsg);
    } else {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "rank %d closed its connections", s->peer);
    }
    peer_fail(t, s->peer, gone_status(t));
}

static void proto_error(gcoll_transport_t *t, tcp_sock_t *s, const char *why)
{
    int peer = s->peer;
    set_error(t, "malformed frame from rank %d: %s; connection dropped", peer, why);
    GCOLL_WARN("malformed frame from rank %d: %s; connection dropped", peer, why);
    peer_fail(t, peer, GCOLL_ERR_TRANSPORT);
}

/* A complete header arrived: validate it and aim the payload. */
static int on_header(gcoll_transport_t *t, tcp_sock_t *s)
{
    const char *why = gcoll_frame_decode(s->hdr, &s->frame);
    if (why) {
        proto_error(t, s, why);
        return -1;
    }
    s->left = s->frame.frag_len;
    s->msg = NULL;
    s->dst = NULL;
    if (s->frame.type == GCOLL_FRAME_ABORT) {
        s->dst = s->ctl;
        return 0;
    }
    gcoll_status_t st = GCOLL_OK;
    int whole = 0;
    rx_msg_t *m = rx_msg_for(t, s->peer, &s->frame, &st, &whole);
    if (!m && !whole) {
        if (st == GCOLL_ERR_TRANSPORT)
            proto_error(t, s, "inconsistent fragments");
        else
            peer_fail(t, s->peer, st);
        return -1;
    }
    if (s->frame.frag_len > (m ? m->len - m->got : 0)) {
        proto_error(t, s, "fragments exceed the message length");
        return -1;
    }
    s->msg = m;
    if (!m)
        return 0; /* an empty message again: nothing to place */
    /* A message that began unexpected stays in its buffer until complete, even if its
     * receive is posted in between: finish_msg copies it out whole. */
    uint8_t *base = m->u ? m->u->data : m->req ? (uint8_t *)m->req->buf : NULL;
    if (!m->discard && base) /* no base: an empty message, nothing to place */
        s->dst = base + s->frame.frag_off;
    return 0;
}

static void on_payload_done(gcoll_transport_t *t, tcp_sock_t *s)
{
    if (s->frame.type == GCOLL_FRAME_ABORT) {
        s->ctl[s->frame.frag_len] = '\0';
        int mismatch = s->frame.frag_len > 0 && -(int)s->ctl[0] == GCOLL_ERR_MISMATCH;
        const char *why = s->frame.frag_len > 0 ? (char *)s->ctl + 1 : "";
        set_error(t, "rank %d aborted: %s", s->peer, why);
        GCOLL_WARN("rank %d aborted: %s", s->peer, why);
        if (t->abort_status == GCOLL_OK || mismatch)
            t->abort_status = mismatch ? GCOLL_ERR_MISMATCH : GCOLL_ERR_PEER;
        t->abort_quiet_since = gcoll_time_ms();
        return;
    }
    rx_msg_t *m = s->msg;
    if (!m)
        return;
    m->got += s->frame.frag_len;
    s->msg = NULL;
    if (m->got == m->len)
        finish_msg(t, &t->peers[s->peer], m);
}

/* Hands n bytes read into t->stage to the frame parser: header bytes, then payload bytes
 * (copied to their place or dropped), frame after frame. 0, or -1 if the socket was
 * closed on the way (a malformed header). */
static int consume_stage(gcoll_transport_t *t, tcp_sock_t *s, size_t n)
{
    const uint8_t *p = t->stage, *end = t->stage + n;
    while (p < end) {
        if (s->hdr_have < GCOLL_FRAME_HDR_LEN) {
            size_t k = GCOLL_MIN((size_t)(end - p), GCOLL_FRAME_HDR_LEN - s->hdr_have);
            memcpy(s->hdr + s->hdr_have, p, k);
            p += k;
            s->hdr_have += k;
            if (s->hdr_have < GCOLL_FRAME_HDR_LEN)
                break;
            if (on_header(t, s) != 0)
                return -1;
        } else {
            size_t k = GCOLL_MIN((size_t)(end - p), s->left);
            if (s->dst) {
                memcpy(s->dst, p, k);
                s->dst += k;
            }
            p += k;
            s->left -= k;
        }
        if (s->left == 0) {
            s->hdr_have = 0;
            on_payload_done(t, s);
        }
    }
    return s->open ? 0 : -1;
}

/* Reads until the socket is drained: a large payload straight into its place, anything
 * else through the stage. A read shorter than asked means the socket is empty for now
 * (epoll is level-triggered and reports whatever comes next), so no call is spent on
 * learning EAGAIN; unless the peer has hung up (to_end), when reading on to the end of
 * the stream notices its departure in this same call. */
static void handle_read(gcoll_transport_t *t, tcp_sock_t *s, int to_end)
{
    while (s->open) {
        ssize_t n;
        size_t want;
        int staged = s->hdr_have < GCOLL_FRAME_HDR_LEN || s->left < GCOLL_TCP_STAGE;
        if (staged) {
            want = GCOLL_TCP_STAGE;
            n = recv(s->fd, t->stage, want, MSG_DONTWAIT);
            if (n > 0 && consume_stage(t, s, (size_t)n) != 0)
                return;
        } else {
            uint8_t *dst = s->dst ? s->dst : t->scratch;
            want = s->dst ? s->left : GCOLL_MIN(s->left, sizeof(t->scratch));
            n = recv(s->fd, dst, want, MSG_DONTWAIT);
            if (n > 0) {
                if (s->dst)
                    s->dst += n;
                s->left -= (size_t)n;
                if (s->left == 0) {
                    s->hdr_have = 0;
                    on_payload_done(t, s);
                }
            }
        }
        if (n > 0) {
            if ((size_t)n < want && !to_end)
                return;
            continue;
        }
        if (n == 0 && s->hdr_have == 0) {
            sock_eof(t, s);
            return;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        /* A reset, or the end inside a frame: a rank killed in the middle of a send
         * (SIGKILL, out of memory), not a malformed stream. */
        int peer = s->peer, err = n == 0 ? 0 : errno;
        tcp_peer_t *p = &t->peers[peer];
        if (!p->draining) {
            /* A rank that exits right after failing resets its connections; what it sent
             * before is still readable on the others, its abort notice among them (on
             * the first socket): read that first, so a mismatch stays a mismatch. */
            p->draining = 1;
            for (int k = 0; k < t->nsocks && !p->rx.failed; k++)
                if (&p->socks[k] != s && p->socks[k].open)
                    handle_read(t, &p->socks[k], 1);
            p->draining = 0;
            if (p->rx.failed)
                return;
        }
        const char *how = err ? strerror(err) : "closed in the middle of a message";
        /* ETIMEDOUT: keepalive probes went unanswered (tcp_setup.c) */
        const char *who =
            err == ETIMEDOUT ? "exited or died, or its host is unreachable" : "exited or died";
        set_error(t, "connection to rank %d failed: %s (rank %d %s)", peer, how, peer, who);
        GCOLL_WARN("connection to rank %d failed: %s (rank %d %s)", peer, how, peer, who);
        peer_fail(t, peer, gone_status(t));
        return;
    }
}

/* ---------------------------------------------------------------------------------- */
/* Send path                                                                            */

static void set_want_out(gcoll_transport_t *t, tcp_sock_t *s, int want)
{
    if (s->want_out == want || s->fd < 0)
        return;
    struct epoll_event ev = {.events = GCOLL_TCP_EV_IN | (want ? EPOLLOUT : 0), .data.ptr = s};
    epoll_ctl(t->epfd, EPOLL_CTL_MOD, s->fd, &ev);
    s->want_out = want;
}

/* Writes queued frames, several per sendmsg, until the socket would block. */
static void flush(gcoll_transport_t *t, tcp_sock_t *s)
{
    while (s->txq && s->open) {
        struct iovec iov[64];
        int niov = 0;
        for (tx_frame_t *f = s->txq; f && niov < 62; f = f->next) {
            size_t off = f->sent;
            if (off < GCOLL_FRAME_HDR_LEN) {
                iov[niov++] = (struct iovec){f->hdr + off, GCOLL_FRAME_HDR_LEN - off};
                off = GCOLL_FRAME_HDR_LEN;
            }
            size_t poff = off - GCOLL_FRAME_HDR_LEN;
            if (poff < f->len)
                iov[niov++] = (struct iovec){(void *)(f->data + poff), f->len - poff};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_want_out(t, s, 1);
                return;
            }
            int peer = s->peer;
            set_error(t, "send to rank %d failed: %s", peer, strerror(errno));
            GCOLL_WARN("send to rank %d failed: %s", peer, strerror(errno));
            peer_fail(t, peer, gone_status(t));
            return;
        }
        size_t done = (size_t)n;
        while (s->txq) {
            tx_frame_t *f = s->txq;
            size_t rem = GCOLL_FRAME_HDR_LEN + f->len - f->sent;
            if (done < rem) {
                f->sent += done;
                break;
            }
            done -= rem;
            s->txq = f->next;
            if (f->req && --f->req->pending == 0)
                complete_ok(t, f->req);
            free(f->owned);
            free(f);
        }
        if (!s->txq)
            s->txq_tail = NULL;
    }
    set_want_out(t, s, 0);
}

static void enqueue(tcp_sock_t *s, tx_frame_t *f)
{
    f->next = NULL;
    if (s->txq_tail)
        s->txq_tail->next = f;
    else
        s->txq = f;
    s->txq_tail = f;
}

static tx_frame_t *new_frame(int type, gcoll_treq_t *req, uint64_t tag, uint32_t sig,
                             size_t msg_len, size_t off, const void *data, size_t len)
{
    tx_frame_t *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    gcoll_frame_t fr = {
        .type = type, .sig = sig, .tag = tag, .msg_len = msg_len, .frag_off = off, .frag_len = len};
    gcoll_frame_encode(&fr, f->hdr);
    f->req = req;
    f->data = data;
    f->len = len;
    return f;
}

/* Whether a message from this local peer of GCOLL_TCP_LOCAL_BIG bytes or more is expected or
 * arriving. Looks at the first few posted receives only: enough for the calls that
 * exchange, bounded for a rank that posted many small ones. */
static int big_incoming(const tcp_peer_t *p)
{
    int n = 0;
    for (const gcoll_treq_t *r = p->rx.posted; r && n < 16; r = r->next, n++)
        if (r->len >= GCOLL_TCP_LOCAL_BIG)
            return 1;
    for (const rx_msg_t *m = p->msgs; m; m = m->next)
        if (m->len >= GCOLL_TCP_LOCAL_BIG)
            return 1;
    return 0;
}

/* The send buffer of a socket to a local peer for a message of len bytes (tcp_int.h):
 * GCOLL_TCP_LOCAL_BOTHWAYS for a big one once big messages have gone both ways with that
 * peer at once (exchange), else GCOLL_TCP_LOCAL_ONEWAY. That memory stays: a sendrecv posts
 * its send before its receive, and going back to the larger buffer at each send made the
 * first megabyte of every exchange go with it (2 ranks, sendrecv of 16 MiB: 12% slower). A
 * smaller value only holds back later writes, so it may change with bytes queued. */
static void local_sndbuf(tcp_peer_t *p, tcp_sock_t *s, size_t len, int exchange)
{
    p->bothways |= exchange;
    int b = p->bothways && len >= GCOLL_TCP_LOCAL_BIG ? GCOLL_TCP_LOCAL_BOTHWAYS
                                                      : GCOLL_TCP_LOCAL_ONEWAY;
    if (s->sndbuf && s->sndbuf != b && s->open)
        gcoll_tcp_set_sndbuf(s, b);
}

/* Sends to oneself never touch a socket: deliver straight into the receive side. */
static gcoll_status_t send_self(gcoll_transport_t *t, gcoll_treq_t *req)
{
    gcoll_frame_t f = {.type = GCOLL_FRAME_DATA,
                       .sig = req->sig,
                       .tag = req->tag,
                       .msg_len = req->len,
                       .frag_off = 0,
                       .frag_len = req->len};
    gcoll_status_t st = GCOLL_OK;
    int whole = 0;
    rx_msg_t *m = rx_msg_for(t, t->rank, &f, &st, &whole);
    if (!m && !whole)
        return st == GCOLL_ERR_TRANSPORT ? GCOLL_ERR_INVALID : st;
    if (m) { /* else the same message waits unexpected already */
        if (!m->discard && req->len)
            memcpy(m->req ? m->req->buf : m->u->data, req->buf, req->len);
        m->got = m->len;
        finish_msg(t, &t->peers[t->rank], m);
    }
    complete_ok(t, req);
    return GCOLL_OK;
}

gcoll_status_t gcoll_tcp_isend(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->peer < 0 || req->peer >= t->size || (req->len && !req->buf))
        return GCOLL_ERR_INVALID;
    req->done = 0;
    req->status = GCOLL_INPROGRESS;
    if (t->abort_final) {
        complete(req, t->abort_status);
        return GCOLL_OK;
    }
    if (req->peer == t->rank)
        return send_self(t, req);
    tcp_peer_t *p = &t->peers[req->peer];
    if (p->rx.failed) {
        complete(req, p->rx.status);
        return GCOLL_OK;
    }
    /* Striping runs several flows over a network path; to a peer on this host there is no
     * link to fill, and two sockets carrying both directions of one exchange cost more
     * than one socket per message (docs/results/ompi-compare.md: sendrecv of 4-16 MiB
     * on 2 ranks 1.3-1.5x faster unstriped). */
    int nfrag = (req->len >= t->stripe_min && t->nsocks > 1 && !p->local) ? t->nsocks : 1;
    size_t base = req->len / (size_t)nfrag, extra = req->len % (size_t)nfrag, off = 0;
    req->pending = (size_t)nfrag;
    for (int i = 0; i < nfrag; i++) {
        size_t len = base + ((size_t)i < extra);
        tx_frame_t *f = new_frame(GCOLL_FRAME_DATA, req, req->tag, req->sig, req->len, off,
                                  (const uint8_t *)req->buf + off, len);
        if (!f) {
            peer_fail(t, req->peer, GCOLL_ERR_NOMEM);
            return GCOLL_ERR_NOMEM;
        }
        off += len;
        tcp_sock_t *s = &p->socks[nfrag > 1 ? i : (int)(p->rr++ % (unsigned)t->nsocks)];
        if (p->local && len >= GCOLL_TCP_LOCAL_MIN)
            local_sndbuf(p, s, len, len >= GCOLL_TCP_LOCAL_BIG && big_incoming(p));
        enqueue(s, f);
        flush(t, s);
        if (p->rx.failed)
            break;
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_tcp_irecv(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->peer < 0 || req->peer >= t->size || (req->len && !req->buf))
        return GCOLL_ERR_INVALID;
    req->done = 0;
    req->status = GCOLL_INPROGRESS;
    req->nbytes = 0;
    if (t->abort_final) {
        complete(req, t->abort_status);
        return GCOLL_OK;
    }
    tcp_peer_t *p = &t->peers[req->peer];
    if (p->local && req->len >= GCOLL_TCP_LOCAL_BIG) /* a big send already on its way? */
        for (int i = 0; i < t->nsocks; i++)
            if (p->socks[i].txq && p->socks[i].txq->len >= GCOLL_TCP_LOCAL_BIG)
                local_sndbuf(p, &p->socks[i], p->socks[i].txq->len, 1);
    gcoll_status_t st;
    gcoll_unexp_t *u = gcoll_match_claim(&p->rx, req, &st);
    if (!u) {
        gcoll_match_post(&p->rx, req);
        return GCOLL_OK;
    }
    rx_msg_t *m = u->priv; /* still arriving: the message takes the entry over */
    if (m) {
        if (st != GCOLL_OK)
            m->discard = 1;
        else
            m->req = req;
        return GCOLL_OK;
    }
    if (st == GCOLL_OK)
        gcoll_match_land(&p->rx, req, u->data, u->len);
    gcoll_match_unexp_free(&p->rx, u);
    return GCOLL_OK;
}

void gcoll_tcp_cancel(gcoll_transport_t *t, gcoll_treq_t *req)
{
    if (req->done || req->peer < 0 || req->peer >= t->size)
        return;
    if (gcoll_match_cancel(&t->peers[req->peer].rx, req))
        return;
    /* Partly received or partly sent: the byte stream cannot be resynchronised, so the
     * peer connection is given up (the communicator is broken at this point anyway). */
    peer_fail(t, req->peer, GCOLL_ERR_ABORTED);
}

gcoll_status_t gcoll_tcp_peek(gcoll_transport_t *t, const uint64_t *tags, int *peer_p)
{
    gcoll_match_peek_t pk;
    gcoll_match_peek_init(&pk);
    /* past the abort grace every receive fails with the abort's status (gcoll_tcp_irecv) */
    gcoll_status_t down = t->abort_final ? t->abort_status : GCOLL_OK;
    for (int i = 0; i < t->size; i++)
        gcoll_match_peek_add(&pk, &t->peers[i].rx, tags[i], down);
    return gcoll_match_peek_result(&pk, peer_p);
}

gcoll_status_t gcoll_tcp_progress(gcoll_transport_t *t, int timeout_ms)
{
    struct epoll_event ev[64];
    int n = epoll_wait(t->epfd, ev, 64, timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return GCOLL_OK;
        set_error(t, "epoll_wait: %s", strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    uint64_t before = t->completions;
    for (int i = 0; i < n; i++) {
        tcp_sock_t *s = ev[i].data.ptr;
        if (s == NULL) /* the wake fd */
            continue;
        if (s->open && (ev[i].events & EPOLLOUT))
            flush(t, s);
        if (s->open && (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
            handle_read(t, s, (ev[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) != 0);
    }
    if (t->abort_status < 0 && !t->abort_final) {
        uint64_t now = gcoll_time_ms();
        if (t->completions != before)
            t->abort_quiet_since = now;
        else if (now - t->abort_quiet_since >= ABORT_GRACE_MS)
            fail_pending_all(t, t->abort_status);
    }
    return GCOLL_OK;
}

void gcoll_tcp_abort(gcoll_transport_t *t, gcoll_status_t status, const char *reason)
{
    size_t len = GCOLL_MIN(strlen(reason) + 1, (size_t)GCOLL_FRAME_MAX_CTL);
    uint64_t deadline = gcoll_time_ms() + 1000;
    for (int peer = 0; peer < t->size; peer++) {
        tcp_peer_t *p = &t->peers[peer];
        if (peer == t->rank || p->rx.failed || !p->socks[0].open)
            continue;
        /* Whatever is half-sent stays in front, so the abort frame starts on a boundary. */
        tx_frame_t *f = new_frame(GCOLL_FRAME_ABORT, NULL, 0, 0, len, 0, NULL, len);
        if (!f || !(f->owned = malloc(len + 1))) {
            free(f);
            continue;
        }
        f->owned[0] = (uint8_t)(-(int)status); /* first byte: the status, negated */
        memcpy(f->owned + 1, reason, len - 1);
        f->data = f->owned;
        enqueue(&p->socks[0], f);
        flush(t, &p->socks[0]);
    }
    /* Bounded drain so the abort reaches peers whose sockets were full: out of our queue,
     * and out of the kernel's too (acknowledged by the peer). A rank that exits right
     * after failing closes sockets with bytes unread, so the kernel resets them and drops
     * what it still holds to send: an abort stuck there behind a large message (400 KB
     * alltoalls on 4 ranks) never arrived, and that peer reported a failed peer instead of
     * the mismatch. Meanwhile progress keeps reading, so the peer's sends drain too. */
    for (;;) {
        int pending = 0;
        for (int peer = 0; peer < t->size && !pending; peer++) {
            tcp_sock_t *s = &t->peers[peer].socks[0];
            if (peer == t->rank || t->peers[peer].rx.failed || !s->open)
                continue;
            int outq = 0;
            pending = s->txq != NULL || (ioctl(s->fd, SIOCOUTQ, &outq) == 0 && outq > 0);
        }
        if (!pending || gcoll_time_ms() >= deadline)
            break;
        gcoll_tcp_progress(t, 1);
    }
}
