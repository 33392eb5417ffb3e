/* rooted_select.c: which algorithm a reduce, gather or scatter takes (GCOLL_ROOTED_ALGO;
 * auto: a cost model with the allreduce model's alpha-beta figures and a charge for each
 * message the root of a direct transfer handles, fitted to measurements in
 * docs/results/rooted.md). The algorithms themselves are in rooted.c. */
#include <stdio.h>
#include <string.h>

#include "collectives/coll.h"

const char *const gcoll_rooted_algo_names[] = {"auto", "tree", "direct", "chain", "linear"};

/* What each message handled at the root of a direct transfer costs there beyond its
 * bytes (one more receive or send to post, complete and hand off). Fitted to the rooted
 * calls timed with each form forced on 2-5 ranks over TCP loopback on a 2-core VM under
 * a load of 9-10 from other jobs (docs/results/rooted.md; runs of one size differ up to
 * 2x): below 8 KiB the tree took 100-250 us and the direct forms 150-450 (reduce: 2
 * steps against P, the difference 2 alpha + 3 of these on 4 ranks); from 32-128 KiB
 * direct gather and scatter were ahead on 4 ranks, and reduce-scatter then gather on 4
 * and 5 ranks at 128-512 KiB (1.2-4x); at 2-8 MiB the two reduces were within the noise
 * of each other on 4 and 5 ranks, and the tree ahead on 2 (8 MiB: 14-21 ms against
 * 18-36). The model switches reduce at 6 MiB on 2 ranks, 384 KiB on 3 and 5, 768 KiB on
 * 4. Reduce's direct form only: gather and scatter have their own (GS_ROOT_MSG_NS). */
#define ROOT_MSG_NS 28000.0
/* The same for a direct gather's or scatter's blocks, refitted on the idle VM: 4, 8 and
 * 16 ranks on 2 cores, tree against direct forced (docs/results/rooted.md): over TCP
 * direct was ahead at every size (gather, 8 B per block: 4 ranks 5.2-5.6 us against
 * 9.0-13.1, 8 ranks 12.2-14.2 against 17.9-26.9, 16 ranks 27-34 against 41-49; 2 KiB per
 * block on 8 ranks: 23-25 against 40-42), over UCX's shared memory too (4 ranks, 8 B per
 * block: 0.30 against 0.39); a rank more in a direct gather cost its root about 2 us over
 * TCP. With 28 us the tree was chosen below 8 KiB per block on 4 ranks and from 7 ranks,
 * at up to 2.4x the time. Open MPI's tuned gather is linear below 11 ranks for small
 * blocks. The model now takes the direct form from 3 ranks at every size up to 64 ranks
 * (on 2 ranks both are one message: the tree). */
#define GS_ROOT_MSG_NS 2000.0

/* Blocks that cross a link in the binomial tree: each rank's whole subtree goes to its
 * parent, so a block travels once per level it climbs. */
static double tree_blocks(int P)
{
    double f = 0;
    for (int vr = 1; vr < P; vr++)
        f += gcoll_tree_pos(vr, P).size;
    return f;
}

/* Estimated ns of each algorithm for n bytes per rank (reduce: the vector; gather and
 * scatter: one block) on P ranks, with select.c's figures. */
static double rooted_cost(int kind, gcoll_rooted_algo_t a, double n, int P)
{
    const double lg = gcoll_ceil_log2(P), f = (double)(P - 1) / P;
    if (kind == GCOLL_KIND_REDUCE) {
        if (a == GCOLL_ROOTED_TREE) /* every level: one whole vector in and reduced */
            return lg * (GCOLL_COST_ALPHA_NS + n * GCOLL_COST_BETA_NS + n * GCOLL_COST_GAMMA_NS);
        if (a == GCOLL_ROOTED_LINEAR) /* every vector straight to the root, which sums them */
            return GCOLL_COST_ALPHA_NS +
                   (P - 1) * (GS_ROOT_MSG_NS + n * GCOLL_COST_BETA_NS + n * GCOLL_COST_GAMMA_NS);
        /* ring reduce-scatter (P-1 steps), then the blocks to the root */
        return P * GCOLL_COST_ALPHA_NS + 2.0 * f * n * GCOLL_COST_BETA_NS +
               f * n * GCOLL_COST_GAMMA_NS + (P - 1) * ROOT_MSG_NS;
    }
    if (a == GCOLL_ROOTED_TREE)
        return lg * GCOLL_COST_ALPHA_NS + tree_blocks(P) * n * GCOLL_COST_BETA_NS;
    return GCOLL_COST_ALPHA_NS + (P - 1) * (GS_ROOT_MSG_NS + n * GCOLL_COST_BETA_NS);
}

/* The largest reduce that goes linear through shared-memory mailboxes (gcoll_rooted_select). */
#define LINEAR_MESH_MAX ((size_t)2 << 10)

/* The chain where every rank has mailboxes with every other, 3 to 8 ranks, 512 KiB up to
 * 4 MiB. Each rank sums one incoming vector, a segment at a time, and passes it on: the
 * sum and the copies are spread over every rank, where the binomial tree's root takes in
 * log2 P vectors. Medians of 3-5 alternated runs on 2 cores (docs/results/rooted.md), us:
 * 1 MiB on 3 ranks 164-176 against 266-268 before (reduce-scatter then gather) and Open
 * MPI's 608-653, on 4 ranks 298-316 against 385-424 and 348-350, on 5 414-445 against
 * 512-529 and 461-472. At 256 KiB not ahead (5 ranks: 159 against the tree's 142), at
 * 32 KiB on 4 ranks behind (20.7 against 12.5), and at 4 MiB on 4 and 5 ranks reduce-
 * scatter then gather ahead (2.0 ms against 2.2, 2.6 against 3.1). Not measured beyond 5
 * ranks; the pipeline's fill grows with P, hence the cap. */
#define CHAIN_MAX_P 8
#define CHAIN_MIN ((size_t)512 << 10)
#define CHAIN_END ((size_t)4 << 20)

static int over_tcp(const gcoll_coll_t *ctx)
{
    const gcoll_transport_ops_t *ops = ctx->ch ? ctx->ch->ops : NULL;
    return ops && ops->name && !strcmp(ops->name, "tcp");
}

gcoll_rooted_algo_t gcoll_rooted_select(const gcoll_coll_t *ctx, int kind, size_t bytes, char *why,
                                        size_t len)
{
    if (ctx->cfg->rooted_algo != GCOLL_ROOTED_AUTO) {
        gcoll_rooted_algo_t a = (gcoll_rooted_algo_t)ctx->cfg->rooted_algo;
        if (a == GCOLL_ROOTED_CHAIN && kind != GCOLL_KIND_REDUCE)
            a = GCOLL_ROOTED_TREE; /* a chain would forward every block P - 2 times */
        if (a == GCOLL_ROOTED_LINEAR && kind != GCOLL_KIND_REDUCE)
            a = GCOLL_ROOTED_DIRECT; /* the same thing */
        if (why)
            snprintf(why, len, "GCOLL_ROOTED_ALGO=%s%s%s",
                     gcoll_rooted_algo_names[ctx->cfg->rooted_algo],
                     a != (gcoll_rooted_algo_t)ctx->cfg->rooted_algo ? " (reduce only): " : "",
                     a != (gcoll_rooted_algo_t)ctx->cfg->rooted_algo ? gcoll_rooted_algo_names[a]
                                                                     : "");
        return a;
    }
    if (kind == GCOLL_KIND_REDUCE && ctx->size == 2) {
        /* Two ranks: the pipelined tree (one vector to the root) against reduce-scatter then
         * gather (half a vector each way, half to the root). Over TCP both sides' CPUs copy
         * every byte, and the tree, which moves fewer, was ahead at every size from 256 KiB
         * to 64 MiB (1.3-1.6x). Through a shared-memory mailbox (tree_segment) the root sums
         * each segment while the next is written: ahead at 64 KiB to 16 MiB (1 MiB: 72 us
         * against 116, 16 MiB: 2.7 ms against 3.5). Through memory otherwise (UCX: one
         * copy, by the receiver) the form that splits the sum between the ranks was ahead
         * from 1 MiB (1.1-1.6x) and even at 256 KiB (docs/results/rooted.md). */
        const int mesh = gcoll_channel_mesh_max(ctx->ch) >= GCOLL_ROOTED_MESH_MIN;
        gcoll_rooted_algo_t a = bytes < ((size_t)512 << 10) || over_tcp(ctx) || mesh
                                    ? GCOLL_ROOTED_TREE
                                    : GCOLL_ROOTED_DIRECT;
        if (why)
            snprintf(why, len, "2 ranks over %s, %zu bytes: %s",
                     over_tcp(ctx) ? "tcp"
                     : mesh        ? "shared-memory mailboxes"
                                   : "memory or RDMA",
                     bytes, a == GCOLL_ROOTED_TREE ? "tree" : "direct");
        return a;
    }
    if (kind == GCOLL_KIND_REDUCE && ctx->size <= CHAIN_MAX_P && bytes >= CHAIN_MIN &&
        bytes < CHAIN_END && gcoll_channel_mesh_max(ctx->ch) >= GCOLL_ROOTED_MESH_MIN) {
        if (why)
            snprintf(why, len, "%d ranks with shared-memory mailboxes, %zu bytes: chain", ctx->size,
                     bytes);
        return GCOLL_ROOTED_CHAIN;
    }
    if (ctx->size == 2) { /* gather, scatter: one message either way; the model ties */
        if (why)
            snprintf(why, len, "2 ranks: one message either way: tree");
        return GCOLL_ROOTED_TREE;
    }
    double t = rooted_cost(kind, GCOLL_ROOTED_TREE, (double)bytes, ctx->size);
    double d = rooted_cost(kind, GCOLL_ROOTED_DIRECT, (double)bytes, ctx->size);
    /* A small reduce may go linear: below GCOLL_ROOTED_READY_MIN every vector goes at once,
     * unasked. Through shared-memory mailboxes only below LINEAR_MESH_MAX, where the tree's root
     * sums one 16 KiB record while the next is written (4 ranks over UCX's shared memory:
     * 512 B linear 0.41-0.47 us against the tree's 0.49; 4 KiB 1.87-1.93 against 1.55-1.63;
     * 32 KiB 18-26 against 12-13). Over TCP linear was ahead up to 32 KiB (8 B: 4.4 us
     * against 8.0; 4 KiB: 11-17 against 18; 32 KiB: 49-52 against 55-57). */
    const int mesh = gcoll_channel_mesh_max(ctx->ch) >= GCOLL_ROOTED_MESH_MIN;
    const int lin_ok =
        kind == GCOLL_KIND_REDUCE && bytes < (mesh ? LINEAR_MESH_MAX : GCOLL_ROOTED_READY_MIN);
    double l = lin_ok ? rooted_cost(kind, GCOLL_ROOTED_LINEAR, (double)bytes, ctx->size) : 0;
    if (why) {
        char lin[48] = "";
        if (lin_ok)
            snprintf(lin, sizeof(lin), ", linear %.0f us", l / 1e3);
        snprintf(why, len,
                 "cost model for %zu bytes per rank on %d ranks: tree %.0f us, direct %.0f us%s",
                 bytes, ctx->size, t / 1e3, d / 1e3, lin);
    }
    /* ties to the tree; the relative margin keeps the choice the same on every rank */
    gcoll_rooted_algo_t a = d < t * (1.0 - 1e-9) ? GCOLL_ROOTED_DIRECT : GCOLL_ROOTED_TREE;
    if (lin_ok && l < (a == GCOLL_ROOTED_DIRECT ? d : t) * (1.0 - 1e-9))
        a = GCOLL_ROOTED_LINEAR;
    return a;
}
