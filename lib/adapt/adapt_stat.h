/* adapt_stat.h: adaptation from the gradient's own statistics: the gradient noise scale
 * (McCandlish et al. 2018), a convergence-stage schedule, ACCORDION's phase as a ramp, the
 * per-bucket budget split and the quantizer's bit width. Pure functions of their inputs:
 * ranks that feed them the same agreed numbers decide alike. */
#ifndef GCOLL_ADAPT_STAT_H
#define GCOLL_ADAPT_STAT_H

#include <stddef.h>
#include <stdint.h>

/* GCOLL_ADAPT rules as a bit mask (gcoll.h's GCOLL_ADAPT_* have the same values). */
enum {
    GCOLL_AR_BANDWIDTH = 1,
    GCOLL_AR_PHASE = 2,
    GCOLL_AR_SNR = 4,
    GCOLL_AR_STAGE = 8,
    GCOLL_AR_BUDGET = 16,
    GCOLL_AR_STAT = GCOLL_AR_SNR | GCOLL_AR_STAGE, /* rules with a statistical need */
};

/* Parses "off", "both" (bandwidth+phase) or rules joined by '+' (or ','): 0 and *mask on
 * success, -1 on an unknown or empty name. */
int gcoll_adapt_rules_parse(const char *s, unsigned *mask);
/* "snr+bandwidth"-style name of mask into buf (canonical order). */
void gcoll_adapt_rules_name(unsigned mask, char *buf, size_t len);

/* Coordinates sampled per tensor for the noise estimate (all of them when it has fewer):
 * each rank sends their values with the step's agreement, so that the mean gradient on
 * them is exact even when the codec is lossy. */
#define GCOLL_SNR_SAMPLE 16

/* The sampled coordinates of step `step` of a tensor of n elements (m = min(n,
 * GCOLL_SNR_SAMPLE) of them, evenly spaced from an offset drawn from (step, salt): the
 * same on every rank, uniform over the tensor across steps). Returns m. */
size_t gcoll_snr_sample_idx(size_t n, uint64_t step, uint64_t salt, size_t *idx);

/* McCandlish et al. 2018, appendix A: from the mean over P ranks of the squared norm of
 * each rank's gradient (batch b) and the squared norm of their mean (batch P b), the
 * unbiased estimates of |G|^2 and of tr(Sigma) / b (the noise of one rank's batch):
 *   |G|^2 = (P |g_mean|^2 - mean |g_i|^2) / (P - 1)
 *   S     = P (mean |g_i|^2 - |g_mean|^2) / (P - 1)
 * Returns 0 when P < 2 (one batch size gives no estimate) or the inputs are not finite. */
int gcoll_snr_estimate(int P, double local_sq_mean, double global_sq, double *g2_p, double *s_p);

/* The per-sample form: vals holds P rows of m sampled values (rank-major, row r at
 * vals + r * stride), scale = n / m.
 * Writes the mean over ranks of |g_i|^2 and |g_mean|^2, both scaled to the whole tensor,
 * summed in rank order (the same bits on every rank). */
void gcoll_snr_from_samples(int P, size_t m, size_t stride, const double *vals, double scale,
                            double *local_sq_mean_p, double *global_sq_p);

/* Smoothed estimate: EWMAs of |G|^2 and S kept apart (their ratio is biased when taken per
 * step), with the startup bias corrected as Adam's moments are. */
typedef struct {
    double half_life;
    double g2, s, w; /* unnormalized EWMAs and their weight */
    long n;          /* estimates taken */
} gcoll_snr_t;

void gcoll_snr_init(gcoll_snr_t *e, double half_life);
/* Takes one step's estimate (gcoll_snr_estimate's inputs); ignored when P < 2. */
void gcoll_snr_update(gcoll_snr_t *e, int P, double local_sq_mean, double global_sq);
/* Smoothed |G|^2 and S (0 before the first estimate). */
double gcoll_snr_g2(const gcoll_snr_t *e);
double gcoll_snr_s(const gcoll_snr_t *e);
/* B_noise = tr(Sigma) / |G|^2 in units of one rank's batch (S / |G|^2); 0 unknown. A
 * signal estimate at or below zero (noise swamping it) gives 1e30. */
double gcoll_snr_noise_scale(const gcoll_snr_t *e);
/* The noise's share of the reduced gradient's energy, phi = nu / (1 + nu) with
 * nu = B_noise / (P b) = S / (P |G|^2): 0 clean signal, 1 all noise; -1 unknown. */
double gcoll_snr_noise_share(const gcoll_snr_t *e, int P);

/* lo^(1-x) hi^x: x in [0, 1] mapped between two bounds on a log scale. */
double gcoll_adapt_interp(double lo, double hi, double x);

/* Convergence stage: s = min over steps of (smoothed |g_mean|) / (its peak so far), in
 * (0, 1]; 1 until the smoothing has seen half_life steps. Falls as the gradient norm falls
 * and never rises again, so the density it gives only falls. */
typedef struct {
    double half_life;
    double ema, w, peak, stage;
    long n;
} gcoll_stage_t;

void gcoll_stage_init(gcoll_stage_t *st, double half_life);
double gcoll_stage_update(gcoll_stage_t *st, double global_sq);

/* ACCORDION's critical phase as a ramp: the boost p in [0, 1] rises by GCOLL_PHASE_RAMP per
 * critical step and falls by as much per other step; the density is interp(d, dmax, p). */
#define GCOLL_PHASE_RAMP 0.25
double gcoll_phase_boost(double p, int critical);

/* Splits a budget of `total` selected elements over n buckets: bucket j gets k[j] in
 * [lo[j], hi[j]], in proportion to w[j] (k_j = clamp(lambda w_j, lo_j, hi_j), lambda found
 * by bisection: buckets at a bound keep it, the rest share what is left), rounded by
 * largest remainder so that the k[j] sum to
 * total exactly. total is clamped to [sum lo, sum hi] first; returns the total given.
 * CGX (Markov et al. 2022) assigns its per-layer compression by such a statistic. */
uint64_t gcoll_budget_split(int n, const double *w, const uint64_t *lo, const uint64_t *hi,
                            uint64_t total, uint64_t *k);

/* Quantizer bit width: the largest of 2, 4, 8 that is at most `need` bits and whose wire
 * time (wire_s measured at bits_now, proportional to the width) fits in budget_s; 2 when
 * none fits. budget_s <= 0: no bandwidth limit. */
unsigned gcoll_pick_bits(double need, double wire_s, unsigned bits_now, double budget_s);
/* The statistical need in bits: interp(2, 8, x). */
double gcoll_bits_need(double x);

/* One tensor's (or bucket's) statistical controller: its signals and the rule that turns
 * them into a density or a bit width (docs/adaptation.md, "The statistical rules"). */
typedef struct {
    unsigned rules;      /* GCOLL_AR_* */
    double dmin, dmax;   /* GCOLL_DENSITY_MIN/MAX */
    double base_density; /* the spec's (0: a quantizer) */
    unsigned base_bits;  /* a quantizer's width (0: a sparsifier) */
    gcoll_snr_t snr;
    gcoll_stage_t stage;
    double energy, energy_w; /* EWMA of the mean over ranks of |g_i|^2 (budget weight) */
    double x;                /* the statistical exponent last computed, -1 none */
} gcoll_adapt_sig_t;

void gcoll_sig_init(gcoll_adapt_sig_t *g, unsigned rules, double dmin, double dmax,
                    double base_density, unsigned base_bits, double half_life);
/* One step's agreed norms (gcoll_snr_from_samples's outputs) on P ranks. */
void gcoll_sig_update(gcoll_adapt_sig_t *g, int P, double local_sq_mean, double global_sq);
/* The statistical need: interp(dmin, dmax, x) with x the product of the noise share (snr)
 * and the stage (stage); the spec's density when no statistical rule is on or the noise is
 * not known yet (one rank) and only bandwidth decides; dmax with bandwidth alone. */
double gcoll_sig_need_density(gcoll_adapt_sig_t *g, int P);
/* The same exponent in bits: interp(spec's width, 8, x); the spec's width without one (8
 * with bandwidth alone). */
double gcoll_sig_need_bits(gcoll_adapt_sig_t *g, int P);
/* The combination: min(bandwidth cap, need), then raised towards the maximum by the phase
 * boost p: interp(min(cap, need), hi, p). cap <= 0: no bandwidth rule. */
double gcoll_adapt_combine(double cap, double need, double hi, double p);
/* The smoothed energy (budget weight). */
double gcoll_sig_energy(const gcoll_adapt_sig_t *g);

/* The budget rule over n buckets of count[j] elements at densities d[j] (in: what the
 * other rules chose; out: the split): the total k they select is spread over the buckets
 * by w_j = sqrt(count_j * energy_j) (energy: the smoothed mean squared norm of the bucket's
 * gradient; 0 unknown: w_j = count_j), each k_j within [dmin, dmax] of its bucket, the
 * total kept exactly; d[j] = k_j / count_j. */
void gcoll_adapt_budget(int n, const size_t *count, const double *energy, double dmin, double dmax,
                        double *d);

#endif /* GCOLL_ADAPT_STAT_H */
