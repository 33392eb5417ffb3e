/* output.c: gcoll-run's output relay: rank-prefixed lines of the ranks, and its own notes. */
#include "run.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Returns 0 or an errno value. Copes with a stdout someone else left non-blocking. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            (void)poll(&pfd, 1, -1);
        } else if (!(w < 0 && errno == EINTR)) {
            return w < 0 ? errno : EIO;
        }
    }
    return 0;
}

void grun_outbuf_flush(struct job *j, int dest)
{
    struct outbuf *ob = &j->out[dest];
    if (ob->len == 0 || ob->broken) {
        ob->len = 0;
        return;
    }
    int err = write_all(ob->fd, ob->data, ob->len);
    ob->len = 0;
    if (err == 0)
        return;
    ob->broken = true;
    if (dest != 0)
        return; /* nowhere left to complain about stderr */
    /* Behave like a process in a pipeline whose reader went away, but take the ranks along. */
    grun_note(j, "cannot write to stdout: %s; stopping the job", strerror(err));
    if (!j->abort_code)
        j->abort_code = err == EPIPE ? 128 + SIGPIPE : GRUN_EXIT_INTERNAL;
    if (j->phase == PHASE_RUNNING)
        grun_begin_termination(j);
}

/* Messages from gcoll-run itself; flushing first keeps them after the rank output they follow. */
void grun_note(struct job *j, const char *fmt, ...)
{
    char msg[GRUN_NOTE_MAX];
    size_t n = (size_t)snprintf(msg, sizeof msg, "gcoll-run: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg + n, sizeof msg - n - 1, fmt, ap);
    va_end(ap);
    if (m > 0)
        n += (size_t)m < sizeof msg - n - 1 ? (size_t)m : sizeof msg - n - 2;
    msg[n++] = '\n';
    if (j) {
        grun_outbuf_flush(j, 0);
        grun_outbuf_flush(j, 1);
    }
    (void)write_all(STDERR_FILENO, msg, n);
}

static void emit_line(struct job *j, int r, struct stream *s, const char *a, size_t alen,
                      const char *b, size_t blen)
{
    struct outbuf *ob = &j->out[s->dest];
    char prefix[16];
    size_t plen = j->o->quiet ? 0 : (size_t)snprintf(prefix, sizeof prefix, "[%d] ", r);
    if (ob->broken)
        return;
    if (ob->len + plen + alen + blen + 1 > sizeof ob->data)
        grun_outbuf_flush(j, s->dest);
    memcpy(ob->data + ob->len, prefix, plen);
    ob->len += plen;
    if (alen)
        memcpy(ob->data + ob->len, a, alen);
    ob->len += alen;
    if (blen)
        memcpy(ob->data + ob->len, b, blen);
    ob->len += blen;
    ob->data[ob->len++] = '\n';
}

/* Splits new data into lines; a line reaching GRUN_LINE_MAX is emitted as it stands. */
static bool stream_feed(struct job *j, int r, struct stream *s, const char *p, size_t n)
{
    while (n > 0) {
        /* A line of exactly GRUN_LINE_MAX bytes must not be followed by an empty one. */
        if (s->split) {
            s->split = false;
            if (*p == '\n') {
                p++;
                n--;
                continue;
            }
        }
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        size_t room = GRUN_LINE_MAX - s->len;
        if (take >= room) {
            emit_line(j, r, s, s->buf, s->len, p, room);
            s->len = 0;
            s->split = true;
            p += room;
            n -= room;
        } else if (nl) {
            emit_line(j, r, s, s->buf, s->len, p, take);
            s->len = 0;
            p += take + 1;
            n -= take + 1;
        } else {
            if (s->len + n > s->cap) {
                size_t cap = s->cap ? s->cap : 256;
                while (cap < s->len + n)
                    cap *= 2;
                char *nb = realloc(s->buf, cap);
                if (!nb)
                    return false;
                s->buf = nb;
                s->cap = cap;
            }
            memcpy(s->buf + s->len, p, n);
            s->len += n;
            n = 0;
        }
    }
    return true;
}

void grun_stream_close(struct job *j, int r, struct stream *s)
{
    if (s->len)
        emit_line(j, r, s, s->buf, s->len, NULL, 0);
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    close(s->fd);
    s->fd = -1;
}

/* Returns true if a further read may find more data right away. */
bool grun_stream_read(struct job *j, int r, struct stream *s)
{
    ssize_t n = read(s->fd, j->scratch, sizeof j->scratch);
    if (n > 0) {
        if (stream_feed(j, r, s, j->scratch, (size_t)n))
            return true;
        grun_note(j, "out of memory buffering output of rank %d; dropping it", r);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return false;
    }
    grun_stream_close(j, r, s);
    return false;
}
