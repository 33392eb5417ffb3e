/* select.c: allreduce algorithm choice by an alpha-beta-gamma cost model (Hockney's model
 * as used by Thakur, Rabenseifner & Gropp 2005), or by GCOLL_ALGO. */
#include <stdio.h>

#include "collectives/coll.h"
#include "base/util.h"

const char *const gcoll_algo_names[] = {"auto", "ring", "rhd", "tree", "rd"};

/* Per-step cost, per-byte wire time and per-byte reduction time, fitted to gcoll-bench on
 * loopback TCP on a 2-core VM (docs/results/dense-allreduce.md): what matters is their ratios,
 * which decide where the algorithms cross over; ALPHA_NS is well above a message's latency (5-15 us
 * here) because it also stands for what a step costs beyond its bytes (hand-offs, the ring's
 * per-slice handshake, pipeline fill). A tree step is a one-way message, charged half.
 * Halving-doubling's wire time is charged RHD_WIRE times its bytes where the ring's is charged
 * once: its steps move one whole message and then reduce it, one after the other, where the ring
 * overlaps them chunk by chunk. Refitted after blocking waits began to poll (GCOLL_SPIN_US) to the
 * fastest algorithm measured at each size, 8 B to 64 MiB (time per operation, 3 runs each):
 * recursive doubling up to 128 KiB on 2 and 3 ranks and 64 KiB on 4; the ring from 256 KiB on 2 and
 * 3 ranks (the fit picks it from 128 KiB on 3, where recursive doubling measured 1.2x faster: the
 * one miss); on 4 ranks halving-doubling at 128 KiB-2 MiB (256 KiB: 225-270 us against the ring's
 * 362-368 and recursive doubling's 351-457) and the ring from 4 MiB. Refitted once the
 * ring kept one chunk in flight on oversubscribed hosts (GCOLL_RING_DEPTH=-1) and waits
 * stopped yielding to peers on other CPUs: 4 ranks at 1 MiB, the ring 1.73-1.80 GB/s
 * against halving-doubling's 1.23-1.36 over TCP, 2.45-2.51 against 1.97-2.60 over UCX
 * (4 runs each); at 128 KiB halving-doubling still ahead of recursive doubling (111-119
 * us against 153-170 over TCP, 71-87 against 100-117 over UCX) and level or ahead of the
 * ring at 256 KiB. Halving-doubling's wire charge went from 2.1 to RHD_WIRE and its steps
 * to RHD_STEP of a step, which moves its crossover with the ring on 4 ranks from 2 MiB to
 * about 600 KiB and leaves the others (recursive doubling to 128 KiB on 2 ranks and 64
 * KiB on 3 and 4, the ring from 256 KiB on 2 and 128 KiB on 3) where they were. */
#define ALPHA_NS GCOLL_COST_ALPHA_NS
#define BETA_NS GCOLL_COST_BETA_NS
#define GAMMA_NS GCOLL_COST_GAMMA_NS
#define RHD_WIRE 2.8
#define RHD_STEP 0.87

/* Estimated time in ns of each algorithm for n bytes on P ranks. */
static double cost(gcoll_algo_t a, double n, int P)
{
    double f = (double)(P - 1) / P;
    int p2 = 1 << (gcoll_ceil_log2(P + 1) - 1), lg = gcoll_ceil_log2(p2);
    switch (a) {
    case GCOLL_ALGO_RING:
        /* pipelined: reduction overlaps the transfer of the next chunk */
        return 2.0 * (P - 1) * ALPHA_NS + 2.0 * f * n * BETA_NS;
    case GCOLL_ALGO_RHD: {
        double fp = (double)(p2 - 1) / p2;
        double c = 2.0 * lg * RHD_STEP * ALPHA_NS + RHD_WIRE * fp * n * BETA_NS + fp * n * GAMMA_NS;
        if (p2 != P) /* fold-in and fold-out of the extra ranks: full vectors */
            c += 2.0 * ALPHA_NS + 2.0 * n * BETA_NS + n * GAMMA_NS;
        return c;
    }
    case GCOLL_ALGO_TREE: {
        int l = gcoll_ceil_log2(P);
        return l * ALPHA_NS + 2.0 * l * n * BETA_NS + l * n * GAMMA_NS;
    }
    case GCOLL_ALGO_RD: {
        /* lg exchanges of the whole vector, plus a one-way fold in and out: the tree's
         * figure on every P. It wins the tie: both partners' messages travel at once, so
         * where the ranks have cores of their own an exchange costs one message time, not
         * two (2 ranks, 8 B: 4.6 us against the tree's 8.3; 64 KiB: 22 against 34), and
         * on 4 ranks sharing 2 cores it measured even with the tree up to 64 KiB. */
        double c = lg * (ALPHA_NS + 2.0 * n * BETA_NS + n * GAMMA_NS);
        if (p2 != P)
            c += ALPHA_NS + 2.0 * n * BETA_NS + n * GAMMA_NS;
        return c;
    }
    default:
        return 1e300;
    }
}

gcoll_algo_t gcoll_algo_select(const gcoll_coll_t *ctx, size_t bytes, char *why, size_t len)
{
    if (ctx->cfg->algo != GCOLL_ALGO_AUTO) {
        if (why)
            snprintf(why, len, "GCOLL_ALGO=%s", gcoll_algo_names[ctx->cfg->algo]);
        return (gcoll_algo_t)ctx->cfg->algo;
    }
    /* Ties go to the earlier (recursive doubling, tree, rhd, ring); equal figures summed in
     * another order must tie too, hence the relative margin. */
    static const gcoll_algo_t order[] = {GCOLL_ALGO_RD, GCOLL_ALGO_TREE, GCOLL_ALGO_RHD,
                                         GCOLL_ALGO_RING};
    gcoll_algo_t best = GCOLL_ALGO_RING;
    double bc = 1e300, c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = cost(order[i], (double)bytes, ctx->size);
        if (c[i] < bc * (1.0 - 1e-9)) {
            bc = c[i];
            best = order[i];
        }
    }
    if (why)
        snprintf(why, len,
                 "cost model for %zu bytes on %d ranks: rd %.0f us, tree %.0f us, rhd %.0f us, "
                 "ring %.0f us",
                 bytes, ctx->size, c[0] / 1e3, c[1] / 1e3, c[2] / 1e3, c[3] / 1e3);
    return best;
}
