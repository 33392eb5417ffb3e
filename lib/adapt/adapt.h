/* adapt.h: choosing each bucket's compression from measured bandwidth and the compute
 * window it has to fit in, and from the training phase (gradient-norm changes). */
#ifndef GCOLL_ADAPT_H
#define GCOLL_ADAPT_H

#include <stddef.h>

#include "gcoll.h"

/* Bandwidth estimate: an EWMA with a half-life in samples, robust to outliers (a sample
 * more than 4x away from the estimate moves it by at most 4x, and only at the EWMA rate),
 * that follows a change of regime at once: when the median of the last three samples is
 * more than 2x away from the estimate (two samples in three agree the link changed: one
 * stall or lucky sample cannot do it), the estimate jumps to that median. */
typedef struct {
    double half_life;
    double bw; /* bytes per second, 0 until the first sample */
    long n;
    double last[3]; /* the last three samples, most recent at (n - 1) % 3 */
    long jumps;     /* regime changes followed */
} gcoll_bw_est_t;

void gcoll_bw_init(gcoll_bw_est_t *e, double half_life);
void gcoll_bw_update(gcoll_bw_est_t *e, double bytes, double seconds);

/* Density controller of one bucket. */
typedef struct {
    double dmin, dmax; /* bounds (GCOLL_DENSITY_MIN, GCOLL_DENSITY_MAX) */
    double density;    /* current decision */
    double hysteresis; /* relative change below which the density stays */
    int min_hold;      /* steps between two changes */
    int held;          /* steps since the last change */
    double fit[3];     /* the last targets fitted (a ring), since the last change */
    int nfit;
    int slower; /* set by the caller: the link measurably slowed (the estimate
                 * jumped down), so the next fit acts at once; cleared by it */
    long changes;
} gcoll_density_ctl_t;

void gcoll_ctl_init(gcoll_density_ctl_t *c, double dmin, double dmax, double start);

/* The model: communication of density d costs fixed_s + d * bytes_at_full / bw seconds,
 * where bytes_at_full is what this bucket would put on the wire at density 1. Returns the
 * largest density whose communication fits in window_s (never compressing more than
 * needed), within bounds, applied with hysteresis and rate limiting (a large cut acts at
 * once: the step is waiting on the wire). critical (a phase signal) asks for dmax. */
double gcoll_ctl_step(gcoll_density_ctl_t *c, double window_s, double fixed_s, double bw,
                      double bytes_at_full, int critical);

/* The buckets of a step run one after another on the progress thread: bucket j may start
 * at offset[j] seconds (its launch, from the first launch) and then takes
 * fixed[j] + d * wire_full[j] seconds (wire_full[j] is its wire time at density 1; 0 for a
 * bucket whose size does not depend on d). Returns the largest d in [dmin, dmax] for which
 * the last bucket finishes by deadline (the end of backward, from the first launch), so
 * that buckets launched late cannot leave their communication exposed. When even dmin
 * overruns (fixed costs bind the step), compressing harder buys nothing: the largest d
 * whose finish is within 3.5% of the window of dmin's. Buckets are in launch order. */
double gcoll_fit_density(int n, const double *offset, const double *fixed, const double *wire_full,
                         double deadline, double dmin, double dmax);

/* Mid-step check after one bucket of a step planned at bw bytes/s: the ranks agreed that
 * the bucket put `bytes` on the wire in wire_s seconds. When that rate is under half the
 * plan and the time lost to it is more than 2% of the step's window (a link that slowed,
 * not noise on a fast one, where the wire is a small part of the step), returns rate / bw:
 * the factor by which to scale the density of the buckets not yet started in this step, so
 * that their wire time stays what the plan gave them; otherwise 1. scale_now is the cut
 * already in force in this step (1: none): once the slowdown is established the cut holds
 * for the rest of the step (a small bucket can pass at a shaper's burst rate and look
 * recovered), and a bucket still under half the plan sets it to its own rate, however
 * little time it lost at the cut density. */
double gcoll_midstep_scale(double bw, double bytes, double wire_s, double window_s,
                           double scale_now);

/* Sets the estimate to this sample at once (a regime change established otherwise: the
 * mid-step checks of the same step saw it). */
void gcoll_bw_jump(gcoll_bw_est_t *e, double bytes, double seconds);

/* One bucket's cost as gcoll_fit_density takes it, fixed + d * per_density, from what the
 * ranks agreed it measured at density d0: the slowest rank's run and compression, the
 * shortest wire time (the rank that waited least for the others: the link's share), the
 * copies, and its bytes. Two parts grow with d: the wire (bytes / bw) and the share of
 * compression that selects and packs the values (a sparsifier's time per element goes as
 * 1 + 12 d); the rest of the run (the rest of compression, waiting for peers still
 * compressing on a busy CPU) is fixed. At d0 the cost is the measured run plus copies. */
void gcoll_bucket_cost(double run_s, double wire_s, double comp_s, double copy_s, double bytes,
                       double d0, double bw, double *fixed_p, double *per_density_p);

/* gcoll_ctl_step with the target density already computed (critical: the phase signal).
 * A target at dmax is taken after the hold even when within the hysteresis. */
double gcoll_ctl_apply(gcoll_density_ctl_t *c, double target, int critical);

/* ACCORDION's critical-regime detector (Agarwal et al. 2021): the gradient norm changing
 * by more than eta relative to its value `lag` observations ago. */
typedef struct {
    double eta;
    int lag;
    double hist[64];
    long n;
} gcoll_phase_t;

void gcoll_phase_init(gcoll_phase_t *p, double eta, int lag);
/* Records this step's gradient norm; returns 1 in a critical regime. */
int gcoll_phase_update(gcoll_phase_t *p, double grad_norm);

/* Codec edits of adaptation (adapt_ctl.c). A quantizer with a width to choose: qsgd or q8
 * without a sparsifier. */
struct gcoll_compressor;
struct gcoll_tensor_state;
struct gcoll_comm;
int gcoll_adapt_is_quant(const struct gcoll_compressor *c);
/* A sparsifier with a density to choose (top-k, random-k, DGC; not k=K). */
int gcoll_adapt_has_density(const struct gcoll_compressor *c);
unsigned gcoll_adapt_bits_of(const struct gcoll_compressor *c);
/* Sets c's width (spec rewritten): q8 at 8 bits when the codec was q8, else QSGD levels. */
void gcoll_adapt_set_bits(struct gcoll_compressor *c, unsigned bits, int orig_q8);

/* The compressed allreduce's hooks for a state with a controller attached: before the
 * call (on the progress thread: samples grad), and after a successful one (the agreement
 * allreduce and the next decision). */
void gcoll_adapt_before(struct gcoll_comm *comm, struct gcoll_tensor_state *s, const float *grad,
                        size_t count);
gcoll_status_t gcoll_adapt_after(struct gcoll_comm *comm, struct gcoll_tensor_state *s,
                                 size_t count);

#endif /* GCOLL_ADAPT_H */
