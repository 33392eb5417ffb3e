/* adapt.c: bandwidth estimation, the density controller and the phase detector. Pure
 * functions of their inputs: ranks that feed them the same (agreed) measurements make the
 * same decisions. */
#include "adapt/adapt.h"

#include <math.h>
#include <string.h>

void gcoll_bw_init(gcoll_bw_est_t *e, double half_life)
{
    memset(e, 0, sizeof(*e));
    e->half_life = half_life > 0 ? half_life : 4;
}

void gcoll_bw_update(gcoll_bw_est_t *e, double bytes, double seconds)
{
    if (!(bytes > 0) || !(seconds > 0))
        return;
    double s = bytes / seconds;
    e->last[e->n % 3] = s;
    if (e->n >= 2) {
        double a = e->last[0], b = e->last[1], c = e->last[2];
        double med = fmax(fmin(a, b), fmin(fmax(a, b), c));
        if (med > 2 * e->bw || med < e->bw / 2) {
            e->bw = med;
            e->jumps++;
            e->n++;
            return;
        }
    }
    if (e->n == 0) {
        e->bw = s;
    } else {
        /* clip outliers: one stalled or lucky measurement cannot swing the estimate */
        if (s > 4 * e->bw)
            s = 4 * e->bw;
        if (s < e->bw / 4)
            s = e->bw / 4;
        double alpha = 1.0 - pow(0.5, 1.0 / e->half_life);
        e->bw += alpha * (s - e->bw);
    }
    e->n++;
}

void gcoll_bw_jump(gcoll_bw_est_t *e, double bytes, double seconds)
{
    if (!(bytes > 0) || !(seconds > 0))
        return;
    e->bw = bytes / seconds;
    /* the history restarts in the new regime: a sample from before the change left in the
     * median would let the next lucky one jump straight back */
    for (int i = 0; i < 3; i++)
        e->last[i] = e->bw;
    e->n = e->n < 3 ? 3 : e->n + 1;
    e->jumps++;
}

void gcoll_ctl_init(gcoll_density_ctl_t *c, double dmin, double dmax, double start)
{
    memset(c, 0, sizeof(*c));
    c->dmin = dmin;
    c->dmax = dmax;
    c->density = start < dmin ? dmin : start > dmax ? dmax : start;
    c->hysteresis = 0.25;
    c->min_hold = 3;
    c->held = c->min_hold;
}

double gcoll_ctl_step(gcoll_density_ctl_t *c, double window_s, double fixed_s, double bw,
                      double bytes_at_full, int critical)
{
    double target;
    if (critical) {
        target = c->dmax;
    } else if (!(bw > 0) || !(bytes_at_full > 0)) {
        c->held++;
        return c->density; /* nothing measured yet */
    } else {
        double budget = window_s - fixed_s;
        target = budget > 0 ? budget * bw / bytes_at_full : c->dmin;
    }
    return gcoll_ctl_apply(c, target, critical);
}

/* What the wire may add to a step already bound by its fixed costs, as a fraction of the
 * window. Measured with bench/netns-shaped.sh MODE=adapt (4 ranks on 2 cores, where the
 * compression of every rank is such a fixed cost): 5% let the 1 Gbit/s phase run at the
 * maximum density 0.1 and 1.21-1.27x of its compute; 2% kept every step but the first
 * within 1.16-1.18x but the 10 Gbit/s phases then stopped at 0.065-0.074 (compression
 * grows with the density too); 3.5% reached 0.1 in both fast phases with two steps over
 * 1.2x (1.21, 1.23, on and after the drop to 1 Gbit/s). */
#define OVERRUN_SLACK 0.035

/* Finish time of the last bucket at density d. */
static double pipeline_finish(int n, const double *offset, const double *fixed,
                              const double *wire_full, double d)
{
    double t = 0;
    for (int j = 0; j < n; j++) {
        double start = offset[j] > t ? offset[j] : t;
        t = start + fixed[j] + d * wire_full[j];
    }
    return t;
}

double gcoll_fit_density(int n, const double *offset, const double *fixed, const double *wire_full,
                         double deadline, double dmin, double dmax)
{
    if (pipeline_finish(n, offset, fixed, wire_full, dmax) <= deadline)
        return dmax;
    double floor_t = pipeline_finish(n, offset, fixed, wire_full, dmin);
    if (floor_t > deadline) {
        /* even the minimum overruns: the step is bound by the fixed costs (compression,
         * other buckets), and compressing harder buys nothing; let the wire add at most
         * OVERRUN_SLACK of the window to that floor */
        deadline = floor_t + OVERRUN_SLACK * deadline;
        if (pipeline_finish(n, offset, fixed, wire_full, dmax) <= deadline)
            return dmax;
    }
    /* the finish time grows with d: bisect on a log scale */
    double lo = log(dmin), hi = log(dmax);
    for (int it = 0; it < 50; it++) {
        double mid = 0.5 * (lo + hi);
        if (pipeline_finish(n, offset, fixed, wire_full, exp(mid)) <= deadline)
            lo = mid;
        else
            hi = mid;
    }
    return exp(lo);
}

/* Top-k with error feedback measured 2.94, 2.26 and 1.49 GB/s at densities 0.01, 0.03 and
 * 0.1 (gcoll-codec-bench, 2^22 floats, one core): time per element on a line of slope 12
 * over an intercept of 1. */
#define COMP_SLOPE 12.0

void gcoll_bucket_cost(double run_s, double wire_s, double comp_s, double copy_s, double bytes,
                       double d0, double bw, double *fixed_p, double *per_density_p)
{
    double wire = wire_s > 1e-6 ? wire_s : 1e-6;
    if (wire > run_s - comp_s)
        wire = run_s - comp_s > 1e-6 ? run_s - comp_s : 1e-6;
    double comp_d = comp_s * COMP_SLOPE * d0 / (1 + COMP_SLOPE * d0);
    *fixed_p = run_s - wire - comp_d + copy_s;
    *per_density_p = (bw > 0 ? bytes / bw : wire) / d0 + comp_d / d0;
}

double gcoll_midstep_scale(double bw, double bytes, double wire_s, double window_s,
                           double scale_now)
{
    if (!(bw > 0) || !(bytes > 0) || !(wire_s > 0) || !(window_s > 0))
        return 1;
    double rate = bytes / wire_s, lost = wire_s - bytes / bw;
    if (scale_now < 1) /* cut already: it holds for the step, a slower bucket deepens it */
        return rate < bw / 2 ? rate / bw : scale_now;
    return rate < bw / 2 && lost > 0.02 * window_s ? rate / bw : 1;
}

double gcoll_ctl_apply(gcoll_density_ctl_t *c, double target, int critical)
{
    c->held++;
    if (critical)
        target = c->dmax;
    if (target < c->dmin)
        target = c->dmin;
    if (target > c->dmax)
        target = c->dmax;
    /* Every fit since the last change (at most the last three, the hold's length) is
     * kept, and a change goes only as far as all of them agree: a rise to the lowest, a
     * cut to the highest. One lucky step (a CPU-quiet one, a transfer that passed at the
     * burst rate) or one unlucky one (a rank descheduled) must not move the density to
     * where the next ordinary step moves it back. Measured with bench/netns-shaped.sh
     * MODE=adapt, acting on the last fit alone swung the density 0.045 <-> 0.089 every few
     * steps at 1 Gbit/s and 0.009 <-> 0.063 at 200 Mbit/s, and cut 0.1 to 0.054-0.066 at
     * 10 Gbit/s on single CPU-bound steps. */
    int had_prev = c->nfit > 0;
    double prev = had_prev ? c->fit[(c->nfit - 1) % 3] : 0, lo = target, hi = target;
    c->fit[c->nfit++ % 3] = target;
    for (int i = 0; i < 3 && i < c->nfit; i++) {
        lo = c->fit[i] < lo ? c->fit[i] : lo;
        hi = c->fit[i] > hi ? c->fit[i] : hi;
    }
    /* a critical phase acts at once, and so does an overrun (the model says to send less
     * than two thirds of now: the step is waiting on the wire) when the link measurably
     * slowed or the fit before said so too (then to the milder of the two) */
    double deep = c->density / 1.5;
    int urgent = (critical && target != c->density) ||
                 (target < deep && (c->slower || (had_prev && prev < deep)));
    if (urgent && !critical && !c->slower)
        target = prev > target ? prev : target;
    else if (!urgent)
        target = target > c->density ? (lo > c->density ? lo : c->density)
                                     : (hi < c->density ? hi : c->density);
    c->slower = 0;
    double rel = fabs(target - c->density) / c->density;
    /* a target at the maximum is the bound, not a noisy fit: the last step up to it needs
     * the hold but not the hysteresis (else 0.088 could never become 0.1), and nothing
     * oscillates, since leaving the maximum again takes a cut past the hysteresis */
    int to_max = target == c->dmax && target > c->density;
    if (urgent || ((rel > c->hysteresis || to_max) && c->held >= c->min_hold)) {
        c->density = target;
        c->held = 0;
        c->nfit = 0;
        c->changes++;
    }
    return c->density;
}

void gcoll_phase_init(gcoll_phase_t *p, double eta, int lag)
{
    memset(p, 0, sizeof(*p));
    p->eta = eta > 0 ? eta : 0.5;
    p->lag = lag < 1 ? 1 : lag > 63 ? 63 : lag;
}

int gcoll_phase_update(gcoll_phase_t *p, double g)
{
    p->hist[p->n % 64] = g;
    p->n++;
    if (p->n <= p->lag)
        return 1; /* the first steps are critical (as ACCORDION treats early training) */
    double old = p->hist[(p->n - 1 - p->lag) % 64];
    return old > 0 && fabs(g - old) / old > p->eta;
}
