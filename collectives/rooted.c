/* rooted.c: the rooted collectives, reduce, gather and scatter: binomial trees and a linear
 * reduce for small messages; for large ones reduce-scatter then a gather of the blocks
 * (Rabenseifner's reduce; Thakur, Rabenseifner & Gropp 2005, section 4.4), a chain, and
 * direct transfers between the root and every rank (gather, scatter). Which one:
 * rooted_select.c. Their entry points are in lib/api/rooted_api.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "collectives/guard.h"
#include "collectives/reduce.h"
#include "base/util.h"

/* ---- the binomial tree ------------------------------------------------------------- */

/* Lowest set bit of vr (P for the root, vr 0): the span of vr's subtree before clipping. */
/* x mod P for x in [0, 2P): every rank sum here is one (an idiv costs tens of cycles). */
static inline int wrap(int x, int P)
{
    return x >= P ? x - P : x;
}

static int low_bit(int vr, int P)
{
    return vr ? vr & -vr : P;
}

gcoll_tree_pos_t gcoll_tree_pos(int vr, int P)
{
    gcoll_tree_pos_t t = {.parent = -1};
    int span = low_bit(vr, P);
    if (vr)
        t.parent = vr - span;
    t.size = GCOLL_MIN(span, P - vr);
    /* the children are vr + m for each power of two m below the span, while inside P */
    for (int m = 1; m < span && vr + m < P; m <<= 1)
        t.nchild++;
    return t;
}

/* ---- mismatches: the call's note, and probes when it waits long ------------------------ */

/* Ranks that disagree on a call (another root, count or kind) fail with
 * GCOLL_ERR_MISMATCH rather than hang: every message carries the call's signature, and
 * collectives/guard.h covers the cases no message reveals. Nothing is sent for it while
 * the call runs as it should. */
typedef struct {
    const gcoll_coll_t *ctx;
    gcoll_guard_note_t note;
    int probed;
} guard_t;

static gcoll_status_t guard_start(guard_t *gd, const gcoll_coll_t *ctx, int kind, size_t count,
                                  int root, uint32_t sig)
{
    const uint32_t seq = ctx->ch->seq & 0x7fffffffu;
    gd->ctx = ctx;
    gd->note =
        (gcoll_guard_note_t){.seq = seq, .sig = sig, .kind = kind, .root = root, .count = count};
    gd->probed = 0;
    return gcoll_guard_begin(ctx, seq, sig, kind, root, count);
}

/* Waits for reqs[0..n) in order; GCOLL_GUARD_PROBE_MS after the call first waited, tells
 * every peer what this rank waits in (by the clock of the channel's polling rounds, read
 * anyway). */
static gcoll_status_t wait_guarded(guard_t *gd, gcoll_treq_t *reqs, int n)
{
    gcoll_channel_t *ch = gd->ctx->ch;
    int first = 0, done;
    for (;;) {
        for (; first < n; first++) {
            GCOLL_CHECK(gcoll_channel_done(ch, &reqs[first], &done));
            if (!done)
                break;
        }
        if (first == n)
            return GCOLL_OK;
        if (!gd->probed && ch->wait_from_ns &&
            ch->poll_prev_ns >= ch->wait_from_ns + GCOLL_GUARD_PROBE_MS * 1000000ull) {
            gcoll_guard_probe(ch, &gd->note);
            gd->probed = 1;
        }
        GCOLL_CHECK(gcoll_channel_poll(ch, &reqs[first]));
    }
}

/* The call succeeded here: later messages carry its signature in their hash. */
static gcoll_status_t guard_finish(guard_t *gd)
{
    gcoll_guard_end(gd->ctx->ch, gd->note.sig);
    return GCOLL_OK;
}

/* ---- large transfers wait for their receive -------------------------------------------- */

/* A message this large goes only once its receive is posted: the receiver says so with an
 * empty message, as MPI's rendezvous does above its eager limit (Open MPI's TCP BTL: 64
 * KiB). Otherwise a rank that is late into the call (its peers' sends eager) has every
 * byte sent to it held as unexpected, a fresh allocation and one more copy, and a gather
 * of large blocks into a late root could pass GCOLL_UNEXPECTED_BYTES and fail. From 64 KiB
 * rather than the ring's 1 MiB: back-to-back gathers of 512 KiB blocks on 2 ranks over TCP
 * took 536-607 us with the copy, 211-237 us without; scatter and reduce of 1 MiB on 4
 * ranks 1.7x faster; 128 KiB blocks unchanged. */
#define READY_MIN GCOLL_ROOTED_READY_MIN
#define READY_SUB 0xfffffff1u

/* The receiver's half: after posting a receive of len bytes from peer, tell it (into
 * req[*n], counted, when len is large enough). */
static gcoll_status_t tell_ready(const gcoll_coll_t *ctx, gcoll_treq_t *req, int *n, int peer,
                                 size_t len, uint32_t sig)
{
    if (len < READY_MIN)
        return GCOLL_OK;
    return gcoll_channel_isend(ctx->ch, &req[(*n)++], peer, READY_SUB, sig, NULL, 0);
}

/* The sender's half: post the receive of peer's word into req[*n] (when len is large
 * enough); the caller waits for it before sending. */
static gcoll_status_t post_ready(const gcoll_coll_t *ctx, gcoll_treq_t *req, int *n, int peer,
                                 size_t len, uint32_t sig)
{
    if (len < READY_MIN)
        return GCOLL_OK;
    return gcoll_channel_irecv(ctx->ch, &req[(*n)++], peer, READY_SUB, sig, NULL, 0, 0);
}

/* ---- reduce ---------------------------------------------------------------------------- */

/* The reduce tree's segment: GCOLL_TREE_CHUNK when set. Where every rank reaches every
 * other through a shared-memory mailbox (the channel's mesh_max, the same on every rank),
 * a mailbox record: the root combines one while the next is written, and the mailbox's
 * speed does not follow UCX's own, which on this VM moved 64 KiB messages in 11 us or in
 * 33-39 from one minute to the next, for Open MPI too. 2 ranks, 1 MiB, medians of 5
 * alternated runs: 16 KiB segments 72 us, 64 KiB 108, 512 KiB 117, reduce-scatter then
 * gather 116, Open MPI 112 (docs/results/rooted.md). Elsewhere GCOLL_RING_CHUNK: each
 * segment is a message whose fixed cost both CPUs pay (over TCP, 1 MiB on 2 ranks in
 * 512 KiB segments 137-145 us, in 64 KiB ones 241-250; over UCX's TCP 16 KiB segments
 * were 1.6-1.8x slower than 512 KiB at 256 KiB-16 MiB). */
static size_t tree_segment(const gcoll_coll_t *ctx)
{
    if (ctx->cfg->tree_chunk)
        return ctx->cfg->tree_chunk;
    size_t mesh = gcoll_channel_mesh_max(ctx->ch);
    return mesh >= GCOLL_ROOTED_MESH_MIN ? GCOLL_MIN(ctx->cfg->ring_chunk, mesh)
                                         : ctx->cfg->ring_chunk;
}

/* The chain's place of virtual rank vr: its parent vr - 1 and its one child vr + 1 (the
 * binomial tree's first child, vr + 2^0), so that reduce_tree runs it unchanged. */
static gcoll_tree_pos_t chain_pos(int vr, int P)
{
    return (gcoll_tree_pos_t){.parent = vr - 1, .nchild = vr + 1 < P, .size = P - vr};
}

/* Binomial reduce: each rank combines its children's partial results, in the order of
 * their distance (its own input first), and sends the result to its parent. Every child's
 * receive is posted at once, each into a buffer of its own. Vectors larger than
 * tree_segment's go in segments of that size, pipelined up the tree: a segment is
 * combined as soon as the children's have come, while it is still in cache, and sent on
 * while the next arrive (the order of the operands of every element is the same either
 * way, so is the result, bit for bit). */
static gcoll_status_t reduce_tree(const gcoll_coll_t *ctx, guard_t *gd, const uint8_t *send,
                                  uint8_t *recv, size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                  int root, uint32_t sig, int chain)
{
    const int P = ctx->size, vr = wrap(ctx->rank - root + P, P);
    const size_t esz = gcoll_dtype_size(dtype), bytes = count * esz;
    gcoll_tree_pos_t t = chain ? chain_pos(vr, P) : gcoll_tree_pos(vr, P);
    const int own = vr && t.nchild; /* a non-root rank with children combines into a temporary */
    /* The first child's segments land in the accumulator itself unless that is the input
     * (the root in place), and gcoll_reduce_rev combines the input into them: the same
     * operands in the same order as a copy of the input then gcoll_reduce_local, without
     * the copy's pass. The temporary: this rank's accumulator (own), then the buffers of
     * the other children. */
    const int into_acc = t.nchild && !(vr == 0 && send == recv);
    const size_t ntmp = (size_t)(own + t.nchild - into_acc) * bytes;
    uint8_t *tmp = NULL;
    if (ntmp && !(tmp = gcoll_coll_scratch(ctx, ntmp))) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the reduce tree", ntmp);
        return GCOLL_ERR_NOMEM;
    }
    uint8_t *acc = vr ? (own ? tmp : (uint8_t *)send) : recv;
#define CHILD_BUF(c) ((c) == 0 && into_acc ? acc : tmp + (size_t)(own + (c)-into_acc) * bytes)
    const int parent = wrap(t.parent + root, P);
    const size_t chunk = tree_segment(ctx);
    /* segments: whole elements, at least one; one segment without dividing (a 64-bit
     * division is tens of cycles, and a small call's segments took three) */
    const int one = bytes <= chunk;
    const size_t seg_elems = one ? GCOLL_MAX(count, (size_t)1) : GCOLL_MAX(chunk / esz, (size_t)1);
    const size_t nseg = one ? 1 : GCOLL_MAX(GCOLL_DIV_UP(count, seg_elems), (size_t)1);
    /* the children's segments, their words, the parent's word, the segments sent */
    const size_t nreq = (size_t)t.nchild * nseg + (size_t)t.nchild + 1 + nseg;
    gcoll_treq_t small[68], *req = small; /* each written whole when posted */
    if (nreq > sizeof(small) / sizeof(small[0]) && !(req = malloc(nreq * sizeof(*req)))) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate the reduce tree's %zu requests", nreq);
        return GCOLL_ERR_NOMEM;
    }
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    for (int c = 0; c < t.nchild; c++) /* req[c * nseg + k]: child c's segment k */
        for (size_t k = 0; k < nseg; k++) {
            size_t off = k * seg_elems * esz, len = GCOLL_MIN(seg_elems * esz, bytes - off);
            GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], wrap(vr + (1 << c) + root, P),
                                                 (uint32_t)k, sig, CHILD_BUF(c) + off, len, 0),
                             st, out);
        }
    for (int c = 0; c < t.nchild; c++)
        GCOLL_CHECK_GOTO(tell_ready(ctx, req, &n, wrap(vr + (1 << c) + root, P), bytes, sig), st,
                         out);
    const int nrx = n; /* the children's segments and words */
    int word = -1;     /* the parent's word, when it sends one */
    if (vr) {
        int before = n;
        GCOLL_CHECK_GOTO(post_ready(ctx, req, &n, parent, bytes, sig), st, out);
        if (n > before)
            word = before;
    }
    const int tx0 = n;
    for (size_t k = 0; k < nseg; k++) {
        size_t off = k * seg_elems * esz, len = GCOLL_MIN(seg_elems * esz, bytes - off);
        /* each child's part of the segment as it comes, in the order of their distance */
        const size_t elems = len / esz;
        for (int c = 0; c < t.nchild; c++) {
            GCOLL_CHECK_GOTO(wait_guarded(gd, &req[(size_t)c * nseg + k], 1), st, out);
            if (c == 0 && into_acc)
                gcoll_reduce_rev(acc + off, send + off, elems, dtype, op);
            else
                gcoll_reduce_local(acc + off, CHILD_BUF(c) + off, elems, dtype, op);
        }
        if (vr) {
            if (word >= 0) {
                GCOLL_CHECK_GOTO(wait_guarded(gd, &req[word], 1), st, out);
                word = -1;
            }
            GCOLL_CHECK_GOTO(
                gcoll_channel_isend(ctx->ch, &req[n++], parent, (uint32_t)k, sig, acc + off, len),
                st, out);
        }
    }
    /* the children's words, then the segments sent */
    GCOLL_CHECK_GOTO(wait_guarded(gd, req + (size_t)t.nchild * nseg, nrx - t.nchild * (int)nseg),
                     st, out);
    st = wait_guarded(gd, req + tx0, n - tx0);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    if (req != small)
        free(req);
    return st;
#undef CHILD_BUF
}

/* Balanced split of n items into k parts: part i. */
static gcoll_span_t split(size_t n, size_t k, size_t i)
{
    size_t base = n / k, extra = n % k;
    return (gcoll_span_t){i * base + GCOLL_MIN(i, extra), base + (i < extra)};
}

/* Rabenseifner's reduce: a ring reduce-scatter leaves block r of the vector reduced on
 * rank r (rs_shift -1), and every rank sends its block straight to the root, which
 * receives it in place. In slices of at most GCOLL_RING_SLICE bytes, so that the working
 * copy of the other ranks stays bounded; out of place the ring reduces into that copy (or
 * the root's recvbuf) from sendbuf, so no rank copies its input first. */
static gcoll_status_t reduce_direct(const gcoll_coll_t *ctx, guard_t *gd, const uint8_t *send,
                                    uint8_t *recv, size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                    int root, uint32_t sig)
{
    const size_t P = (size_t)ctx->size, r = (size_t)ctx->rank, esz = gcoll_dtype_size(dtype);
    const int at_root = ctx->rank == root, inplace = at_root && send == recv;
    const size_t slice = GCOLL_MIN(count, GCOLL_MAX(ctx->cfg->ring_slice / esz, P));
    const size_t chunk_elems = GCOLL_MAX(ctx->cfg->ring_chunk / esz, (size_t)1);
    /* the root works in recvbuf; in place, the ring needs a temporary for what it
     * receives; elsewhere the working copy is the temporary */
    uint8_t *scratch = at_root && !inplace ? NULL : gcoll_coll_scratch(ctx, slice * esz);
    gcoll_span_t *seg = calloc(P, sizeof(*seg));
    gcoll_treq_t *req = calloc(2 * P, sizeof(*req));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    int n = 0;
    if ((!at_root || inplace) && !scratch) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the reduce", slice * esz);
        goto out;
    }
    if (!seg || !req)
        goto out;
    st = GCOLL_OK;
    gcoll_ring_plan_t plan = {.seg = seg,
                              .esz = esz,
                              .dtype = dtype,
                              .op = op,
                              .rs_steps = P - 1,
                              .rs_shift = -1,
                              .sig = sig};
    for (size_t off = 0; off < count; off += slice) {
        size_t len = GCOLL_MIN(slice, count - off);
        for (size_t i = 0; i < P; i++) {
            gcoll_span_t s = split(len, P, i);
            seg[i] = (gcoll_span_t){s.off * esz, s.len * esz};
        }
        plan.buf = at_root ? recv + off * esz : scratch;
        plan.src = inplace ? NULL : send + off * esz;
        plan.tmp = inplace ? scratch : NULL;
        uint32_t nsub =
            (uint32_t)((P - 1) *
                       GCOLL_MAX(GCOLL_DIV_UP(GCOLL_DIV_UP(len, P), chunk_elems), (size_t)1));
        uint32_t gsub = plan.sub0 + nsub + 1; /* sub0 + nsub: the ring's handshake */
        /* large slices as the ring allreduce's: the handshake first */
        if (len * esz >= READY_MIN)
            GCOLL_CHECK_GOTO(gcoll_ring_run_ready(ctx, &plan, plan.sub0 + nsub), st, out);
        else
            GCOLL_CHECK_GOTO(gcoll_ring_run(ctx, &plan), st, out);
        n = 0;
        if (at_root) {
            for (size_t i = 0; i < P; i++)
                if (i != r && seg[i].len) {
                    GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], (int)i, gsub, sig,
                                                         plan.buf + seg[i].off, seg[i].len, 0),
                                     st, out);
                    GCOLL_CHECK_GOTO(tell_ready(ctx, req, &n, (int)i, seg[i].len, sig), st, out);
                }
        } else if (seg[r].len) {
            GCOLL_CHECK_GOTO(post_ready(ctx, req, &n, root, seg[r].len, sig), st, out);
            if (!gcoll_channel_send_held(ctx->ch, root, seg[r].len))
                GCOLL_CHECK_GOTO(wait_guarded(gd, req, n), st, out);
            GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], root, gsub, sig,
                                                 plan.buf + seg[r].off, seg[r].len),
                             st, out);
        }
        GCOLL_CHECK_GOTO(wait_guarded(gd, req, n), st, out);
        n = 0;
        plan.sub0 = gsub + 1;
    }
out:
    if (st != GCOLL_OK && req)
        gcoll_channel_cancel(ctx->ch, req, n);
    free(req);
    free(seg);
    return st;
}

/* Linear reduce (Open MPI's basic linear, which its tuned reduce takes below 8 ranks and
 * 512 bytes): every rank sends its vector straight to the root, which combines them in a
 * fixed order, its own input first, then rank root + 1, root + 2 and so on, each as soon as
 * it has come. No rank waits for another's partial result, as the tree's inner ranks do:
 * with ranks sharing cores, each such wait is a hand-off between them. */
static gcoll_status_t reduce_linear(const gcoll_coll_t *ctx, guard_t *gd, const uint8_t *send,
                                    uint8_t *recv, size_t count, gcoll_dtype_t dtype, gcoll_op_t op,
                                    int root, uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    const size_t bytes = count * gcoll_dtype_size(dtype);
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    if (r != root) {
        gcoll_treq_t two[2];
        GCOLL_CHECK_GOTO(post_ready(ctx, two, &n, root, bytes, sig), st, out1);
        if (n && !gcoll_channel_send_held(ctx->ch, root, bytes))
            GCOLL_CHECK_GOTO(wait_guarded(gd, two, n), st, out1);
        GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &two[n++], root, 0, sig, send, bytes), st,
                         out1);
        st = wait_guarded(gd, two, n);
    out1:
        if (st != GCOLL_OK)
            gcoll_channel_cancel(ctx->ch, two, n);
        return st;
    }
    uint8_t *tmp = gcoll_coll_scratch(ctx, (size_t)(P - 1) * bytes);
    if (!tmp) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the linear reduce",
                                (size_t)(P - 1) * bytes);
        return GCOLL_ERR_NOMEM;
    }
    /* req[k - 1]: rank root + k's vector; after them the ready words of large ones */
    gcoll_treq_t small[2 * 16], *req = small;
    if (P > 16 && !(req = malloc(2 * (size_t)P * sizeof(*req)))) {
        gcoll_channel_set_error(ctx->ch, "cannot allocate the linear reduce's %d requests", 2 * P);
        return GCOLL_ERR_NOMEM;
    }
    for (int k = 1; k < P; k++)
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], (root + k) % P, 0, sig,
                                             tmp + (size_t)(k - 1) * bytes, bytes, 0),
                         st, out);
    for (int k = 1; k < P; k++)
        GCOLL_CHECK_GOTO(tell_ready(ctx, req, &n, (root + k) % P, bytes, sig), st, out);
    if (send != recv)
        memcpy(recv, send, bytes);
    for (int k = 1; k < P; k++) {
        GCOLL_CHECK_GOTO(wait_guarded(gd, &req[k - 1], 1), st, out);
        gcoll_reduce_local(recv, tmp + (size_t)(k - 1) * bytes, count, dtype, op);
    }
    st = wait_guarded(gd, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    if (req != small)
        free(req);
    return st;
}

gcoll_status_t gcoll_reduce_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, gcoll_op_t op, int root,
                                gcoll_rooted_algo_t algo)
{
    const size_t bytes = count * gcoll_dtype_size(dtype);
    const int at_root = ctx->rank == root;
    if (ctx->size == 1) {
        if (bytes && sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, bytes);
        gcoll_reduce_finish(recvbuf, count, dtype, op, 1);
        return GCOLL_OK;
    }
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_REDUCE, count, dtype, op, root);
    guard_t gd;
    gcoll_status_t st;
    GCOLL_CHECK_GOTO(guard_start(&gd, ctx, GCOLL_KIND_REDUCE, count, root, sig), st, out);
    if (bytes) {
        if (algo == GCOLL_ROOTED_DIRECT)
            st = reduce_direct(ctx, &gd, sendbuf, recvbuf, count, dtype, op, root, sig);
        else if (algo == GCOLL_ROOTED_LINEAR)
            st = reduce_linear(ctx, &gd, sendbuf, recvbuf, count, dtype, op, root, sig);
        else
            st = reduce_tree(ctx, &gd, sendbuf, recvbuf, count, dtype, op, root, sig,
                             algo == GCOLL_ROOTED_CHAIN);
        GCOLL_CHECK_GOTO(st, st, out);
    }
    GCOLL_CHECK_GOTO(guard_finish(&gd), st, out);
    if (at_root)
        gcoll_reduce_finish(recvbuf, count, dtype, op, ctx->size);
    ctx->ch->counters.bytes_raw += bytes;
    return GCOLL_OK;
out:
    return st;
}

/* ---- gather and scatter ---------------------------------------------------------------- */

/* The root's blocks from rank order into virtual-rank order (virtual rank v is rank
 * (v + root) % P): a rotation by root blocks, two copies. */
static void rotate_to_virtual(uint8_t *dst, const uint8_t *src, size_t block, int P, int root)
{
    size_t head = (size_t)(P - root) * block, tail = (size_t)root * block;
    memcpy(dst, src + tail, head);
    memcpy(dst + head, src, tail);
}

/* Whether the root's child at virtual rank cv (csize blocks) lands on consecutive ranks of
 * recvbuf, so that it can be received in place. */
static int child_in_place(int cv, size_t csize, int root, int P)
{
    return (size_t)(wrap(cv + root, P)) + csize <= (size_t)P;
}

/* A rank's own block, copied while its children's blocks arrive: in pieces that double
 * from OWN_PIECE, the transport moved along between them, so that a child's single copy
 * (which the child writes, GCOLL_TREQ_RECEIVER_BUSY) starts as soon as its descriptor is
 * here rather than after this copy. Doubling keeps the progress calls to a few: the
 * descriptor comes within microseconds or late. */
#define OWN_PIECE ((size_t)32 << 10)

static void copy_own(const gcoll_coll_t *ctx, uint8_t *dst, const uint8_t *src, size_t len)
{
    size_t off = 0;
    for (size_t k = OWN_PIECE; len - off > k; k *= 2) {
        memcpy(dst + off, src + off, k);
        off += k;
        gcoll_channel_progress(ctx->ch, 0);
    }
    memcpy(dst + off, src + off, len - off);
}

/* Binomial gather: each rank collects its subtree's blocks (virtual ranks vr .. vr+size-1,
 * in that order) and sends them to its parent in one message. The root receives each
 * child's subtree straight into its place in recvbuf when the subtree's ranks are
 * consecutive there, else into a temporary it copies from at the end; every rank copies
 * its own block while its children's arrive (2 ranks over TCP, 16 MiB: 3.5 ms with the
 * root's copies of the whole through a temporary, 2.7 ms without; Open MPI 2.1 ms). */
static gcoll_status_t gather_tree(const gcoll_coll_t *ctx, guard_t *gd, const uint8_t *send,
                                  uint8_t *recv, size_t block, int root, uint32_t sig)
{
    const int P = ctx->size, vr = wrap(ctx->rank - root + P, P);
    gcoll_tree_pos_t t = gcoll_tree_pos(vr, P);
    uint8_t *buf = NULL; /* a non-root parent's subtree, or the root's wrapped children */
    int wrapped = 0;     /* root: children whose ranks wrap past P - 1 in recvbuf */
    for (int c = 0; vr == 0 && c < t.nchild; c++)
        wrapped |= !child_in_place(1 << c, (size_t)gcoll_tree_pos(1 << c, P).size, root, P);
    if (t.nchild && (vr || wrapped)) {
        buf = gcoll_coll_scratch(ctx, (size_t)t.size * block);
        if (!buf) {
            gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the gather tree",
                                    (size_t)t.size * block);
            return GCOLL_ERR_NOMEM;
        }
    }
    const int parent = wrap(t.parent + root, P);
    gcoll_treq_t req[68]; /* written whole when posted, as reduce_tree's */
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    for (int c = 0; c < t.nchild; c++) {
        int cv = vr + (1 << c), cr = wrap(cv + root, P);
        size_t csize = (size_t)gcoll_tree_pos(cv, P).size;
        uint8_t *dst = vr == 0 && child_in_place(cv, csize, root, P)
                           ? recv + (size_t)cr * block
                           : buf + (size_t)(1 << c) * block;
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], cr, 0, sig, dst, csize * block,
                                             GCOLL_TREQ_RECEIVER_BUSY),
                         st, out);
        GCOLL_CHECK_GOTO(tell_ready(ctx, req, &n, cr, csize * block, sig), st, out);
    }
    if (vr)
        GCOLL_CHECK_GOTO(post_ready(ctx, req, &n, parent, (size_t)t.size * block, sig), st, out);
    /* a leaf whose block the parent's transport holds without its data sends at once */
    const int early = vr && !t.nchild && gcoll_channel_send_held(ctx->ch, parent, block);
    if (early)
        GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], parent, 0, sig, send, block), st,
                         out);
    if (vr && t.nchild)
        copy_own(ctx, buf, send, block);
    else if (!vr && send != recv + (size_t)root * block)
        copy_own(ctx, recv + (size_t)root * block, send, block);
    GCOLL_CHECK_GOTO(wait_guarded(gd, req, n), st, out);
    if (vr) {
        if (!early) {
            GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], parent, 0, sig,
                                                 buf ? buf : send, (size_t)t.size * block),
                             st, out);
            st = wait_guarded(gd, &req[n - 1], 1);
        }
    } else {
        for (int c = 0; c < t.nchild; c++) { /* the wrapped children, block by block */
            int cv = 1 << c;
            size_t csize = (size_t)gcoll_tree_pos(cv, P).size;
            if (child_in_place(cv, csize, root, P))
                continue;
            for (size_t k = 0; k < csize; k++)
                memcpy(recv + (size_t)((cv + root + (int)k) % P) * block,
                       buf + ((size_t)cv + k) * block, block);
        }
    }
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    return st;
}

/* Binomial scatter: the root sends each child its subtree's blocks in one message, largest
 * subtree first (it has the longest way to go); every rank keeps its own block and passes
 * the rest down the same way. */
static gcoll_status_t scatter_tree(const gcoll_coll_t *ctx, guard_t *gd, const uint8_t *send,
                                   uint8_t *recv, size_t block, int root, uint32_t sig)
{
    const int P = ctx->size, vr = wrap(ctx->rank - root + P, P);
    gcoll_tree_pos_t t = gcoll_tree_pos(vr, P);
    const uint8_t *buf = send; /* this rank's subtree's blocks, in virtual order */
    gcoll_treq_t req[68];      /* written whole when posted, as reduce_tree's */
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    if (vr == 0 && root != 0) { /* rank order is not virtual order: rotate first */
        uint8_t *tmp = gcoll_coll_scratch(ctx, (size_t)P * block);
        if (!tmp) {
            gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the scatter tree",
                                    (size_t)P * block);
            return GCOLL_ERR_NOMEM;
        }
        rotate_to_virtual(tmp, send, block, P, root);
        buf = tmp;
    } else if (vr) {
        uint8_t *in = recv; /* a leaf receives its block in place */
        if (t.nchild) {
            in = gcoll_coll_scratch(ctx, (size_t)t.size * block);
            if (!in) {
                gcoll_channel_set_error(ctx->ch, "cannot allocate %zu bytes for the scatter tree",
                                        (size_t)t.size * block);
                return GCOLL_ERR_NOMEM;
            }
        }
        GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], wrap(t.parent + root, P), 0, sig,
                                             in, (size_t)t.size * block, 0),
                         st, out);
        GCOLL_CHECK_GOTO(
            tell_ready(ctx, req, &n, wrap(t.parent + root, P), (size_t)t.size * block, sig), st,
            out);
        buf = in;
    }
    for (int c = t.nchild - 1; c >= 0; c--) /* the children's word, heard while receiving */
        GCOLL_CHECK_GOTO(post_ready(ctx, req, &n, wrap(vr + (1 << c) + root, P),
                                    (size_t)gcoll_tree_pos(vr + (1 << c), P).size * block, sig),
                         st, out);
    GCOLL_CHECK_GOTO(wait_guarded(gd, req, n), st, out);
    for (int c = t.nchild - 1; c >= 0; c--) {
        int cv = vr + (1 << c);
        size_t csize = (size_t)gcoll_tree_pos(cv, P).size;
        GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &req[n++], wrap(cv + root, P), 0, sig,
                                             buf + (size_t)(1 << c) * block, csize * block),
                         st, out);
    }
    /* this rank's own block, unless the root's is in place */
    if (buf != recv && !(vr == 0 && recv == send + (size_t)root * block))
        memcpy(recv, buf, block);
    st = wait_guarded(gd, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    return st;
}

/* Direct: the root posts one transfer per rank, all at once, straight between the
 * caller's buffers (the staggered order spreads the root's work over its peers). */
static gcoll_status_t rooted_direct(const gcoll_coll_t *ctx, guard_t *gd, int gather,
                                    const uint8_t *send, uint8_t *recv, size_t block, int root,
                                    uint32_t sig)
{
    const int P = ctx->size, r = ctx->rank;
    gcoll_treq_t *req = NULL;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    if (r != root) {
        gcoll_treq_t two[2] = {{0}};
        if (gather) {
            GCOLL_CHECK_GOTO(post_ready(ctx, two, &n, root, block, sig), st, out1);
            if (!gcoll_channel_send_held(ctx->ch, root, block))
                GCOLL_CHECK_GOTO(wait_guarded(gd, two, n), st, out1);
            GCOLL_CHECK_GOTO(gcoll_channel_isend(ctx->ch, &two[n++], root, 0, sig, send, block), st,
                             out1);
        } else {
            GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &two[n++], root, 0, sig, recv, block, 0),
                             st, out1);
            GCOLL_CHECK_GOTO(tell_ready(ctx, two, &n, root, block, sig), st, out1);
        }
        st = wait_guarded(gd, two, n);
    out1:
        if (st != GCOLL_OK)
            gcoll_channel_cancel(ctx->ch, two, n);
        return st;
    }
    req = calloc(2 * (size_t)P, sizeof(*req));
    if (!req)
        return GCOLL_ERR_NOMEM;
    for (int k = 1; k < P; k++) {
        int i = (r + k) % P;
        if (gather) {
            GCOLL_CHECK_GOTO(gcoll_channel_irecv(ctx->ch, &req[n++], i, 0, sig,
                                                 recv + (size_t)i * block, block,
                                                 GCOLL_TREQ_RECEIVER_BUSY),
                             st, out);
            GCOLL_CHECK_GOTO(tell_ready(ctx, req, &n, i, block, sig), st, out);
        } else {
            GCOLL_CHECK_GOTO(post_ready(ctx, req, &n, i, block, sig), st, out);
        }
    }
    if (!gather) { /* every rank's word (large blocks), then every block at once */
        int held = 1;
        for (int k = 1; k < P; k++)
            held &= gcoll_channel_send_held(ctx->ch, (r + k) % P, block);
        if (!held)
            GCOLL_CHECK_GOTO(wait_guarded(gd, req, n), st, out);
        for (int k = 1; k < P; k++) {
            int i = (r + k) % P;
            GCOLL_CHECK_GOTO(
                gcoll_channel_isend(ctx->ch, &req[n++], i, 0, sig, send + (size_t)i * block, block),
                st, out);
        }
    }
    /* the root's own block, unless in place */
    if (gather && send != recv + (size_t)r * block)
        copy_own(ctx, recv + (size_t)r * block, send, block);
    if (!gather && recv != send + (size_t)r * block)
        memcpy(recv, send + (size_t)r * block, block);
    st = wait_guarded(gd, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_channel_cancel(ctx->ch, req, n);
    free(req);
    return st;
}

static gcoll_status_t rooted_move(const gcoll_coll_t *ctx, int kind, const void *sendbuf,
                                  void *recvbuf, size_t count, gcoll_dtype_t dtype, int root,
                                  gcoll_rooted_algo_t algo)
{
    const size_t block = count * gcoll_dtype_size(dtype);
    const int P = ctx->size, gather = kind == GCOLL_KIND_GATHER;
    const uint8_t *send = sendbuf;
    uint8_t *recv = recvbuf;
    if (P == 1) {
        if (block && send != recv)
            memcpy(recv, send, block);
        return GCOLL_OK;
    }
    uint32_t sig = gcoll_call_sig(kind, count, dtype, 0, root);
    guard_t gd;
    gcoll_status_t st;
    GCOLL_CHECK_GOTO(guard_start(&gd, ctx, kind, count, root, sig), st, out);
    ctx->ch->op_bytes = block * (size_t)P; /* its waits for words poll as its blocks' do */
    if (block) {
        if (algo == GCOLL_ROOTED_DIRECT)
            st = rooted_direct(ctx, &gd, gather, send, recv, block, root, sig);
        else if (gather)
            st = gather_tree(ctx, &gd, send, recv, block, root, sig);
        else
            st = scatter_tree(ctx, &gd, send, recv, block, root, sig);
        GCOLL_CHECK_GOTO(st, st, out);
    }
    GCOLL_CHECK_GOTO(guard_finish(&gd), st, out);
    ctx->ch->counters.bytes_raw += block;
    return GCOLL_OK;
out:
    return st;
}

gcoll_status_t gcoll_gather_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, gcoll_dtype_t dtype, int root,
                                gcoll_rooted_algo_t algo)
{
    return rooted_move(ctx, GCOLL_KIND_GATHER, sendbuf, recvbuf, count, dtype, root, algo);
}

gcoll_status_t gcoll_scatter_run(const gcoll_coll_t *ctx, const void *sendbuf, void *recvbuf,
                                 size_t count, gcoll_dtype_t dtype, int root,
                                 gcoll_rooted_algo_t algo)
{
    return rooted_move(ctx, GCOLL_KIND_SCATTER, sendbuf, recvbuf, count, dtype, root, algo);
}
