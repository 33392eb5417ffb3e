/* ssp.h: the server side of the bounded-staleness parameter server, network-free: one
 * rank's shard, SSP's clock bound (Ho et al. 2013) and the staleness-weighted accumulation
 * of pushed updates (Zhang et al. 2016). Internal; lib/training/ps.c drives it, tests script it. */
#ifndef GCOLL_SSP_H
#define GCOLL_SSP_H

#include <stddef.h>
#include <stdint.h>

#include "gcoll.h"

typedef struct {
    int P, S;
    size_t n; /* floats in this rank's shard (all tensors' slices, concatenated) */
    float lr;
    int weighting;    /* gcoll_ps_weight_t */
    float *w;         /* the shard */
    float *acc;       /* (S + 1) rows of n: the weighted sum of clock k's updates, row k % (S+1) */
    int *npushed;     /* per row: workers whose update for that clock arrived */
    uint64_t clock;   /* clocks completed: every worker's update for each clock < clock is in w */
    uint64_t *wclock; /* per worker: updates received (the next one must be for this clock) */
    uint64_t *hist;   /* S + 1 bins: applied updates by staleness tau */
    uint64_t napplied;
    double tau_sum;
    float *view; /* NULL, or P rows of n: the model each worker holds (what it read) */
} gcoll_ssp_shard_t;

/* n floats from init (NULL: zeros). GCOLL_ERR_NOMEM, GCOLL_ERR_INVALID (P < 1, S < 0). */
gcoll_status_t gcoll_ssp_init(gcoll_ssp_shard_t *s, int P, int S, size_t n, const float *init,
                              float lr, int weighting);
void gcoll_ssp_free(gcoll_ssp_shard_t *s);

/* f(tau): 1/(1+tau) for GCOLL_PS_WEIGHT_INVERSE, 1 for GCOLL_PS_WEIGHT_NONE. */
double gcoll_ssp_weight(int weighting, uint64_t tau);

/* Whether a worker whose clock is c may read the shard now: every update older than
 * c - S is in it (clock >= c - S). */
static inline int gcoll_ssp_can_read(const gcoll_ssp_shard_t *s, uint64_t c)
{
    return s->clock + (uint64_t)s->S >= c;
}

/* Checks worker's update for clock c, computed on the shard as of clock kread: in order
 * (c is the worker's next clock), within the window [clock, clock + S], kread <= clock and
 * c - kread <= S. GCOLL_ERR_INVALID with why (if not NULL) otherwise; nothing changes. */
gcoll_status_t gcoll_ssp_check(const gcoll_ssp_shard_t *s, int worker, uint64_t c, uint64_t kread,
                               char *why, size_t whylen);
/* The row to add update (c, kread) into, and the factor to scale it by: lr-free weight
 * f(c - kread) / P (the average over workers, staleness-weighted). Call after check. */
float *gcoll_ssp_row(gcoll_ssp_shard_t *s, uint64_t c, uint64_t kread, float *scale_p);
/* Records that worker's update for clock c is in its row; completes every clock whose P
 * updates are all in, in order: w -= lr * row, the row cleared. Returns the number of
 * clocks completed. */
int gcoll_ssp_commit(gcoll_ssp_shard_t *s, int worker, uint64_t c, uint64_t kread);

/* Keeps a copy of the model each worker holds (for DC-ASGD and compressed pulls), each
 * starting as the shard's initial value. GCOLL_ERR_NOMEM. */
gcoll_status_t gcoll_ssp_enable_views(gcoll_ssp_shard_t *s);
static inline float *gcoll_ssp_view(gcoll_ssp_shard_t *s, int worker)
{
    return s->view + (size_t)worker * s->n;
}
/* worker reads the shard as it is now (a dense pull): its view becomes w. */
void gcoll_ssp_snapshot(gcoll_ssp_shard_t *s, int worker);
/* DC-ASGD's delay compensation (Zheng et al. 2017): the update g, computed at the model
 * the worker holds, is corrected towards the gradient at the shard's current model by the
 * diagonal of the outer-product Hessian approximation, g += lambda g*g*(w - view). Call on
 * arrival of a push, before it is weighted and summed; needs views. */
void gcoll_ssp_compensate(const gcoll_ssp_shard_t *s, int worker, float *g, float lambda);

#endif
