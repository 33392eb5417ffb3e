/* adapt_bucket.c: the bucketer's adaptation: after each step the ranks agree on what every
 * bucket measured (and on its sampled gradient values), and each adaptive bucket's rules
 * (adapt.h, adapt_stat.h) choose its next density or bit width; the mid-step check cuts
 * the densities of the buckets not yet started when the link slowed within a step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bucket/bucketer_int.h"
#include "collectives/coll.h"
#include "base/util.h"
#include "core/ops.h"

/* Swaps a bucket's compressor for a copy at another density (or, for a quantizer, bit
 * width bits > 0); the residuals stay. */
static gcoll_status_t set_codec(bucket_t *k, double d, unsigned bits)
{
    gcoll_compressor_t *c = malloc(sizeof(*c));
    if (!c)
        return GCOLL_ERR_NOMEM;
    *c = *k->comp;
    if (bits)
        gcoll_adapt_set_bits(c, bits, k->orig_q8);
    else
        gcoll_codec_set_density(c, d);
    k->state->c = c;
    if (k->state->server)
        k->state->server->c = c;
    gcoll_compressor_destroy(k->comp);
    k->comp = c;
    return GCOLL_OK;
}

gcoll_status_t gcoll_bucket_set_density(bucket_t *k, double d)
{
    return set_codec(k, d, 0);
}

/* Mid-step, after an adaptive bucket (on the progress thread, where every rank runs the
 * buckets in the same order): the ranks agree on its wire time (the shortest: the rank that
 * waited least for the others) and bytes with one tiny allreduce, and when the link turned
 * out much slower than the step was planned for, the buckets not yet started in this step
 * run at a density cut in proportion; the next decision at the end of the step restores the
 * controller's density. The same agreed numbers on every rank: the same cut everywhere. */
#define MIDSTEP_SUB 0xf0000000u /* message tags far above the bucket's own collective's */
gcoll_status_t gcoll_bucket_midstep(gcoll_comm_t *comm, bucket_t *k)
{
    gcoll_bucketer_t *b = k->b;
    double x[2] = {-(k->streamed ? k->wire_busy : k->run_s - k->comp_s), k->bytes};
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_ALLREDUCE, 2, GCOLL_FLOAT64, GCOLL_MAX, 0);
    GCOLL_CHECK(gcoll_ring_allreduce_at(comm, x, 2, GCOLL_FLOAT64, GCOLL_MAX, sig, MIDSTEP_SUB));
    /* against this bucket's own rate in the steps before: buckets differ (the first ones
     * share the CPU with the busiest part of backward) */
    if (k->bw.n < 2)
        return GCOLL_OK; /* one sample is not a history to compare with */
    double s = gcoll_midstep_scale(k->bw.bw, x[1], -x[0], b->window, b->mid_scale);
    b->mid_fired += s < 1;
    if (s < 1 || b->mid_scale < 1)
        GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                    "step %ld %s: %.0f bytes in %.1f ms of wire, %.1f MB/s "
                    "before: later buckets at %.3g of their density",
                    b->step, k->label, x[1], -x[0] * 1e3, k->bw.bw / 1e6, s);
    b->mid_scale = s;
    return GCOLL_OK;
}

/* The step's statistics: each adaptive bucket's sampled gradient values, one row per rank,
 * rode on the agreement (the MAX of -inf elsewhere gives every row exactly), and feed the
 * noise-scale, stage and energy signals. */
static void stat_update(gcoll_bucketer_t *b, const double *samp)
{
    const int P = b->comm->size;
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        if (!k->adaptive || !k->m)
            continue;
        double loc, glob;
        gcoll_snr_from_samples(P, k->m, GCOLL_SNR_SAMPLE,
                               samp + (size_t)j * (size_t)P * GCOLL_SNR_SAMPLE,
                               (double)k->count / (double)k->m, &loc, &glob);
        gcoll_sig_update(&k->sig, P, loc, glob);
    }
}

/* A quantizer bucket's width: the statistical need (or the spec's), raised by the phase,
 * capped by what its wire may take of the window. */
static gcoll_status_t decide_bits(gcoll_bucketer_t *b, bucket_t *k, double wire_j, double budget_j)
{
    unsigned now = gcoll_adapt_bits_of(k->comp);
    double need = gcoll_adapt_combine(0, gcoll_sig_need_bits(&k->sig, b->comm->size), 8, b->boost);
    int bw = (b->adapt & GCOLL_AR_BANDWIDTH) && b->bw.bw > 0;
    unsigned bits = gcoll_pick_bits(need, bw ? wire_j : 0, now, bw ? fmax(budget_j, 1e-9) : 0);
    GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                "adapt: step %ld bucket %d bits %u -> %u (need %.2f, wire "
                "%.2f ms of %.2f ms) noise_share %.4f stage %.4f boost %.2f",
                b->step, (int)(k - b->bk), now, bits, need, wire_j * 1e3, budget_j * 1e3,
                gcoll_snr_noise_share(&k->sig.snr, b->comm->size), k->sig.stage.stage, b->boost);
    return bits != now ? set_codec(k, 0, bits) : GCOLL_OK;
}

/* The bandwidth rule's density for bucket k (the controller with hysteresis and hold), or
 * 0 when bandwidth is not a rule. */
static double bw_cap(gcoll_bucketer_t *b, bucket_t *k, double target, double window,
                     double comp_all, long jumps, double bw_before, int mid_jump)
{
    if (!(b->adapt & GCOLL_AR_BANDWIDTH))
        return 0;
    /* the estimate jumped: the fits from before say nothing of the new regime. A link the
     * mid-step checks saw slow down acts at once, without the hold; other jumps keep it: a
     * faster link (a run of small transfers that passed at the burst rate looks like one),
     * and a slower estimate without that evidence (GCOLL_PROBE's link rate giving way to
     * the buckets' own, which cut 0.1 to 0.041 at 10 Gbit/s in one run) cuts after two fits
     * in a row */
    if (b->bw.jumps != jumps) {
        k->ctl.nfit = 0;
        if (mid_jump && b->bw.bw < bw_before) {
            k->ctl.held = k->ctl.min_hold;
            k->ctl.slower = 1;
        }
    }
    /* Only GCOLL_PROBE's estimate allows a fit after the first step, whose compression and
     * copies ran through first-touch page faults: it may raise the density, never cut it
     * (measured: a fit of 0.006 from 0.01 at 10 Gbit/s); a fit that would cut is not one
     * (not kept among the fits a rise waits for) */
    if (b->adapted == 1 && target > 0 && target < k->ctl.density) {
        k->ctl.held++;
        return k->ctl.density;
    }
    if (target > 0)
        return gcoll_ctl_apply(&k->ctl, target, 0);
    return gcoll_ctl_step(&k->ctl, window, comp_all, 0, 0, 0);
}

/* Per bucket in the step's agreement: run, compression, bytes, squared norm, launch
 * offset, gather and scatter copies, wire (negated: the shortest). */
#define NV 7

/* This rank's part of the agreement: its measurements, and its row of every bucket's
 * sampled values (the other rows at -inf, so that the MAX gives each row exactly). */
static void fill_agreement(gcoll_bucketer_t *b, double *v, double *samp, size_t nsamp, double first)
{
    const size_t P = (size_t)b->comm->size, r = (size_t)b->comm->rank;
    for (size_t i = 0; i < nsamp; i++)
        samp[i] = -HUGE_VAL;
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        double *x = v + (size_t)j * NV;
        /* a streamed top-k run hides the wire under its selection pass: the link's share is
         * the time the run waited on the wire, not the run less compression */
        double wire = k->streamed ? k->wire_busy : k->run_s - k->comp_s;
        x[0] = k->run_s;
        x[1] = k->comp_s;
        x[2] = k->bytes;
        x[3] = k->adaptive ? k->norm2 : 0;
        x[4] = k->t_launch - first;
        x[5] = k->copy_s;
        x[6] = -wire;
        double *row = samp + ((size_t)j * P + r) * GCOLL_SNR_SAMPLE;
        for (size_t i = 0; nsamp && k->adaptive && i < k->m; i++)
            row[i] = k->sample[i];
    }
}

/* The budget split over the nd density buckets (dens: their densities; count, energy:
 * their sizes and energies as doubles), then every adaptive bucket's codec set: densities,
 * and the quantizers' widths within their share of the window's slack. */
static gcoll_status_t apply_decisions(gcoll_bucketer_t *b, const double *v, double *dens,
                                      const double *count, const double *energy, int nd,
                                      double window, double qwire, double fixed_all)
{
    const int P = b->comm->size;
    gcoll_status_t st = GCOLL_OK;
    if ((b->adapt & GCOLL_AR_BUDGET) && nd > 0) {
        size_t *cnt = malloc((size_t)nd * sizeof(size_t));
        if (cnt) { /* the same total k, spread by the buckets' energies */
            for (int i = 0; i < nd; i++)
                cnt[i] = (size_t)count[i];
            gcoll_adapt_budget(nd, cnt, energy, b->comm->cfg.density_min, b->comm->cfg.density_max,
                               dens);
            free(cnt);
        }
    }
    for (int j = 0, i = 0; j < b->nb && st == GCOLL_OK; j++) {
        bucket_t *k = &b->bk[j];
        if (!k->adaptive)
            continue;
        if (k->quant) {
            double wj = b->bw.bw > 0 ? v[(size_t)j * NV + 2] / b->bw.bw : -v[(size_t)j * NV + 6];
            st = decide_bits(b, k, wj, qwire > 0 ? (window - fixed_all) * wj / qwire : 0);
            continue;
        }
        double d = dens[i++];
        GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                    "adapt: step %ld bucket %d density %.6g noise_share "
                    "%.4f noise_scale %.4g stage %.4f boost %.2f",
                    b->step, j, d, gcoll_snr_noise_share(&k->sig.snr, P),
                    gcoll_snr_noise_scale(&k->sig.snr), k->sig.stage.stage, b->boost);
        k->dens_now = d;
        if (d != k->comp->density)
            st = gcoll_bucket_set_density(k, d);
    }
    return st;
}

/* After a communicating step: agree on the measurements (the slowest rank's times and
 * launch offsets, the shortest wire times and window, the gradient norms, the sampled
 * gradient values), then let each adaptive bucket's rules pick its density or width.
 * Every rank runs the same rules on the same numbers, so all decide alike. Longer than
 * most: the estimates' updates and the fit read the same agreed vector in one pass each, in
 * the order the bandwidth rule's jumps depend on. */
/* The step's totals over the buckets, from the agreed rows. */
typedef struct {
    double comp, wire, bytes;         /* adaptive density buckets: compress, wire time, bytes */
    double qwire, qbytes, qwire_meas; /* quantizers: estimated wire, measured bytes and wire */
    double fixed;                     /* every bucket's time that density does not change */
    double norm2;                     /* squared gradient norm of the adaptive buckets */
} adapt_sums_t;

/* Sums the agreed rows and feeds each density bucket's own bandwidth estimate. */
static void adapt_sums(gcoll_bucketer_t *b, const double *v, adapt_sums_t *a)
{
    *a = (adapt_sums_t){0};
    for (int j = 0; j < b->nb; j++) {
        const double *x = v + (size_t)j * NV;
        a->fixed += x[0] + x[5] - (b->bk[j].quant ? -x[6] : 0);
        if (!b->bk[j].adaptive)
            continue;
        a->norm2 += x[3];
        if (b->bk[j].quant) {
            a->qwire += b->bw.bw > 0 ? x[2] / b->bw.bw : -x[6];
            a->qbytes += x[2];
            a->qwire_meas += fmax(-x[6], 1e-6);
            continue;
        }
        if (b->adapted == 0)
            continue; /* the first step warms up (page faults, connections): not a rate */
        /* two mid-step checks of this step saw the link slow down: the step's own samples
         * below half the estimates are the new regime, not a stall */
        if (b->mid_fired >= 2 && x[2] / fmax(-x[6], 1e-9) < b->bk[j].bw.bw / 2)
            gcoll_bw_jump(&b->bk[j].bw, x[2], -x[6]);
        else
            gcoll_bw_update(&b->bk[j].bw, x[2], -x[6]);
        a->comp += x[1];
        a->wire += -x[6] > 1e-6 ? -x[6] : 1e-6;
        a->bytes += x[2];
    }
}

/* Feeds the link's bandwidth estimate with the step's bytes and wire time (after the first
 * step); returns whether the mid-step checks saw the link slow down. */
static int adapt_link(gcoll_bucketer_t *b, adapt_sums_t *a)
{
    int mid_jump = 0;
    if (b->adapted++ > 0) {
        if (a->bytes == 0) { /* quantizers only: their wire is the link's sample */
            a->bytes = a->qbytes;
            a->wire = a->qwire_meas;
        }
        if (b->mid_fired >= 2 && a->bytes / a->wire < b->bw.bw / 2) {
            gcoll_bw_jump(&b->bw, a->bytes, a->wire);
            mid_jump = 1;
        } else {
            gcoll_bw_update(&b->bw, a->bytes, a->wire);
        }
    }
    return mid_jump;
}

/* The buckets share one progress thread and run in launch order: bucket j starts at
 * its launch or when the one before it ends, then compresses and sends. What must end
 * by the end of backward is the last of them; the density that makes it (the same for
 * every adaptive bucket) accounts for buckets launched late, whose communication would
 * otherwise be left after backward. Fills off, fixed and wfull per bucket; 0 when no
 * bucket is fitted by bandwidth. */
static double adapt_target(gcoll_bucketer_t *b, const double *v, double window, double *off,
                           double *fixed, double *wfull)
{
    double dmin = 1, dmax = 0;
    for (int j = 0; j < b->nb; j++) {
        const double *x = v + (size_t)j * NV;
        bucket_t *k = &b->bk[j];
        off[j] = x[4];
        if (k->adaptive && !k->quant && b->bw.bw > 0 && (b->adapt & GCOLL_AR_BANDWIDTH)) {
            gcoll_bucket_cost(x[0], -x[6], x[1], x[5], x[2], k->comp->density, b->bw.bw, &fixed[j],
                              &wfull[j]);
            dmin = fmin(dmin, k->ctl.dmin);
            dmax = fmax(dmax, k->ctl.dmax);
        } else {
            fixed[j] = x[0] + x[5];
            wfull[j] = 0;
        }
    }
    return dmax >= dmin ? gcoll_fit_density(b->nb, off, fixed, wfull, window, dmin, dmax) : 0;
}

gcoll_status_t gcoll_bucketer_adapt(gcoll_bucketer_t *b, double t_end)
{
    const int P = b->comm->size;
    int na = 0;
    double first = 1e300;
    for (int j = 0; j < b->nb; j++) {
        na += b->bk[j].adaptive;
        if (b->bk[j].t_launch > 0)
            first = b->bk[j].t_launch < first ? b->bk[j].t_launch : first;
    }
    if (na == 0)
        return GCOLL_OK;
    /* the sampled rows only for the rules that read them */
    size_t nsamp = (b->adapt & (GCOLL_AR_STAT | GCOLL_AR_BUDGET))
                       ? (size_t)b->nb * (size_t)P * GCOLL_SNR_SAMPLE
                       : 0;
    size_t nred = (size_t)b->nb * NV + 1;
    double *v = malloc((nred + nsamp + 4 * (size_t)b->nb + 1) * sizeof(double));
    if (!v)
        return GCOLL_ERR_NOMEM;
    double *samp = v + nred, *off = samp + nsamp, *fixed = off + b->nb, *wfull = fixed + b->nb;
    double *dens = wfull + b->nb;
    double window = t_end - first;
    fill_agreement(b, v, samp, nsamp, first);
    v[(size_t)b->nb * NV] = -window; /* MAX of the negation: the shortest window */
    gcoll_status_t st = gcoll_op_allreduce(b->comm, v, nred + nsamp, GCOLL_FLOAT64, GCOLL_MAX);
    if (st != GCOLL_OK)
        goto out;
    window = -v[(size_t)b->nb * NV];
    b->window = window;
    stat_update(b, samp);
    adapt_sums_t a;
    adapt_sums(b, v, &a);
    int critical = 0;
    if (b->adapt & GCOLL_AR_PHASE) { /* ACCORDION's signal, as a ramp */
        critical = gcoll_phase_update(&b->phase, sqrt(a.norm2));
        b->boost = gcoll_phase_boost(b->boost, critical);
    }
    long jumps = b->bw.jumps;
    double bw_before = b->bw.bw;
    int mid_jump = adapt_link(b, &a); /* the mid-step checks saw the link slow down */
    double target = adapt_target(b, v, window, off, fixed, wfull);
    /* each density bucket: min(bandwidth cap, statistical need), raised by the phase */
    int nd = 0;
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        if (!k->adaptive || k->quant)
            continue;
        double cap = bw_cap(b, k, target, window, a.comp, jumps, bw_before, mid_jump);
        double need = gcoll_sig_need_density(&k->sig, P);
        dens[nd] = gcoll_adapt_combine(cap, need, k->ctl.dmax, b->boost);
        off[nd] = (double)k->count;
        fixed[nd++] = gcoll_sig_energy(&k->sig);
        GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                    "bucket %d: launched at +%.1f ms of a %.1f ms window; all adaptive "
                    "buckets: wire %.1f ms, compress %.1f ms, %.0f bytes, bandwidth %.1f MB/s; "
                    "fitted density %g; cap %g need %g critical %d boost %.2f: density %g -> "
                    "%g; this bucket: %.0f bytes, wire %.1f ms, compress %.1f ms",
                    j, v[(size_t)j * NV + 4] * 1e3, window * 1e3, a.wire * 1e3, a.comp * 1e3,
                    a.bytes, b->bw.bw / 1e6, target, cap, need, critical, b->boost,
                    k->comp->density, dens[nd - 1], v[(size_t)j * NV + 2],
                    -v[(size_t)j * NV + 6] * 1e3, v[(size_t)j * NV + 1] * 1e3);
    }
    st = apply_decisions(b, v, dens, off, fixed, nd, window, a.qwire, a.fixed);
out:
    free(v);
    return st;
}

/* One bucket's statistics into out (bucket -1: all adaptive buckets, their signals' sums). */
GCOLL_EXPORT gcoll_status_t gcoll_bucketer_stats(const gcoll_bucketer_t *b, int bucket,
                                                 gcoll_adapt_stats_t *out)
{
    if (!b || !out || bucket < -1 || bucket >= b->nb)
        return GCOLL_ERR_INVALID;
    const int P = b->comm->size;
    memset(out, 0, sizeof(*out));
    gcoll_snr_t sum;
    gcoll_snr_init(&sum, 1);
    double dsum = 0, n = 0, stage = 0, nst = 0;
    for (int j = bucket < 0 ? 0 : bucket; j < (bucket < 0 ? b->nb : bucket + 1); j++) {
        const bucket_t *k = &b->bk[j];
        if (!k->adaptive)
            continue;
        sum.g2 += gcoll_snr_g2(&k->sig.snr);
        sum.s += gcoll_snr_s(&k->sig.snr);
        sum.w = 1;
        sum.n = sum.n > k->sig.snr.n ? sum.n : k->sig.snr.n;
        dsum += gcoll_bucketer_density(b, j) * (double)k->count;
        n += (double)k->count;
        stage += k->sig.stage.stage * (double)k->count;
        nst += (double)k->count;
        out->bits = k->quant ? gcoll_adapt_bits_of(k->comp) : out->bits;
    }
    out->steps = b->adapted;
    out->noise_scale = gcoll_snr_noise_scale(&sum);
    out->grad_sq = gcoll_snr_g2(&sum);
    out->noise_sq = gcoll_snr_s(&sum);
    out->noise_share = gcoll_snr_noise_share(&sum, P);
    out->stage = nst > 0 ? stage / nst : 1;
    out->phase_boost = b->boost;
    out->bandwidth = b->bw.bw;
    out->density = n > 0 ? dsum / n : gcoll_bucketer_density(b, bucket < 0 ? 0 : bucket);
    return GCOLL_OK;
}
