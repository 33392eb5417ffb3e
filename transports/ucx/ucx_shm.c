/* ucx_shm.c: the UCX transport's shared-memory mailbox for small messages between ranks of
 * one host (GCOLL_UCX_SHM_MAX; protocol in ucx_int.h). A send of at most that many bytes
 * to such a rank is copied into a ring in the receiver's mailbox and is complete at once;
 * the receiver's progress polls its rings and hands each message to the same matching as
 * UCX's arrivals. Bypassing UCX's active messages for these is what brings an 8-byte
 * allreduce on shared memory to Open MPI's vader (docs/results/dense-allreduce.md). */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/ucx/ucx_int.h"
#include "base/util.h"

#define SHM_MAGIC 0x31584d4253434347ull /* "GCCSBMX1" */
#define SHM_HDR_BYTES 4096u             /* magic, cookie, size, ring bytes; the sleep flag */
#define SHM_CTL_BYTES 128u              /* a ring's head (at 64: the receiver's line) */
#define SHM_REC_HDR 24u                 /* a record: seq u64, tag u64, sig u32, length u32 */
#define SHM_REC_ALIGN 64u               /* records start on cache lines */
#define SHM_HEAD_STEP (GCOLL_UCX_SHM_RING / 32) /* poll_ring */
#define SHM_PAD 0xffffffffu   /* a record's length field: skip to the ring's end */
#define SHM_ABORT 0xfffffffeu /* ...: an abort (status in tag, reason length in sig) */
#define SHM_SLEEP_OFF 64u     /* the receiver's "asleep in epoll" word */
#define SHM_CPU_OFF 128u      /* the CPU its owner last polled on, plus one */

static size_t ring_stride(void)
{
    return SHM_CTL_BYTES + GCOLL_UCX_SHM_RING;
}

static size_t mailbox_bytes(int size)
{
    return SHM_HDR_BYTES + (size_t)size * ring_stride();
}

static uint8_t *ring_of(uint8_t *mailbox, int sender)
{
    return mailbox + SHM_HDR_BYTES + (size_t)sender * ring_stride();
}

static inline uint64_t *ring_head(uint8_t *ring)
{
    return (uint64_t *)(ring + 64);
}
/* Set by a sender that aborted, after its abort record: the line the sender writes. */
static inline uint64_t *ring_abort(uint8_t *ring)
{
    return (uint64_t *)ring;
}
/* In the same line: set by a sender that has waited SHM_ASK_NS for room, until its waiting
 * sends are all written; meanwhile the receiver tells its head after every read. */
static inline uint64_t *ring_ask(uint8_t *ring)
{
    return (uint64_t *)(ring + 8);
}
static inline uint8_t *ring_data(uint8_t *ring)
{
    return ring + SHM_CTL_BYTES;
}
static inline uint32_t *mailbox_sleep(uint8_t *mailbox)
{
    return (uint32_t *)(mailbox + SHM_SLEEP_OFF);
}

static size_t rec_bytes(size_t len)
{
    return (SHM_REC_HDR + len + SHM_REC_ALIGN - 1) & ~(size_t)(SHM_REC_ALIGN - 1);
}

/* ---------------------------------------------------------------------------------- */
/* Set-up                                                                               */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Faults a ring's pages into this process's page tables now, writable: the first lap of
 * a ring otherwise takes a page fault on each side every 4 KiB (8-byte allreduce on 2
 * ranks, 2000 iterations: 0.65-0.70 us against 0.42-0.45 once the ring had gone round).
 * Only at connect, before any record is written: the fallback writes its zeros. */
static void populate_ring(uint8_t *ring)
{
    /* rings are not page-aligned (the stride is 64 KiB + 128): the pages that hold one */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)ring & ~(page - 1);
    uintptr_t end = ((uintptr_t)ring + ring_stride() + page - 1) & ~(page - 1);
    if (madvise((void *)a, end - a, MADV_POPULATE_WRITE) == 0)
        return;
    for (uintptr_t p = a < (uintptr_t)ring ? a + page : a; p < end; p += page)
        __atomic_fetch_or((uint8_t *)p, 0, __ATOMIC_RELAXED); /* a write that changes nothing */
}

gcoll_status_t gcoll_ucx_shm_create(gcoll_transport_t *t)
{
    t->shm_fd = -1;
    if (!t->shm_max)
        return GCOLL_OK;
    char name[64];
    snprintf(name, sizeof(name), "gcoll-shm-%016llx", (unsigned long long)t->cookie);
    size_t bytes = mailbox_bytes(t->size);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    /* sealed at its size: a peer cannot shrink it under our mappings (SIGBUS) */
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: shared-memory mailbox off: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        t->shm_max = 0;
        return GCOLL_OK;
    }
    /* pages are allocated on first touch: only the rings of senders that use them */
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: shared-memory mailbox off: mmap: %s", strerror(errno));
        close(fd);
        t->shm_max = 0;
        return GCOLL_OK;
    }
    t->shm_fd = fd;
    t->shm_box = m;
    gcoll_put_u64(t->shm_box, SHM_MAGIC);
    gcoll_put_u64(t->shm_box + 8, t->cookie);
    gcoll_put_u32(t->shm_box + 16, (uint32_t)t->size);
    gcoll_put_u32(t->shm_box + 20, GCOLL_UCX_SHM_RING);
    return GCOLL_OK;
}

void gcoll_ucx_shm_blob(gcoll_transport_t *t, uint8_t *c)
{
    memset(c, 0, GCOLL_UCX_BLOB_SHM_LEN);
    if (!t->shm_box)
        return;
    gcoll_put_u32(c, (uint32_t)getpid());
    gcoll_put_u32(c + 4, (uint32_t)t->shm_fd);
}

/* Maps the peer's mailbox (its memfd, through /proc) if it is on this host and ours to
 * write: the file must be that rank's mailbox by name and header (its cookie) and size, so
 * that a pid and fd that mean something else here (another host, another pid namespace)
 * are never written to. */
void gcoll_ucx_shm_attach(gcoll_transport_t *t, int peer, const uint8_t *c)
{
    ucx_peer_t *p = &t->peers[peer];
    uint32_t pid = gcoll_get_u32(c), fdn = gcoll_get_u32(c + 4);
    if (!t->shm_max || pid == 0)
        return;
    char path[64], link[128], want[96];
    snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fdn);
    snprintf(want, sizeof(want), "/memfd:gcoll-shm-%016llx (deleted)",
             (unsigned long long)p->cookie);
    const char *why = NULL;
    size_t bytes = mailbox_bytes(t->size);
    int fd = -1, pfd = open(path, O_PATH | O_CLOEXEC); /* a handle: opens nothing yet */
    void *m = MAP_FAILED;
    struct stat sb;
    char self[64]; /* the handle: what it is, not what the number meant a moment ago */
    snprintf(self, sizeof(self), "/proc/self/fd/%d", pfd);
    ssize_t n = pfd >= 0 ? readlink(self, link, sizeof(link) - 1) : -1;
    if (n < 0)
        why = strerror(errno);
    else if (link[n] = '\0', strcmp(link, want) != 0)
        why = "another process or host";
    else if (fstat(pfd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size != bytes)
        why = "not a mailbox of this communicator's size";
    else {
        if ((fd = open(self, O_RDWR | O_CLOEXEC)) < 0)
            why = strerror(errno);
        else if (!(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK)) /* -1 sets it too: not a memfd */
            why = "not sealed at its size";
        else if ((m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
            why = strerror(errno);
        else if (gcoll_get_u64(m) != SHM_MAGIC || gcoll_get_u64((uint8_t *)m + 8) != p->cookie ||
                 gcoll_get_u32((uint8_t *)m + 16) != (uint32_t)t->size ||
                 gcoll_get_u32((uint8_t *)m + 20) != GCOLL_UCX_SHM_RING)
            why = "its header does not match";
    }
    if (pfd >= 0)
        close(pfd);
    if (fd >= 0)
        close(fd);
    if (why) {
        if (m != MAP_FAILED)
            munmap(m, bytes);
        GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: rank %d (pid %u): no shared-memory mailbox (%s)", peer,
                    pid, why);
        return;
    }
    p->shm_box = m;
    p->shm_ring = ring_of(m, t->rank);
    populate_ring(p->shm_ring);
    GCOLL_DEBUG(GCOLL_SUBSYS_NET, "ucx: rank %d (pid %u): small messages through its mailbox", peer,
                pid);
}

/* The peer said (hello) it writes into our mailbox: poll its ring. */
void gcoll_ucx_shm_expect(gcoll_transport_t *t, int peer)
{
    if (!t->shm_box || t->peers[peer].shm_from)
        return;
    t->peers[peer].shm_from = 1;
    t->shm_senders[t->nshm_senders++] = peer;
    populate_ring(ring_of(t->shm_box, peer));
}

void gcoll_ucx_shm_connected(gcoll_transport_t *t)
{
    /* every peer that wanted it has mapped the mailbox (its hello said so) */
    if (t->shm_fd >= 0)
        close(t->shm_fd);
    t->shm_fd = -1;
}

uint32_t gcoll_ucx_shm_mesh_own(gcoll_transport_t *t)
{
    if (!t->shm_box)
        return 0;
    for (int i = 0; i < t->size; i++)
        if (i != t->rank && !(t->peers[i].shm_ring && t->peers[i].shm_from))
            return 0;
    return (uint32_t)t->shm_max;
}

size_t gcoll_ucx_shm_mesh_max(gcoll_transport_t *t)
{
    return t->shm_mesh;
}

void gcoll_ucx_shm_destroy(gcoll_transport_t *t)
{
    size_t bytes = mailbox_bytes(t->size);
    for (int i = 0; t->peers && i < t->size; i++)
        if (t->peers[i].shm_box) {
            munmap(t->peers[i].shm_box, bytes);
            t->peers[i].shm_box = NULL;
            t->peers[i].shm_ring = NULL;
        }
    if (t->shm_box)
        munmap(t->shm_box, bytes);
    t->shm_box = NULL;
    if (t->shm_fd >= 0)
        close(t->shm_fd);
    t->shm_fd = -1;
}

/* ---------------------------------------------------------------------------------- */
/* Data path                                                                            */

/* Writes one record to the peer's ring: 0 when it has no room. The sequence word goes
 * last: it is what the receiver polls, in the record's own cache line (one line moves
 * between the cores for a small message, as in Open MPI's vader "fast boxes"). */
static int put_record(ucx_peer_t *p, uint64_t tag, uint32_t sig, uint32_t lenf, const void *buf,
                      size_t len)
{
    uint8_t *ring = p->shm_ring, *data = ring_data(ring);
    const uint64_t R = GCOLL_UCX_SHM_RING;
    uint64_t tail = p->shm_tail, pos = tail & (R - 1);
    size_t need = rec_bytes(len), pad = pos + need > R ? (size_t)(R - pos) : 0;
    if (tail + pad + need - p->shm_head_seen > R) {
        p->shm_head_seen = __atomic_load_n(ring_head(ring), __ATOMIC_ACQUIRE);
        if (tail + pad + need - p->shm_head_seen > R)
            return 0;
    }
    if (pad) {
        gcoll_put_u32(data + pos + 20, SHM_PAD);
        __atomic_store_n((uint64_t *)(data + pos), tail + 1, __ATOMIC_RELEASE);
        tail += pad;
        pos = 0;
    }
    uint8_t *r = data + pos;
    gcoll_put_u64(r + 8, tag);
    gcoll_put_u32(r + 16, sig);
    gcoll_put_u32(r + 20, lenf);
    if (len)
        memcpy(r + SHM_REC_HDR, buf, len);
    __atomic_store_n((uint64_t *)r, tail + 1, __ATOMIC_RELEASE);
    p->shm_tail = tail + need;
    return 1;
}

/* Writes req into the peer's ring and completes it: 0 when the ring has no room. */
static int try_send(gcoll_transport_t *t, ucx_peer_t *p, gcoll_treq_t *req)
{
    if (!put_record(p, req->tag, req->sig, (uint32_t)req->len, req->buf, req->len))
        return 0;
    p->shm_stalled = 0;
    /* Dekker with the receiver's sleep (gcoll_ucx_shm_sleep): the record is visible before
     * we read its flag, or it sees the record before it sleeps */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    t->st_shm_sends++;
    if (__atomic_load_n(mailbox_sleep(p->shm_box), __ATOMIC_RELAXED)) {
        /* The send completes with its doorbell: a bell that UCX had to queue moves only
         * while we progress, and a caller whose send completed might not. */
        t->st_shm_bells++;
        ucx_hdr_t h = {.type = UCX_MSG_BELL, .src = (uint32_t)t->rank, .cookie = p->cookie};
        if (gcoll_ucx_send_op(t, p->rank, req, &h, NULL, 0) != GCOLL_OK)
            gcoll_ucx_complete(t, req, GCOLL_OK); /* no memory: the receiver's timeout */
        return 1;
    }
    gcoll_ucx_complete(t, req, GCOLL_OK);
    return 1;
}

/* A sender that finds the ring full waits for room while the receiver drains it, as
 * vader's senders wait for fragments: going through UCX instead costs both sides several
 * times a ring write (a free-running 8-byte gather on 2 ranks sent 1 message in 27 that
 * way, a third of its time). A receiver whose head stands still this long is busy
 * elsewhere: sends then go through UCX, so that they complete without it. */
#define SHM_STALL_NS (t->shm_stall_limit_ns) /* GCOLL_UCX_SHM_STALL_NS */
/* A sender that has waited this long for room asks the receiver to tell its head after
 * every read (ring_ask), not in steps (SHM_HEAD_STEP), until it waits no more: a receiver
 * that takes more than SHM_STALL_NS to read a step (one that computes between its calls,
 * or shares its CPU) is slow, not busy elsewhere, and its senders should wait for it
 * rather than use UCX. */
#define SHM_ASK_NS (SHM_STALL_NS / 4)

int gcoll_ucx_shm_send(gcoll_transport_t *t, ucx_peer_t *p, gcoll_treq_t *req)
{
    if (!p->shm_wait && try_send(t, p, req))
        return 1;
    ucx_op_t *op = p->shm_stalled ? NULL : gcoll_ucx_op_alloc(t);
    if (!op) {
        t->st_shm_full++;
        return 0;
    }
    op->t = t;
    op->req = req;
    op->peer = p->rank;
    op->shm_wait = 1;
    req->priv = op;
    if (p->shm_wait)
        p->shm_wait_tail->next = op;
    else
        p->shm_wait = op;
    p->shm_wait_tail = op;
    t->nshm_wait++;
    if (p->shm_wait == op) {
        p->shm_stall_head = p->shm_head_seen;
        p->shm_stall_ns = gcoll_time_ns();
    }
    t->st_shm_waits++;
    return 1;
}

static ucx_op_t *pop_wait(gcoll_transport_t *t, ucx_peer_t *p)
{
    ucx_op_t *op = p->shm_wait;
    p->shm_wait = op->next;
    if (!p->shm_wait)
        p->shm_wait_tail = NULL;
    op->next = NULL;
    t->nshm_wait--;
    return op;
}

unsigned gcoll_ucx_shm_retry(gcoll_transport_t *t)
{
    unsigned done = 0;
    uint64_t now = 0;
    for (int r = 0; r < t->size && t->nshm_wait; r++) {
        ucx_peer_t *p = &t->peers[r];
        while (p->shm_wait && try_send(t, p, p->shm_wait->req)) {
            gcoll_ucx_op_release(t, pop_wait(t, p));
            done++;
        }
        if (!p->shm_wait) {
            if (p->shm_asked) { /* no longer waiting: steps will do again */
                __atomic_store_n(ring_ask(p->shm_ring), 0, __ATOMIC_RELAXED);
                p->shm_asked = 0;
            }
            continue;
        }
        if (!now)
            now = gcoll_time_ns();
        if (p->shm_head_seen != p->shm_stall_head) { /* it drains: wait on */
            p->shm_stall_head = p->shm_head_seen;
            p->shm_stall_ns = now;
            continue;
        }
        if (now - p->shm_stall_ns >= SHM_ASK_NS && !p->shm_asked) {
            __atomic_store_n(ring_ask(p->shm_ring), 1, __ATOMIC_RELEASE);
            p->shm_asked = 1;
        }
        if (now - p->shm_stall_ns < SHM_STALL_NS)
            continue;
        GCOLL_DEBUG(GCOLL_SUBSYS_NET,
                    "ucx: rank %d's ring did not drain in %llu us: %u send(s) go through UCX", r,
                    (unsigned long long)((now - p->shm_stall_ns) / 1000), t->nshm_wait);
        p->shm_stalled = 1;
        while (p->shm_wait) {
            ucx_op_t *op = pop_wait(t, p);
            gcoll_treq_t *req = op->req;
            gcoll_ucx_op_release(t, op);
            req->priv = NULL;
            t->st_shm_full++;
            gcoll_status_t st = gcoll_ucx_send_data(t, req);
            if (st != GCOLL_OK)
                gcoll_ucx_complete(t, req, st);
            done++;
        }
    }
    return done;
}

void gcoll_ucx_shm_unwait(gcoll_transport_t *t, ucx_op_t *op)
{
    ucx_peer_t *p = &t->peers[op->peer];
    ucx_op_t **pp = &p->shm_wait, *prev = NULL;
    while (*pp && *pp != op) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = op->next;
    if (p->shm_wait_tail == op)
        p->shm_wait_tail = prev;
    t->nshm_wait--;
    gcoll_ucx_op_release(t, op);
}

void gcoll_ucx_shm_end_waits(gcoll_transport_t *t, ucx_peer_t *p, gcoll_status_t st)
{
    while (p->shm_wait) {
        ucx_op_t *op = pop_wait(t, p);
        gcoll_treq_t *req = op->req;
        gcoll_ucx_op_release(t, op);
        if (st != GCOLL_OK)
            gcoll_ucx_complete(t, req, st);
    }
}

/* An abort goes down the ring too, behind the messages sent before it: a peer that takes
 * those from the ring without progressing UCX (gcoll_ucx_drive) still meets the abort
 * before any later call completes on them. The UCX copy wakes a sleeper; whichever comes
 * second finds the sender failed and is dropped. */
void gcoll_ucx_shm_abort(ucx_peer_t *p, gcoll_status_t status, const char *reason, size_t len)
{
    if (!p->shm_ring)
        return;
    (void)put_record(p, (uint64_t)(int64_t)status, (uint32_t)len, SHM_ABORT, reason, len);
    /* then the flag that makes the receiver take in everything (poll_ring), the abort
     * record with it when it fitted */
    __atomic_store_n(ring_abort(p->shm_ring), 1, __ATOMIC_RELEASE);
}

static void malformed(gcoll_transport_t *t, int peer, const char *what, uint64_t a, uint64_t b)
{
    gcoll_ucx_set_error(t, "rank %d wrote a malformed shared-memory message (%s: %llu, %llu)", peer,
                        what, (unsigned long long)a, (unsigned long long)b);
    gcoll_ucx_peer_fail(t, peer, GCOLL_ERR_PEER);
}

/* Delivers the records one sender's ring holds; the count delivered. A record is there
 * when its sequence word says its position + 1 (an older lap's record, or garbage, says
 * otherwise); its fields are read once and checked before use: the sender may be broken.
 *
 * Records are taken in only while a receive from this sender waits (or for one posted
 * for their tag), unless forced: the others stay in the ring, where the receive that
 * comes for one later takes it with one copy, and where they hold the sender back once
 * the ring is full (gcoll_ucx_shm_send). Taking in everything instead left a rank that
 * ran ahead thousands of messages in the unexpected store, each allocated, copied, found
 * and freed: 480 of the root's 2,070 instructions per 8-byte reduce on 2 ranks.
 * Everything is taken in (force) once the sender has aborted, before the sender is
 * failed (its messages outlive it), and for a receive from any source. */
static unsigned poll_ring(gcoll_transport_t *t, ucx_peer_t *p, int force)
{
    uint8_t *ring = ring_of(t->shm_box, p->rank), *data = ring_data(ring);
    const uint64_t R = GCOLL_UCX_SHM_RING;
    uint64_t head = p->shm_head;
    unsigned n = 0;
    if (__atomic_load_n(ring_abort(ring), __ATOMIC_ACQUIRE))
        force = 1;
    const uint64_t ask = __atomic_load_n(ring_ask(ring), __ATOMIC_RELAXED);
    int left = 0; /* a record stays in the ring */
    p->shm_polling = 1;
    while (!p->rx.failed) {
        uint64_t pos = head & (R - 1);
        if (__atomic_load_n((uint64_t *)(data + pos), __ATOMIC_ACQUIRE) != head + 1)
            break;
        left = 1;
        uint32_t len = gcoll_get_u32(data + pos + 20);
        if (len == SHM_ABORT) {
            uint32_t rlen = gcoll_get_u32(data + pos + 16);
            if (rlen > GCOLL_UCX_ABORT_INLINE || rec_bytes(rlen) > R - pos) {
                malformed(t, p->rank, "abort reason length", rlen, pos);
                break;
            }
            /* fails every peer, this one too: the loop ends */
            gcoll_ucx_on_abort(t, p->rank, (int)(int64_t)gcoll_get_u64(data + pos + 8),
                               data + pos + SHM_REC_HDR, rlen);
            n++;
            break;
        }
        size_t need = len == SHM_PAD ? (size_t)(R - pos) : rec_bytes(len);
        if (len != SHM_PAD) {
            if (len > GCOLL_UCX_SHM_MAX_LIMIT || need > R - pos) {
                malformed(t, p->rank, "record length", len, pos);
                break;
            }
            uint64_t tag = gcoll_get_u64(data + pos + 8);
            if (!force && !p->rx.nwant && !gcoll_match_posted_tag(&p->rx, tag))
                break; /* left in the ring */
            gcoll_ucx_deliver(t, p->rank, tag, gcoll_get_u32(data + pos + 16),
                              data + pos + SHM_REC_HDR, len);
            n++;
        }
        /* Every line of what was read may start a later record: its first word is cleared
         * so that old payload bytes are never taken for a sequence word (they can equal
         * one: records differ in length from lap to lap). */
        for (size_t o = 0; o < need; o += SHM_REC_ALIGN)
            *(uint64_t *)(data + pos + o) = 0;
        head += need;
        left = 0;
    }
    p->shm_polling = 0;
    p->shm_head = head;
    /* The head is told to the sender in steps of SHM_HEAD_STEP while records stay in the
     * ring, and whenever it is empty or the sender asks: a sender that runs ahead (the
     * ring full) then reads the line it is in once a step rather than after every record
     * we take (an 8-byte reduce or gather on 2 ranks, where that line moved between the
     * cores with every call: 0.23 -> 0.13 us). */
    if (head != p->shm_head_pub && (!left || ask || head - p->shm_head_pub >= SHM_HEAD_STEP)) {
        p->shm_head_pub = head;
        __atomic_store_n(ring_head(ring), head, __ATOMIC_RELEASE);
    }
    t->st_shm_recvs += n;
    return n;
}

void gcoll_ucx_shm_drain(gcoll_transport_t *t, ucx_peer_t *p)
{
    if (t->shm_box && p->shm_from && !p->shm_polling && !p->rx.failed && !t->closing)
        poll_ring(t, p, 1);
}

void gcoll_ucx_shm_drain_all(gcoll_transport_t *t)
{
    for (int i = 0; i < t->nshm_senders; i++)
        gcoll_ucx_shm_drain(t, &t->peers[t->shm_senders[i]]);
}

/* Where the ranks run, for waits that must choose between polling and yielding (4 ranks
 * on 2 cores, 8-byte allreduce: 7.7-8.8 us yielding after 500 ns, 4.1-4.3 us polling
 * while the peer runs elsewhere, as vader's 3.0-3.4). Written only when it changes, so
 * the line stays shared in the peers' caches. */
static void publish_cpu(gcoll_transport_t *t)
{
    int cpu = sched_getcpu();
    if (cpu >= 0 && cpu + 1 != t->shm_cpu1) {
        t->shm_cpu1 = cpu + 1;
        __atomic_store_n((int *)(t->shm_box + SHM_CPU_OFF), cpu + 1, __ATOMIC_RELAXED);
    }
}

int gcoll_ucx_shm_peer_cpu(gcoll_transport_t *t, int peer)
{
    if (peer < 0 || peer >= t->size || !t->peers[peer].shm_box || !t->shm_cpu1)
        return -1;
    int c = __atomic_load_n((int *)(t->peers[peer].shm_box + SHM_CPU_OFF), __ATOMIC_RELAXED);
    return c == 0 ? -1 : c == t->shm_cpu1;
}

unsigned gcoll_ucx_shm_poll(gcoll_transport_t *t)
{
    unsigned n = 0;
    if (t->closing) /* destroy: arrivals are dropped (as UCX's) */
        return 0;
    publish_cpu(t);
    for (int i = 0; i < t->nshm_senders; i++) {
        ucx_peer_t *p = &t->peers[t->shm_senders[i]];
        if (!p->rx.failed)
            n += poll_ring(t, p, 0);
    }
    return n;
}

/* Before sleeping in epoll: raise the flag senders check after writing (they then ring
 * UCX's doorbell), then look once more. Nonzero: something arrived, do not sleep. */
int gcoll_ucx_shm_sleep(gcoll_transport_t *t)
{
    if (!t->nshm_senders)
        return 0;
    unsigned long ev = t->events;
    __atomic_store_n(mailbox_sleep(t->shm_box), 1u, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* anything delivered, or a peer failed on a malformed record: do not sleep */
    int any = gcoll_ucx_shm_poll(t) != 0 || t->events != ev;
    if (any)
        gcoll_ucx_shm_wake(t);
    return any;
}

void gcoll_ucx_shm_wake(gcoll_transport_t *t)
{
    if (t->nshm_senders)
        __atomic_store_n(mailbox_sleep(t->shm_box), 0u, __ATOMIC_RELAXED);
}
