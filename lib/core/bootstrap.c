/* bootstrap.c: the rendezvous (in the manner of NCCL's bootstrap and torch's TCPStore):
 * authenticated connections to rank 0, one round of address exchange, agreement checks. */
#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/config.h"
#include "base/util.h"

#define HELLO_MAGIC 0x31424347u /* "GCB1" */
#define REPLY_MAGIC 0x32424347u /* "GCB2" */

struct gcoll_bootstrap {
    int rank, size;
    gcoll_key_t key;
    int fd;       /* rank > 0: connection to the root; rank 0: listener */
    int *peer_fd; /* rank 0: connection from each rank */
    char local_ip[INET6_ADDRSTRLEN];
    char root[80];         /* rank 0: printable GCOLL_ROOT address, for progress notes */
    uint64_t next_note_ms; /* rank 0: when the next "still waiting" note is due */
};

static int resolve_root(const char *root, struct addrinfo **res, char *err, size_t errlen)
{
    char host[256], port[16];
    if (gcoll_split_hostport(root, host, sizeof(host), port, sizeof(port)) != 0) {
        snprintf(err, errlen, "GCOLL_ROOT='%s' is not host:port", root);
        return -1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
    int rc = getaddrinfo(host, port, &hints, res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve GCOLL_ROOT host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    return 0;
}

static void sockaddr_ip(const struct sockaddr *sa, char *buf, size_t len)
{
    if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)len);
    else
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)len);
}

static gcoll_status_t open_root(gcoll_bootstrap_t *bs, const struct addrinfo *ai, char *err,
                                size_t errlen)
{
    int one = 1;
    bs->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bs->fd < 0 || setsockopt(bs->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(bs->fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(bs->fd, 1024) != 0) {
        char a[80];
        gcoll_sockaddr_str(ai->ai_addr, a, sizeof(a));
        snprintf(err, errlen, "rank 0 cannot listen at GCOLL_ROOT %s: %s", a, strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    sockaddr_ip(ai->ai_addr, bs->local_ip, sizeof(bs->local_ip));
    gcoll_sockaddr_str(ai->ai_addr, bs->root, sizeof(bs->root));
    if (strcmp(bs->local_ip, "0.0.0.0") == 0)
        snprintf(bs->local_ip, sizeof(bs->local_ip), "127.0.0.1");
    else if (strcmp(bs->local_ip, "::") == 0)
        snprintf(bs->local_ip, sizeof(bs->local_ip), "::1");
    bs->peer_fd = malloc((size_t)bs->size * sizeof(int));
    if (!bs->peer_fd)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < bs->size; i++)
        bs->peer_fd[i] = -1;
    return GCOLL_OK;
}

static gcoll_status_t open_client(gcoll_bootstrap_t *bs, const struct addrinfo *ai,
                                  uint64_t deadline_ms, char *err, size_t errlen)
{
    char a[80];
    gcoll_sockaddr_str(ai->ai_addr, a, sizeof(a));
    /* Silence for the whole deadline helps nobody: after 5 s, and every 5 s on, say what
     * is awaited and why ("Connection refused": nothing listens on that port). */
    uint64_t next_note = gcoll_time_ms() + 5000;
    for (;;) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(err, errlen, "socket: %s", strerror(errno));
            return GCOLL_ERR_TRANSPORT;
        }
        if (gcoll_sock_connect(fd, ai->ai_addr, ai->ai_addrlen, deadline_ms) == GCOLL_OK) {
            uint8_t id[8];
            gcoll_put_u32(id, (uint32_t)bs->rank);
            gcoll_put_u32(id + 4, (uint32_t)bs->size);
            char why[256];
            gcoll_status_t st =
                gcoll_auth_client(fd, &bs->key, id, sizeof(id), deadline_ms, why, sizeof(why));
            if (st != GCOLL_OK) {
                close(fd);
                snprintf(err, errlen, "rendezvous at %s: %s", a, why);
                return st;
            }
            struct sockaddr_storage ss;
            socklen_t sl = sizeof(ss);
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            sockaddr_ip((struct sockaddr *)&ss, bs->local_ip, sizeof(bs->local_ip));
            bs->fd = fd;
            return GCOLL_OK;
        }
        int e = errno;
        close(fd);
        if (gcoll_time_ms() >= deadline_ms) {
            snprintf(err, errlen,
                     "cannot reach the rendezvous at GCOLL_ROOT %s: %s "
                     "(is rank 0 running?)",
                     a, strerror(e));
            return GCOLL_ERR_TIMEOUT;
        }
        if (gcoll_time_ms() >= next_note) {
            GCOLL_WARN("rank %d: still waiting for rank 0 at GCOLL_ROOT %s: %s (is rank 0 running, "
                       "with the same GCOLL_ROOT?)",
                       bs->rank, a, e == ECONNREFUSED ? "connection refused" : strerror(e));
            next_note = gcoll_time_ms() + 5000;
        }
        usleep(50000);
    }
}

gcoll_status_t gcoll_bootstrap_open(int rank, int size, const char *root, const gcoll_key_t *key,
                                    uint64_t deadline_ms, gcoll_bootstrap_t **bs_p, char *err,
                                    size_t errlen)
{
    gcoll_bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (!bs)
        return GCOLL_ERR_NOMEM;
    bs->rank = rank;
    bs->size = size;
    bs->key = *key;
    bs->fd = -1;
    struct addrinfo *res = NULL;
    gcoll_status_t st = GCOLL_ERR_INVALID;
    if (resolve_root(root, &res, err, errlen) != 0)
        goto err_free;
    st = rank == 0 ? open_root(bs, res, err, errlen)
                   : open_client(bs, res, deadline_ms, err, errlen);
    freeaddrinfo(res);
    if (st != GCOLL_OK)
        goto err_free;
    *bs_p = bs;
    return GCOLL_OK;
err_free:
    gcoll_bootstrap_close(bs);
    return st;
}

const char *gcoll_bootstrap_local_ip(const gcoll_bootstrap_t *bs)
{
    return bs->local_ip;
}

/* ---- wire forms --------------------------------------------------------------------- */

enum { HELLO_FIXED = 4 + 4 + 4 + 8 + 16 + 2, REPLY_FIXED = 4 + 4 + 2 };

int gcoll_bs_hello_parse(const uint8_t *buf, size_t len, gcoll_bs_hello_t *h, size_t *need,
                         const char **why)
{
    size_t n = HELLO_FIXED;
    if (len < n)
        goto more;
    if (gcoll_get_u32(buf) != HELLO_MAGIC) {
        *why = "bad hello magic";
        return -1;
    }
    h->mlen = gcoll_get_u16(buf + 36);
    if (h->mlen > GCOLL_BS_MAX_FIELD) {
        *why = "settings string too long";
        return -1;
    }
    n += h->mlen + 4;
    if (len < n)
        goto more;
    h->blen = gcoll_get_u32(buf + n - 4);
    if (h->blen > GCOLL_BS_MAX_FIELD) {
        *why = "address blob too long";
        return -1;
    }
    n += h->blen;
    if (len < n)
        goto more;
    h->rank = gcoll_get_u32(buf + 4);
    h->size = gcoll_get_u32(buf + 8);
    h->hash = gcoll_get_u64(buf + 12);
    memcpy(h->version, buf + 20, 16);
    h->version[15] = '\0';
    h->match = (const char *)buf + HELLO_FIXED;
    h->blob = buf + HELLO_FIXED + h->mlen + 4;
    *need = n;
    return 1;
more:
    *need = n;
    return 0;
}

size_t gcoll_bs_hello_encode(const gcoll_bs_hello_t *h, uint8_t *p)
{
    size_t n = HELLO_FIXED + h->mlen + 4 + h->blen;
    if (!p)
        return n;
    gcoll_put_u32(p, HELLO_MAGIC);
    gcoll_put_u32(p + 4, h->rank);
    gcoll_put_u32(p + 8, h->size);
    gcoll_put_u64(p + 12, h->hash);
    memcpy(p + 20, h->version, 16);
    gcoll_put_u16(p + 36, (uint16_t)h->mlen);
    memcpy(p + HELLO_FIXED, h->match, h->mlen);
    gcoll_put_u32(p + HELLO_FIXED + h->mlen, (uint32_t)h->blen);
    memcpy(p + HELLO_FIXED + h->mlen + 4, h->blob, h->blen);
    return n;
}

int gcoll_bs_reply_parse(const uint8_t *buf, size_t len, uint32_t max_n, gcoll_bs_reply_t *r,
                         size_t *need, const char **why)
{
    size_t n = REPLY_FIXED;
    if (len < n)
        goto more;
    if (gcoll_get_u32(buf) != REPLY_MAGIC) {
        *why = "bad reply magic";
        return -1;
    }
    r->status = (int32_t)gcoll_get_u32(buf + 4);
    if (r->status > 0 || r->status < GCOLL_ERR_INTERNAL) {
        *why = "unknown status in the reply";
        return -1;
    }
    r->mlen = gcoll_get_u16(buf + 8);
    if (r->mlen > GCOLL_BS_MAX_FIELD) {
        *why = "reply message too long";
        return -1;
    }
    n += r->mlen + 4;
    if (len < n)
        goto more;
    r->n = gcoll_get_u32(buf + n - 4);
    if (r->n > max_n || (r->status != GCOLL_OK && r->n != 0)) {
        *why = "address table of the wrong size";
        return -1;
    }
    size_t t0 = n;
    for (uint32_t i = 0; i < r->n; i++) {
        n += 4;
        if (len < n)
            goto more;
        size_t l = gcoll_get_u32(buf + n - 4);
        if (l > GCOLL_BS_MAX_FIELD) {
            *why = "address blob too long";
            return -1;
        }
        n += l;
        if (len < n)
            goto more;
    }
    r->msg = (const char *)buf + REPLY_FIXED;
    r->table = buf + t0;
    r->tlen = n - t0;
    *need = n;
    return 1;
more:
    *need = n;
    return 0;
}

/* Reads one message, as many bytes at a time as its parser asks for (the parsers bound
 * every length first). The buffer is the caller's to free, also on error. */
typedef int (*parse_fn)(const uint8_t *buf, size_t len, void *msg, size_t *need, const char **why,
                        uint32_t max_n);

static int hello_parse_fn(const uint8_t *buf, size_t len, void *msg, size_t *need, const char **why,
                          uint32_t max_n)
{
    (void)max_n;
    return gcoll_bs_hello_parse(buf, len, msg, need, why);
}

static int reply_parse_fn(const uint8_t *buf, size_t len, void *msg, size_t *need, const char **why,
                          uint32_t max_n)
{
    return gcoll_bs_reply_parse(buf, len, max_n, msg, need, why);
}

static gcoll_status_t recv_msg(int fd, parse_fn parse, uint32_t max_n, void *msg, uint8_t **buf_p,
                               uint64_t deadline_ms, const char **why)
{
    size_t have = 0, need = 0, cap = 0;
    uint8_t *buf = NULL;
    *buf_p = NULL;
    for (;;) {
        int r = parse(buf, have, msg, &need, why, max_n);
        if (r != 0)
            return r > 0 ? GCOLL_OK : GCOLL_ERR_INVALID;
        if (need > cap) {
            size_t c = GCOLL_MAX(need, 2 * cap);
            uint8_t *nb = realloc(buf, c);
            if (!nb) {
                *why = "out of memory";
                return GCOLL_ERR_NOMEM;
            }
            *buf_p = buf = nb;
            cap = c;
        }
        gcoll_status_t st = gcoll_sock_read_all(fd, buf + have, need - have, deadline_ms);
        if (st != GCOLL_OK) {
            *why = st == GCOLL_ERR_TIMEOUT ? "timed out" : "connection lost";
            return st;
        }
        have = need;
    }
}

/* ---- exchange ----------------------------------------------------------------------- */

typedef struct {
    gcoll_bs_hello_t h;
    uint8_t *raw; /* what h points into (rank 0's own: NULL) */
} hello_t;

static int on_rank(void *arg, int fd, const void *payload, size_t plen, const char *from)
{
    gcoll_bootstrap_t *bs = arg;
    if (plen != 8)
        return -1;
    int r = (int)gcoll_get_u32(payload);
    if (r <= 0 || r >= bs->size || bs->peer_fd[r] >= 0) {
        GCOLL_WARN("rendezvous: connection from %s claims rank %d, which is %s", from, r,
                   (r <= 0 || r >= bs->size) ? "out of range" : "already taken");
        return -1;
    }
    bs->peer_fd[r] = fd;
    return 0;
}

static gcoll_status_t send_hello(int fd, const gcoll_bs_hello_t *h, uint64_t deadline_ms)
{
    size_t n = gcoll_bs_hello_encode(h, NULL);
    uint8_t *buf = malloc(n);
    if (!buf)
        return GCOLL_ERR_NOMEM;
    gcoll_bs_hello_encode(h, buf);
    gcoll_status_t st = gcoll_sock_write_all(fd, buf, n, deadline_ms);
    free(buf);
    return st;
}

static gcoll_status_t send_reply(int fd, gcoll_status_t status, const char *msg, const hello_t *all,
                                 int size, uint64_t deadline_ms)
{
    size_t mlen = GCOLL_MIN(strlen(msg), (size_t)GCOLL_BS_MAX_FIELD), n = REPLY_FIXED + mlen + 4;
    if (status == GCOLL_OK)
        for (int i = 0; i < size; i++)
            n += 4 + all[i].h.blen;
    uint8_t *buf = malloc(n), *p = buf;
    if (!buf)
        return GCOLL_ERR_NOMEM;
    gcoll_put_u32(p, REPLY_MAGIC);
    gcoll_put_u32(p + 4, (uint32_t)status);
    gcoll_put_u16(p + 8, (uint16_t)mlen);
    memcpy(p + 10, msg, mlen);
    p += 10 + mlen;
    gcoll_put_u32(p, status == GCOLL_OK ? (uint32_t)size : 0);
    p += 4;
    if (status == GCOLL_OK) {
        for (int i = 0; i < size; i++) {
            gcoll_put_u32(p, (uint32_t)all[i].h.blen);
            memcpy(p + 4, all[i].h.blob, all[i].h.blen);
            p += 4 + all[i].h.blen;
        }
    }
    gcoll_status_t st = gcoll_sock_write_all(fd, buf, n, deadline_ms);
    free(buf);
    return st;
}

/* The next "NAME=value" token of a space-separated, unterminated list: [*p, *p + n). */
static int next_setting(const char **p, const char *end, const char **tok, size_t *n)
{
    while (*p < end && **p == ' ')
        (*p)++;
    if (*p >= end)
        return 0;
    *tok = *p;
    while (*p < end && **p != ' ')
        (*p)++;
    *n = (size_t)(*p - *tok);
    return 1;
}

/* Names the must-match settings on which rank i's list (b) differs from rank 0's (a). */
static void describe_mismatch(const gcoll_bs_hello_t *a, const gcoll_bs_hello_t *b, int i,
                              char *msg, size_t len)
{
    size_t off = (size_t)snprintf(msg, len, "ranks disagree on settings that must match:");
    int any = 0;
    const char *pa = a->match, *ea = a->match + a->mlen, *ta;
    size_t na;
    while (off < len && next_setting(&pa, ea, &ta, &na)) {
        const char *eq = memchr(ta, '=', na);
        size_t kl = eq ? (size_t)(eq - ta) + 1 : na; /* the name with its '=' */
        const char *pb = b->match, *eb = b->match + b->mlen, *tb, *found = NULL;
        size_t nb, nf = 0;
        while (next_setting(&pb, eb, &tb, &nb))
            if (nb >= kl && memcmp(tb, ta, kl) == 0) {
                found = tb;
                nf = nb;
                break;
            }
        if (found && nf == na && memcmp(found, ta, na) == 0)
            continue;
        off += (size_t)snprintf(msg + off, len - off, "%s rank 0 has %.*s, rank %d has %.*s",
                                any ? ";" : "", (int)na, ta, i, found ? (int)nf : 5,
                                found ? found : "unset");
        any = 1;
    }
    if (!any && off < len) /* same names and values, other hash: show both lists */
        snprintf(msg + off, len - off, " rank 0 has [%.*s], rank %d has [%.*s]", (int)a->mlen,
                 a->match, i, (int)b->mlen, b->match);
}

/* Everyone must run the same library with the same must-match settings. */
static gcoll_status_t check_agreement(const hello_t *all, int size, char *msg, size_t len)
{
    const gcoll_bs_hello_t *h0 = &all[0].h;
    for (int i = 1; i < size; i++) {
        const gcoll_bs_hello_t *h = &all[i].h;
        if (h->size != h0->size) {
            snprintf(msg, len, "rank %d was started with %u ranks but rank 0 with %u", i, h->size,
                     h0->size);
            return GCOLL_ERR_MISMATCH;
        }
        if (strcmp(h->version, h0->version) != 0) {
            snprintf(msg, len, "rank %d runs gcoll %s but rank 0 runs %s", i, h->version,
                     h0->version);
            return GCOLL_ERR_MISMATCH;
        }
        if (h->hash != h0->hash) {
            describe_mismatch(h0, h, i, msg, len);
            return GCOLL_ERR_MISMATCH;
        }
    }
    return GCOLL_OK;
}

/* Copies a table of size blobs (already checked: n entries within tlen) into one
 * allocation of pointers and bytes. */
static gcoll_status_t unpack_table(const uint8_t *p, size_t n, int size, void ***blobs_p,
                                   size_t **lens_p)
{
    void **blobs = malloc((size_t)size * sizeof(void *) + n);
    size_t *lens = malloc((size_t)size * sizeof(size_t));
    if (!blobs || !lens) {
        free(blobs);
        free(lens);
        return GCOLL_ERR_NOMEM;
    }
    uint8_t *store = (uint8_t *)(blobs + size);
    memcpy(store, p, n);
    size_t off = 0;
    for (int i = 0; i < size; i++) {
        if (n - off < 4 || gcoll_get_u32(store + off) > n - off - 4) {
            free(blobs);
            free(lens);
            return GCOLL_ERR_INVALID;
        }
        lens[i] = gcoll_get_u32(store + off);
        blobs[i] = store + off + 4;
        off += 4 + lens[i];
    }
    *blobs_p = blobs;
    *lens_p = lens;
    return GCOLL_OK;
}

/* Lists the ranks not yet connected (at most max, then "and N more") into buf; returns
 * how many are missing. */
static int missing_ranks(const gcoll_bootstrap_t *bs, int max, char *buf, size_t len)
{
    int missing = 0;
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 1; i < bs->size; i++)
        if (bs->peer_fd[i] < 0 && missing++ < max && off < len)
            off += (size_t)snprintf(buf + off, len - off, " %d", i);
    if (missing > max && off < len)
        snprintf(buf + off, len - off, " and %d more", missing - max);
    return missing;
}

/* Rank 0's progress note while ranks are awaited: a rank that never comes (not started,
 * or given another GCOLL_ROOT) would otherwise mean minutes of silence. The first note
 * after 5 s (a normal start takes well under that), then every 10 s. */
static void note_waiting(void *arg)
{
    gcoll_bootstrap_t *bs = arg;
    uint64_t now = gcoll_time_ms();
    if (now < bs->next_note_ms)
        return;
    bs->next_note_ms = now + 10000;
    char list[160];
    int missing = missing_ranks(bs, 16, list, sizeof(list));
    GCOLL_WARN("rendezvous: still waiting for rank%s%s (%d of %d joined) at GCOLL_ROOT %s",
               missing > 1 ? "s" : "", list, bs->size - missing, bs->size, bs->root);
}

static gcoll_status_t exchange_root(gcoll_bootstrap_t *bs, hello_t *all, uint64_t deadline_ms,
                                    char *err, size_t errlen)
{
    char why[512];
    bs->next_note_ms = gcoll_time_ms() + 5000;
    gcoll_status_t st = gcoll_auth_accept_tick(bs->fd, &bs->key, bs->size - 1, on_rank,
                                               note_waiting, bs, deadline_ms, why, sizeof(why));
    if (st != GCOLL_OK) {
        char list[160];
        missing_ranks(bs, 16, list, sizeof(list));
        snprintf(err, errlen, "rendezvous: %s; ranks missing:%s", why, list);
        return st;
    }
    /* The listener is no longer read: strangers queued there wait, harmless, until it
     * closes. Every connection here has proved it holds the job key. */
    for (int i = 1; i < bs->size && st == GCOLL_OK; i++) {
        const char *bad = "";
        st = recv_msg(bs->peer_fd[i], hello_parse_fn, 0, &all[i].h, &all[i].raw, deadline_ms, &bad);
        if (st == GCOLL_OK && all[i].h.rank != (uint32_t)i) {
            bad = "it claims another rank";
            st = GCOLL_ERR_INVALID;
        }
        if (st != GCOLL_OK)
            snprintf(why, sizeof(why), "rendezvous: bad or missing hello from rank %d (%s)", i,
                     bad);
    }
    if (st == GCOLL_OK)
        st = check_agreement(all, bs->size, why, sizeof(why));
    /* a failure goes to every rank, so that none waits for its timeout */
    for (int i = 1; i < bs->size; i++) {
        gcoll_status_t sst =
            send_reply(bs->peer_fd[i], st, st == GCOLL_OK ? "" : why, all, bs->size, deadline_ms);
        if (st == GCOLL_OK && sst != GCOLL_OK) {
            snprintf(err, errlen, "rendezvous: cannot send the address table to rank %d", i);
            return sst;
        }
    }
    if (st != GCOLL_OK)
        snprintf(err, errlen, "%s", why);
    return st;
}

static gcoll_status_t exchange_client(gcoll_bootstrap_t *bs, void ***blobs_p, size_t **lens_p,
                                      uint64_t deadline_ms, char *err, size_t errlen)
{
    gcoll_bs_reply_t r;
    uint8_t *buf = NULL;
    const char *why = "";
    gcoll_status_t st =
        recv_msg(bs->fd, reply_parse_fn, (uint32_t)bs->size, &r, &buf, deadline_ms, &why);
    if (st == GCOLL_ERR_TIMEOUT)
        snprintf(err, errlen,
                 "rendezvous: no reply from rank 0 (timed out: are all ranks "
                 "started?)");
    else if (st != GCOLL_OK)
        snprintf(err, errlen, "rendezvous: bad reply from rank 0 (%s)", why);
    else if (r.status != GCOLL_OK) {
        snprintf(err, errlen, "%.*s", (int)r.mlen, r.msg);
        st = r.status;
    } else if (r.n != (uint32_t)bs->size) {
        snprintf(err, errlen, "rendezvous: rank 0 sent a table of the wrong size");
        st = GCOLL_ERR_MISMATCH;
    } else
        st = unpack_table(r.table, r.tlen, bs->size, blobs_p, lens_p);
    free(buf);
    return st;
}

gcoll_status_t gcoll_bootstrap_exchange(gcoll_bootstrap_t *bs, const char *match, const void *blob,
                                        size_t len, void ***blobs_p, size_t **lens_p,
                                        uint64_t deadline_ms, char *err, size_t errlen)
{
    if (len > GCOLL_BS_MAX_FIELD || strlen(match) > GCOLL_BS_MAX_FIELD)
        return GCOLL_ERR_INTERNAL;
    gcoll_bs_hello_t mine = {.rank = (uint32_t)bs->rank,
                             .size = (uint32_t)bs->size,
                             .hash = gcoll_hash64(match, strlen(match), 0),
                             .match = match,
                             .mlen = strlen(match),
                             .blob = blob,
                             .blen = len};
    snprintf(mine.version, sizeof(mine.version), "%s", gcoll_version());
    if (bs->rank != 0) {
        gcoll_status_t st = send_hello(bs->fd, &mine, deadline_ms);
        if (st != GCOLL_OK) {
            snprintf(err, errlen, "rendezvous: cannot send hello to rank 0");
            return st;
        }
        return exchange_client(bs, blobs_p, lens_p, deadline_ms, err, errlen);
    }
    hello_t *all = calloc((size_t)bs->size, sizeof(*all));
    if (!all)
        return GCOLL_ERR_NOMEM;
    all[0].h = mine;
    gcoll_status_t st = exchange_root(bs, all, deadline_ms, err, errlen);
    size_t total = 0;
    for (int i = 0; st == GCOLL_OK && i < bs->size; i++)
        total += 4 + all[i].h.blen;
    uint8_t *flat = st == GCOLL_OK ? malloc(total) : NULL;
    if (st == GCOLL_OK && !flat)
        st = GCOLL_ERR_NOMEM;
    if (st == GCOLL_OK) {
        size_t off = 0;
        for (int i = 0; i < bs->size; i++) {
            gcoll_put_u32(flat + off, (uint32_t)all[i].h.blen);
            memcpy(flat + off + 4, all[i].h.blob, all[i].h.blen);
            off += 4 + all[i].h.blen;
        }
        st = unpack_table(flat, total, bs->size, blobs_p, lens_p);
    }
    free(flat);
    for (int i = 1; i < bs->size; i++)
        free(all[i].raw);
    free(all);
    return st;
}

void gcoll_bootstrap_close(gcoll_bootstrap_t *bs)
{
    if (!bs)
        return;
    if (bs->fd >= 0)
        close(bs->fd);
    if (bs->peer_fd) {
        for (int i = 0; i < bs->size; i++)
            if (bs->peer_fd[i] >= 0)
                close(bs->peer_fd[i]);
        free(bs->peer_fd);
    }
    free(bs);
}
