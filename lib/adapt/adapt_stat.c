/* adapt_stat.c: the statistical signals of adaptation (noise scale, stage, phase ramp),
 * the budget split and the bit-width choice. Pure functions: the same agreed inputs give
 * the same decisions on every rank. */
#include "adapt/adapt_stat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/config.h"
#include "compress/compress.h"

int gcoll_adapt_rules_parse(const char *s, unsigned *mask)
{
    return gcoll_parse_flags(s, GCOLL_ADAPT_RULE_CHOICES, mask);
}

void gcoll_adapt_rules_name(unsigned mask, char *buf, size_t len)
{
    static const char *const names[] = {"bandwidth", "phase", "snr", "stage", "budget"};
    size_t used = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((mask & (1u << i)) && used < len)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "+" : "", names[i]);
    if (!mask && len)
        snprintf(buf, len, "off");
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

size_t gcoll_snr_sample_idx(size_t n, uint64_t step, uint64_t salt, size_t *idx)
{
    if (n <= GCOLL_SNR_SAMPLE) {
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        return n;
    }
    /* evenly spaced from a random offset: each coordinate has probability m / n per step,
     * so the scaled sums are unbiased for the whole tensor */
    size_t m = GCOLL_SNR_SAMPLE, stride = n / m;
    size_t off = (size_t)(mix64(step * 0x100000001b3ull ^ mix64(salt)) % (uint64_t)stride);
    for (size_t i = 0; i < m; i++)
        idx[i] = off + i * stride;
    return m;
}

int gcoll_snr_estimate(int P, double local_sq_mean, double global_sq, double *g2_p, double *s_p)
{
    if (P < 2 || !isfinite(local_sq_mean) || !isfinite(global_sq))
        return 0;
    *g2_p = ((double)P * global_sq - local_sq_mean) / (P - 1);
    *s_p = (double)P * (local_sq_mean - global_sq) / (P - 1);
    return 1;
}

void gcoll_snr_from_samples(int P, size_t m, size_t stride, const double *vals, double scale,
                            double *local_sq_mean_p, double *global_sq_p)
{
    double loc = 0, glob = 0;
    for (size_t i = 0; i < m; i++) {
        double sum = 0;
        for (int r = 0; r < P; r++) {
            double v = vals[(size_t)r * stride + i];
            sum += v;
            loc += v * v;
        }
        double mean = sum / P;
        glob += mean * mean;
    }
    *local_sq_mean_p = scale * loc / P;
    *global_sq_p = scale * glob;
}

void gcoll_snr_init(gcoll_snr_t *e, double half_life)
{
    memset(e, 0, sizeof(*e));
    e->half_life = half_life > 0 ? half_life : 20;
}

void gcoll_snr_update(gcoll_snr_t *e, int P, double local_sq_mean, double global_sq)
{
    double g2, s;
    if (!gcoll_snr_estimate(P, local_sq_mean, global_sq, &g2, &s))
        return;
    double beta = pow(0.5, 1.0 / e->half_life);
    e->g2 = beta * e->g2 + (1 - beta) * g2;
    e->s = beta * e->s + (1 - beta) * s;
    e->w = beta * e->w + (1 - beta);
    e->n++;
}

double gcoll_snr_g2(const gcoll_snr_t *e)
{
    return e->w > 0 ? e->g2 / e->w : 0;
}
double gcoll_snr_s(const gcoll_snr_t *e)
{
    return e->w > 0 ? e->s / e->w : 0;
}

double gcoll_snr_noise_scale(const gcoll_snr_t *e)
{
    if (e->n == 0)
        return 0;
    double g2 = gcoll_snr_g2(e), s = gcoll_snr_s(e);
    if (s <= 0)
        return 1e-30; /* no measurable noise */
    return g2 > 0 ? s / g2 : 1e30;
}

double gcoll_snr_noise_share(const gcoll_snr_t *e, int P)
{
    if (e->n == 0 || P < 2)
        return -1;
    double g2 = gcoll_snr_g2(e), s = gcoll_snr_s(e);
    if (s <= 0)
        return 0;
    if (g2 <= 0)
        return 1;
    double nu = s / ((double)P * g2);
    return nu / (1 + nu);
}

double gcoll_adapt_interp(double lo, double hi, double x)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    return exp((1 - x) * log(lo) + x * log(hi));
}

void gcoll_stage_init(gcoll_stage_t *st, double half_life)
{
    memset(st, 0, sizeof(*st));
    st->half_life = half_life > 0 ? half_life : 20;
    st->stage = 1;
}

double gcoll_stage_update(gcoll_stage_t *st, double global_sq)
{
    if (!(global_sq >= 0) || !isfinite(global_sq))
        return st->stage;
    double beta = pow(0.5, 1.0 / st->half_life);
    st->ema = beta * st->ema + (1 - beta) * sqrt(global_sq);
    st->w = beta * st->w + (1 - beta);
    st->n++;
    double level = st->ema / st->w;
    if (level > st->peak)
        st->peak = level;
    /* the early steps only set the scale: the first norms are one noisy batch each */
    if (st->n >= st->half_life && st->peak > 0) {
        double r = level / st->peak;
        if (r < st->stage)
            st->stage = r;
    }
    return st->stage;
}

double gcoll_phase_boost(double p, int critical)
{
    p += critical ? GCOLL_PHASE_RAMP : -GCOLL_PHASE_RAMP;
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

uint64_t gcoll_budget_split(int n, const double *w, const uint64_t *lo, const uint64_t *hi,
                            uint64_t total, uint64_t *k)
{
    uint64_t slo = 0, shi = 0;
    for (int j = 0; j < n; j++) {
        slo += lo[j];
        shi += hi[j] > lo[j] ? hi[j] : lo[j];
    }
    total = total < slo ? slo : total > shi ? shi : total;
    double *x = n > 0 ? malloc((size_t)n * 2 * sizeof(double)) : NULL;
    if (!x) { /* no memory (or no buckets): the lower bounds, then fill in order; exact */
        uint64_t left = total;
        for (int j = 0; j < n; j++) {
            k[j] = lo[j];
            left -= lo[j];
        }
        for (int j = 0; j < n && left; j++) {
            uint64_t room = (hi[j] > lo[j] ? hi[j] : lo[j]) - k[j];
            uint64_t add = room < left ? room : left;
            k[j] += add;
            left -= add;
        }
        return total;
    }
    /* x_j = clamp(lambda w_j, lo_j, hi_j) with lambda such that the x_j sum to total (a
     * monotone function of lambda: bisection); weights all zero count as equal */
    double wsum = 0, *wt = (double *)(x + n);
    for (int j = 0; j < n; j++)
        wsum += w[j] > 0 ? w[j] : 0;
    for (int j = 0; j < n; j++)
        wt[j] = wsum > 0 ? (w[j] > 0 ? w[j] / wsum : 0) : 1.0 / n;
    double lam_lo = 0, lam_hi = 1;
    for (int it = 0; it < 200; it++) { /* grow until it reaches the total */
        double sum = 0;
        for (int j = 0; j < n; j++)
            sum +=
                fmin((double)(hi[j] > lo[j] ? hi[j] : lo[j]), fmax((double)lo[j], lam_hi * wt[j]));
        if (sum >= (double)total)
            break;
        lam_hi *= 2;
    }
    for (int it = 0; it < 200; it++) {
        double mid = 0.5 * (lam_lo + lam_hi), sum = 0;
        for (int j = 0; j < n; j++)
            sum += fmin((double)(hi[j] > lo[j] ? hi[j] : lo[j]), fmax((double)lo[j], mid * wt[j]));
        if (sum < (double)total)
            lam_lo = mid;
        else
            lam_hi = mid;
    }
    for (int j = 0; j < n; j++)
        x[j] = fmin((double)(hi[j] > lo[j] ? hi[j] : lo[j]), fmax((double)lo[j], lam_hi * wt[j]));
    /* integer parts, then the remainder to the largest fractions (ties: lower index) */
    uint64_t given = 0;
    for (int j = 0; j < n; j++) {
        double f = floor(x[j] + 1e-9);
        k[j] = (uint64_t)(f < (double)lo[j] ? (double)lo[j] : f);
        uint64_t h = hi[j] > lo[j] ? hi[j] : lo[j];
        if (k[j] > h)
            k[j] = h;
        given += k[j];
    }
    while (given < total) {
        int best = -1;
        double bf = -HUGE_VAL;
        for (int j = 0; j < n; j++) {
            uint64_t h = hi[j] > lo[j] ? hi[j] : lo[j];
            double f = x[j] - (double)k[j];
            if (k[j] < h && f > bf) {
                bf = f;
                best = j;
            }
        }
        if (best < 0)
            break;
        k[best]++;
        given++;
    }
    while (given > total) { /* floating-point excess: take from the smallest fractions */
        int best = -1;
        double bf = 1e300;
        for (int j = 0; j < n; j++) {
            double f = x[j] - (double)k[j];
            if (k[j] > lo[j] && f < bf) {
                bf = f;
                best = j;
            }
        }
        if (best < 0)
            break;
        k[best]--;
        given--;
    }
    free(x);
    return total;
}

double gcoll_bits_need(double x)
{
    return gcoll_adapt_interp(2, 8, x);
}

unsigned gcoll_pick_bits(double need, double wire_s, unsigned bits_now, double budget_s)
{
    static const unsigned widths[] = {8, 4, 2};
    for (int i = 0; i < 3; i++) {
        unsigned b = widths[i];
        if ((double)b > need * (1 + 1e-9))
            continue;
        if (budget_s <= 0 || !(wire_s > 0) || bits_now == 0 ||
            wire_s * (double)b / (double)bits_now <= budget_s)
            return b;
    }
    return 2;
}

void gcoll_sig_init(gcoll_adapt_sig_t *g, unsigned rules, double dmin, double dmax,
                    double base_density, unsigned base_bits, double half_life)
{
    memset(g, 0, sizeof(*g));
    g->rules = rules;
    g->dmin = dmin;
    g->dmax = dmax;
    g->base_density = base_density;
    g->base_bits = base_bits;
    gcoll_snr_init(&g->snr, half_life);
    gcoll_stage_init(&g->stage, half_life);
    g->x = -1;
}

void gcoll_sig_update(gcoll_adapt_sig_t *g, int P, double local_sq_mean, double global_sq)
{
    if (!isfinite(local_sq_mean) || !isfinite(global_sq))
        return;
    gcoll_snr_update(&g->snr, P, local_sq_mean, global_sq);
    gcoll_stage_update(&g->stage, global_sq);
    double beta = pow(0.5, 1.0 / g->snr.half_life);
    g->energy = beta * g->energy + (1 - beta) * local_sq_mean;
    g->energy_w = beta * g->energy_w + (1 - beta);
}

double gcoll_sig_energy(const gcoll_adapt_sig_t *g)
{
    return g->energy_w > 0 ? g->energy / g->energy_w : 0;
}

/* The statistical exponent, -1 when there is none (no rule, or the noise not known). */
static double sig_x(gcoll_adapt_sig_t *g, int P)
{
    if (!(g->rules & GCOLL_AR_STAT))
        return g->x = -1;
    double x = 1;
    if (g->rules & GCOLL_AR_SNR) {
        double phi = gcoll_snr_noise_share(&g->snr, P);
        if (phi < 0)
            return g->x = -1;
        x *= phi;
    }
    if (g->rules & GCOLL_AR_STAGE)
        x *= g->stage.stage;
    return g->x = x;
}

double gcoll_sig_need_density(gcoll_adapt_sig_t *g, int P)
{
    double x = sig_x(g, P);
    if (x >= 0)
        return gcoll_adapt_interp(g->dmin, g->dmax, x);
    if (g->rules & GCOLL_AR_BANDWIDTH)
        return g->dmax;
    double d = g->base_density;
    return d < g->dmin ? g->dmin : d > g->dmax ? g->dmax : d;
}

double gcoll_sig_need_bits(gcoll_adapt_sig_t *g, int P)
{
    double x = sig_x(g, P);
    /* the spec's width is the statistics' floor, as GCOLL_DENSITY_MIN is the density's:
     * measured on gcoll-train, snr's low noise share of the velocity took QSGD to 2 bits,
     * which does not train (test accuracy 0.10); only the bandwidth cap goes below it */
    if (x >= 0)
        return gcoll_adapt_interp(g->base_bits ? g->base_bits : 2, 8, x);
    return (g->rules & GCOLL_AR_BANDWIDTH) ? 8 : (double)(g->base_bits ? g->base_bits : 8);
}

double gcoll_adapt_combine(double cap, double need, double hi, double p)
{
    double d = cap > 0 && cap < need ? cap : need;
    return p > 0 && hi > d ? gcoll_adapt_interp(d, hi, p) : d;
}

void gcoll_adapt_budget(int n, const size_t *count, const double *energy, double dmin, double dmax,
                        double *d)
{
    if (n <= 0)
        return;
    uint64_t *buf = malloc((size_t)n * 3 * sizeof(uint64_t));
    double *w = malloc((size_t)n * sizeof(double));
    if (!buf || !w) {
        free(buf);
        free(w);
        return; /* the densities stay as the other rules chose */
    }
    uint64_t *lo = buf, *hi = buf + n, *k = buf + 2 * n, total = 0;
    for (int j = 0; j < n; j++) {
        double c = (double)count[j];
        /* as the codec rounds */
        uint64_t kj = (uint64_t)gcoll_density_k(d[j], c);
        total += kj < count[j] ? kj : count[j];
        lo[j] = (uint64_t)gcoll_density_k(dmin, c);
        hi[j] = (uint64_t)fmax((double)lo[j], floor(dmax * c * (1 + 1e-12)));
        if (hi[j] > count[j])
            hi[j] = count[j];
        if (lo[j] > hi[j])
            lo[j] = hi[j];
        w[j] = energy[j] > 0 ? sqrt(c * energy[j]) : c;
    }
    gcoll_budget_split(n, w, lo, hi, total, k);
    for (int j = 0; j < n; j++) {
        if (!count[j])
            continue;
        /* k_j / n_j, or the bound nearest to it that still gives k_j (a tensor of 10 takes
         * k = 1 at any density up to 0.1: reported as GCOLL_DENSITY_MAX, not 0.1) */
        double c = (double)count[j], dj = (double)k[j] / c;
        if (dj > dmax && (uint64_t)gcoll_density_k(dmax, c) == k[j])
            dj = dmax;
        if (dj < dmin && (uint64_t)gcoll_density_k(dmin, c) == k[j])
            dj = dmin;
        d[j] = dj;
    }
    free(buf);
    free(w);
}
