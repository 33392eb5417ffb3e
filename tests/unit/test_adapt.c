/* test_adapt.c: the adaptation controller on synthetic traces: bandwidth step changes,
 * noise and outliers; bounds, convergence, no oscillation; the phase detector. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "adapt/adapt.h"

/* Deterministic noise in [-1, 1]. */
static double noise(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / (double)(1ull << 53) * 2 - 1;
}

/* One simulated step: a bucket of 25M floats whose top-k pairs cost 8 bytes each, a 100 ms
 * window, 5 ms of compression, on a link of `rate` bytes/s with relative noise. */
static double sim_step(gcoll_density_ctl_t *c, gcoll_bw_est_t *e, double rate, double jitter,
                       uint64_t *seed)
{
    const double full = 25e6 * 8, window = 0.1, comp = 0.005;
    double bytes = full * c->density;
    double t = bytes / (rate * (1 + jitter * noise(seed)));
    gcoll_bw_update(e, bytes, t);
    return gcoll_ctl_step(c, window, comp, e->bw, full, 0);
}

static void test_step_changes(void **state)
{
    (void)state;
    gcoll_density_ctl_t c;
    gcoll_bw_est_t e;
    gcoll_ctl_init(&c, 1e-4, 0.1, 0.01);
    gcoll_bw_init(&e, 2);
    uint64_t seed = 1;
    const double rates[4] = {1.25e9, 1.25e8, 2.5e7, 1.25e9}; /* 10G, 1G, 200M, 10G bit/s */
    for (int phase = 0; phase < 4; phase++) {
        double d = 0;
        long changes0 = c.changes;
        for (int step = 0; step < 40; step++)
            d = sim_step(&c, &e, rates[phase], 0.0, &seed);
        /* the ideal density: what fits in the window, within bounds */
        double ideal = (0.1 - 0.005) * rates[phase] / (25e6 * 8);
        ideal = ideal < 1e-4 ? 1e-4 : ideal > 0.1 ? 0.1 : ideal;
        if (fabs(d - ideal) > 0.3 * ideal)
            fail_msg("phase %d: density %g, ideal %g", phase, d, ideal);
        assert_true(d >= 1e-4 && d <= 0.1);
        /* converged without oscillating: a handful of changes per phase at most */
        assert_true(c.changes - changes0 <= 6);
    }
    /* the fast link goes to the maximum */
    assert_true(c.density == 0.1);
}

static void test_noise_no_oscillation(void **state)
{
    (void)state;
    gcoll_density_ctl_t c;
    gcoll_bw_est_t e;
    gcoll_ctl_init(&c, 1e-4, 0.1, 0.001);
    gcoll_bw_init(&e, 4);
    uint64_t seed = 7;
    for (int step = 0; step < 30; step++)
        sim_step(&c, &e, 1.25e8, 0.3, &seed); /* settle on 1 Gbit/s with 30% noise */
    long before = c.changes;
    for (int step = 0; step < 200; step++)
        sim_step(&c, &e, 1.25e8, 0.3, &seed);
    /* 200 noisy steps on a steady link: hysteresis keeps the decision still */
    assert_true(c.changes - before <= 2);
}

/* The fits of a CPU-bound step scatter (compression of 4 ranks on 2 cores) and one step in
 * three comes out lucky: the traces below are fits logged by the bucketer at 1 Gbit/s and
 * 200 Mbit/s (bench/netns-shaped.sh MODE=adapt). Rising on the last fit alone swung the
 * density between the ordinary fit and the lucky one; now a rise goes only as far as
 * every fit of the hold allowed. */
static void test_lucky_fits(void **state)
{
    (void)state;
    gcoll_density_ctl_t c;
    gcoll_ctl_init(&c, 1e-4, 0.1, 0.045);
    const double fits_1g[] = {0.0465, 0.0686, 0.0887, 0.0449, 0.0705, 0.0847, 0.047, 0.0817};
    for (size_t i = 0; i < sizeof(fits_1g) / sizeof(fits_1g[0]); i++)
        assert_true(gcoll_ctl_apply(&c, fits_1g[i], 0) == 0.045);
    assert_int_equal(c.changes, 0);
    /* 200 Mbit/s: ordinary fits near 0.011-0.014, lucky ones 2-5x higher */
    gcoll_ctl_init(&c, 1e-4, 0.1, 0.012);
    const double fits_200m[] = {0.0107, 0.0243, 0.0514, 0.0138, 0.0342, 0.0388, 0.011, 0.063};
    for (size_t i = 0; i < sizeof(fits_200m) / sizeof(fits_200m[0]); i++)
        assert_true(gcoll_ctl_apply(&c, fits_200m[i], 0) == 0.012);
    /* a rise every fit of the hold agrees with still happens, to the lowest of them */
    assert_true(gcoll_ctl_apply(&c, 0.03, 0) == 0.012); /* 0.011 is among the last three */
    assert_true(gcoll_ctl_apply(&c, 0.05, 0) == 0.03);  /* 0.063, 0.03, 0.05 */
    /* and the maximum is reached when three fits in a row say so */
    for (int i = 0; i < 3; i++)
        gcoll_ctl_apply(&c, 0.1, 0);
    assert_true(c.density == 0.1);
    /* one fit past two thirds below (a descheduled rank) moves nothing; two in a row cut
     * at once, to the milder; and when the link measurably slowed, one is enough */
    assert_true(gcoll_ctl_apply(&c, 0.063, 0) == 0.1);
    assert_true(gcoll_ctl_apply(&c, 0.1, 0) == 0.1);
    assert_true(gcoll_ctl_apply(&c, 0.05, 0) == 0.1);
    assert_true(gcoll_ctl_apply(&c, 0.055, 0) == 0.055);
    c.slower = 1;
    assert_true(gcoll_ctl_apply(&c, 0.01, 0) == 0.01);
    assert_int_equal(c.slower, 0);
    /* a slow drift is followed once three fits in a row agree, to the highest of them */
    gcoll_ctl_init(&c, 1e-4, 0.1, 0.1);
    c.held = 0; /* just changed */
    assert_true(gcoll_ctl_apply(&c, 0.07, 0) == 0.1);
    assert_true(gcoll_ctl_apply(&c, 0.072, 0) == 0.1);
    assert_true(gcoll_ctl_apply(&c, 0.071, 0) == 0.072);
}

static void test_outliers(void **state)
{
    (void)state;
    gcoll_bw_est_t e;
    gcoll_bw_init(&e, 4);
    for (int i = 0; i < 20; i++)
        gcoll_bw_update(&e, 1e8, 1.0);
    gcoll_bw_update(&e, 1e8, 1000.0); /* one stall */
    assert_true(e.bw > 0.8e8);
    gcoll_bw_update(&e, 1e8, 1e-6); /* one absurdly fast sample */
    assert_true(e.bw < 1.5e8);
    gcoll_bw_update(&e, 0, 1); /* ignored */
    gcoll_bw_update(&e, 1, 0); /* ignored */
    assert_true(e.bw > 0.8e8 && e.bw < 1.5e8);
}

static void test_regime_change(void **state)
{
    (void)state;
    gcoll_bw_est_t e;
    gcoll_bw_init(&e, 4);
    for (int i = 0; i < 20; i++)
        gcoll_bw_update(&e, 1e8, 1.0);
    /* the link drops 5x: the second slow sample is enough, whatever the half-life */
    gcoll_bw_update(&e, 2e7, 1.0);
    assert_true(e.bw > 0.8e8);
    gcoll_bw_update(&e, 2e7, 1.0);
    assert_true(fabs(e.bw - 2e7) < 1e6);
    assert_int_equal(e.jumps, 1);
    /* a jump forced by evidence from elsewhere (the mid-step checks) */
    gcoll_bw_est_t f = e;
    gcoll_bw_jump(&f, 5e6, 1.0);
    assert_true(f.bw == 5e6 && f.jumps == 2);
    gcoll_bw_jump(&f, 0, 1.0); /* ignored */
    assert_true(f.bw == 5e6);
    /* the history restarts at the jump: one fast sample next (a small transfer passing at
     * the burst rate) is clipped, not a jump back to the old regime */
    gcoll_bw_update(&f, 1.2e7, 1.0);
    assert_true(f.jumps == 2 && f.bw < 1e7);
    gcoll_bw_update(&f, 5e6, 1.0);
    assert_true(f.jumps == 2 && f.bw < 1e7);
    /* and back up 50x in two samples */
    gcoll_bw_update(&e, 1e9, 1.0);
    gcoll_bw_update(&e, 1e9, 1.0);
    assert_true(fabs(e.bw - 1e9) < 1e7);
    /* alternating stalls (one in three) are outliers, not a regime */
    for (int i = 0; i < 30; i++)
        gcoll_bw_update(&e, 1e9, i % 3 == 0 ? 100.0 : 1.0);
    assert_true(e.bw > 0.5e9);
}

/* Independent check of the pipeline model: bucket j starts at max(its launch, the end of
 * j-1) and lasts fixed + d * wire_full. */
static double finish_ref(int n, const double *off, const double *fx, const double *w, double d)
{
    double t = 0;
    for (int j = 0; j < n; j++)
        t = (off[j] > t ? off[j] : t) + fx[j] + d * w[j];
    return t;
}

static void test_fit_density(void **state)
{
    (void)state;
    /* four buckets launched through a 1 s backward, the last at 0.95 s */
    const double off[4] = {0, 0.3, 0.6, 0.95}, fx[4] = {0.02, 0.02, 0.02, 0.01};
    const double w[4] = {2.0, 2.0, 2.0, 1.0}; /* wire seconds at density 1 */
    double d = gcoll_fit_density(4, off, fx, w, 1.0, 1e-4, 0.1);
    /* the last bucket limits it: 0.95 + 0.01 + d * 1.0 <= 1.0 -> d <= 0.04 */
    assert_true(fabs(d - 0.04) < 1e-6);
    assert_true(finish_ref(4, off, fx, w, d) <= 1.0 + 1e-9);
    assert_true(finish_ref(4, off, fx, w, d * 1.01) > 1.0);
    /* a window wide enough for the maximum */
    assert_true(gcoll_fit_density(4, off, fx, w, 10.0, 1e-4, 0.1) == 0.1);
    /* nothing fits (the last launch is after the deadline): the wire may add 3.5% of the
     * window to the finish at the minimum, 0.95 + 0.01 + 1e-4: d = 0.0175 + 1e-4 */
    d = gcoll_fit_density(4, off, fx, w, 0.5, 1e-4, 0.1);
    assert_true(fabs(d - (0.0175 + 1e-4)) < 1e-6);
    /* buckets queue behind each other: with all launched at 0 the sum must fit */
    const double off0[4] = {0, 0, 0, 0};
    d = gcoll_fit_density(4, off0, fx, w, 1.0, 1e-4, 1.0);
    assert_true(fabs(d - (1.0 - 0.07) / 7.0) < 1e-6);
    /* a bucket whose size does not depend on the density only delays the others */
    const double w2[4] = {2.0, 0, 2.0, 1.0};
    d = gcoll_fit_density(4, off0, fx, w2, 1.0, 1e-4, 1.0);
    assert_true(fabs(d - (1.0 - 0.07) / 5.0) < 1e-6);
}

static void test_bucket_cost(void **state)
{
    (void)state;
    /* measured at d0 = 0.05: run 300 ms of which compression 150 ms and 40 ms on the wire
     * for the rank that waited least, 10 ms of copies, 5 MB at 125 MB/s (40 ms) */
    double fx, pd;
    gcoll_bucket_cost(0.3, 0.04, 0.15, 0.01, 5e6, 0.05, 1.25e8, &fx, &pd);
    /* at d0 the model gives back the measured run plus copies */
    assert_true(fabs(fx + 0.05 * pd - 0.31) < 1e-9);
    /* compression grows as 1 + 12 d: at 0.1 it is 2.2 / 1.6 of now, the wire twice */
    double comp01 = 0.15 * 2.2 / 1.6;
    assert_true(fabs(fx + 0.1 * pd - (0.31 - 0.15 - 0.04 + comp01 + 0.08)) < 1e-9);
    /* waiting for peers (run - compression - shortest wire = 110 ms) does not scale */
    assert_true(fabs(fx + 0.0 * pd - (0.31 - 0.15 - 0.04 + 0.15 / 1.6)) < 1e-9);
    /* a wire time longer than the run allows is clipped to it */
    gcoll_bucket_cost(0.3, 0.5, 0.15, 0.0, 5e6, 0.05, 1.25e8, &fx, &pd);
    assert_true(fx >= 0 && fabs(fx + 0.05 * pd - (0.3 - 0.15 + 0.04)) < 1e-9);
}

static void test_midstep_scale(void **state)
{
    (void)state;
    /* planned at 125 MB/s, a 1.3 s window: 4 MB took 160 ms (25 MB/s): cut to 0.2 */
    assert_true(fabs(gcoll_midstep_scale(1.25e8, 4e6, 0.16, 1.3, 1) - 0.2) < 1e-9);
    /* 2x slower is not enough (noise, a busy peer) */
    assert_true(gcoll_midstep_scale(1.25e8, 4e6, 0.064, 1.3, 1) == 1);
    /* a fast link where the wire is a sliver of the step: 5x slower costs 8 ms < 2% */
    assert_true(gcoll_midstep_scale(1.25e9, 2e6, 0.008, 1.3, 1) == 1);
    /* nothing planned or measured yet */
    assert_true(gcoll_midstep_scale(0, 4e6, 0.16, 1.3, 1) == 1);
    assert_true(gcoll_midstep_scale(1.25e8, 0, 0.16, 1.3, 1) == 1);
    assert_true(gcoll_midstep_scale(1.25e8, 4e6, 0, 1.3, 1) == 1);
    assert_true(gcoll_midstep_scale(1.25e8, 4e6, 0.16, 0, 1) == 1);
    /* once cut in this step, a small bucket at the cut density keeps the cut while its
     * rate is under half the plan, though it loses little time */
    assert_true(gcoll_midstep_scale(1.25e8, 4e5, 0.016, 1.3, 1) == 1);
    assert_true(fabs(gcoll_midstep_scale(1.25e8, 4e5, 0.016, 1.3, 0.2) - 0.2) < 1e-9);
    assert_true(fabs(gcoll_midstep_scale(1.25e8, 4e5, 0.008, 1.3, 0.2) - 0.4) < 1e-9);
    /* and a small bucket that passed at a burst rate does not lift it within the step */
    assert_true(gcoll_midstep_scale(1.25e8, 4e5, 0.002, 1.3, 0.2) == 0.2);
}

/* The step right after a link drop: four ranks measure the first bucket's wire with their
 * own noise, agree on the shortest (as the bucketer does), and cut the later buckets;
 * every rank computes the same cut, and the step ends far sooner than without it. */
static void test_midstep_drop(void **state)
{
    (void)state;
    enum { NB = 5, NR = 4 };
    const double off[NB] = {0, 0.3, 0.7, 1.1, 1.3}, fx[NB] = {0.1, 0.05, 0.1, 0.1, 0.02};
    const double elems[NB] = {6e6, 2e6, 6e6, 6e6, 2e6}, window = 1.3, d = 0.1;
    const double planned = 1.25e8, now = 2.5e7; /* 1 Gbit/s planned, 200 Mbit/s now */
    uint64_t seed = 3;
    const double bytes = elems[0] * 8 * d;
    double meas[NR], scale[NR];
    for (int q = 0; q < NR; q++) /* every rank's own measurement of the first bucket */
        meas[q] = bytes / now * (1 + 0.2 * fabs(noise(&seed)));
    for (int r = 0; r < NR; r++) {
        /* rank r combines them in its own order (as a ring does), keeping the shortest */
        double wire = 1e9;
        for (int q = 0; q < NR; q++)
            wire = fmin(wire, meas[(r + q) % NR]);
        scale[r] = gcoll_midstep_scale(planned, bytes, wire, window, 1);
    }
    for (int r = 1; r < NR; r++)
        assert_true(scale[r] == scale[0]);
    const double sc = scale[0];
    assert_true(sc < 0.21 && sc > 0.15);
    double t_cut = 0, t_old = 0;
    for (int j = 0; j < NB; j++) {
        double dj = j == 0 ? d : d * sc;
        t_cut = fmax(off[j], t_cut) + fx[j] + elems[j] * 8 * dj / now;
        t_old = fmax(off[j], t_old) + fx[j] + elems[j] * 8 * d / now;
    }
    /* without the cut the last bucket ends 176 ms after backward; with it, under half that */
    assert_true(fabs(t_old - window - 0.176) < 1e-6);
    assert_true(t_cut - window < 0.5 * (t_old - window));
}

static void test_bounds_and_hold(void **state)
{
    (void)state;
    gcoll_density_ctl_t c;
    gcoll_ctl_init(&c, 0.001, 0.05, 0.5); /* start above the maximum: clamped */
    assert_true(c.density == 0.05);
    /* an impossible window: the minimum, never below */
    assert_true(gcoll_ctl_step(&c, 0.0, 0.01, 1e6, 1e9, 0) == 0.001);
    /* a change right after another waits for the hold */
    double d = gcoll_ctl_step(&c, 10.0, 0, 1e9, 1e6, 0);
    assert_true(d == 0.001);
    for (int i = 0; i < c.min_hold; i++)
        d = gcoll_ctl_step(&c, 10.0, 0, 1e9, 1e6, 0);
    assert_true(d == 0.05);
    /* a critical phase asks for the maximum at once */
    gcoll_ctl_init(&c, 0.001, 0.05, 0.001);
    c.held = 0;
    assert_true(gcoll_ctl_step(&c, 0.0, 0, 1e6, 1e9, 1) == 0.05);
    /* the last step up to the maximum is not held back by the hysteresis (0.088 -> 0.1 is
     * only 14%), but waits for the hold; and a fit just under it does not move it back */
    gcoll_ctl_init(&c, 0.0001, 0.1, 0.088);
    c.held = 0;
    assert_true(gcoll_ctl_apply(&c, 0.1, 0) == 0.088);
    for (int i = 0; i < c.min_hold; i++)
        d = gcoll_ctl_apply(&c, 0.1, 0);
    assert_true(d == 0.1);
    for (int i = 0; i < 10; i++)
        assert_true(gcoll_ctl_apply(&c, i % 2 ? 0.1 : 0.085, 0) == 0.1);
    /* within the hysteresis below the maximum, the density still stays */
    gcoll_ctl_init(&c, 0.0001, 0.1, 0.05);
    assert_true(gcoll_ctl_apply(&c, 0.06, 0) == 0.05);
    /* nothing measured yet: no change */
    gcoll_ctl_init(&c, 0.001, 0.05, 0.01);
    assert_true(gcoll_ctl_step(&c, 1, 0, 0, 0, 0) == 0.01);
}

static void test_phase(void **state)
{
    (void)state;
    gcoll_phase_t p;
    gcoll_phase_init(&p, 0.5, 2);
    assert_int_equal(gcoll_phase_update(&p, 10), 1); /* early training is critical */
    assert_int_equal(gcoll_phase_update(&p, 9), 1);
    assert_int_equal(gcoll_phase_update(&p, 9.5), 0); /* steady */
    assert_int_equal(gcoll_phase_update(&p, 9.2), 0);
    assert_int_equal(gcoll_phase_update(&p, 30), 1); /* the norm jumps: critical */
    assert_int_equal(gcoll_phase_update(&p, 31), 1);
    assert_int_equal(gcoll_phase_update(&p, 30.5), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_changes),    cmocka_unit_test(test_noise_no_oscillation),
        cmocka_unit_test(test_outliers),        cmocka_unit_test(test_lucky_fits),
        cmocka_unit_test(test_regime_change),   cmocka_unit_test(test_fit_density),
        cmocka_unit_test(test_bounds_and_hold), cmocka_unit_test(test_phase),
        cmocka_unit_test(test_bucket_cost),     cmocka_unit_test(test_midstep_scale),
        cmocka_unit_test(test_midstep_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
