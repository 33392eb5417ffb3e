/* ssp.c: one rank's shard of the bounded-staleness parameter server. Updates are summed
 * per clock, each weighted by f(tau) with tau = c - kread, the whole clocks the shard
 * completed between the model the worker read (kread) and the update's application (at
 * the completion of clock c): SSP's bound (Ho et al. 2013) keeps tau <= S, and S = 0 makes
 * it synchronous SGD (tau = 0, each clock applied whole). f(tau) = 1/(1+tau) is the
 * staleness-dependent learning rate of Zhang et al. 2016 ("Staleness-aware Async-SGD"). */
#include "training/ssp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gcoll_status_t gcoll_ssp_init(gcoll_ssp_shard_t *s, int P, int S, size_t n, const float *init,
                              float lr, int weighting)
{
    memset(s, 0, sizeof(*s));
    if (P < 1 || S < 0 || S > 1000)
        return GCOLL_ERR_INVALID;
    s->P = P;
    s->S = S;
    s->n = n;
    s->lr = lr;
    s->weighting = weighting;
    size_t rows = (size_t)S + 1, nn = n ? n : 1;
    s->w = malloc(nn * sizeof(float));
    s->acc = calloc(rows * nn, sizeof(float));
    s->npushed = calloc(rows, sizeof(int));
    s->wclock = calloc((size_t)P, sizeof(uint64_t));
    s->hist = calloc(rows, sizeof(uint64_t));
    if (!s->w || !s->acc || !s->npushed || !s->wclock || !s->hist) {
        gcoll_ssp_free(s);
        return GCOLL_ERR_NOMEM;
    }
    if (init && n)
        memcpy(s->w, init, n * sizeof(float));
    else
        memset(s->w, 0, nn * sizeof(float));
    return GCOLL_OK;
}

void gcoll_ssp_free(gcoll_ssp_shard_t *s)
{
    free(s->w);
    free(s->acc);
    free(s->npushed);
    free(s->wclock);
    free(s->hist);
    free(s->view);
    memset(s, 0, sizeof(*s));
}

double gcoll_ssp_weight(int weighting, uint64_t tau)
{
    return weighting == GCOLL_PS_WEIGHT_NONE ? 1.0 : 1.0 / (1.0 + (double)tau);
}

gcoll_status_t gcoll_ssp_check(const gcoll_ssp_shard_t *s, int worker, uint64_t c, uint64_t kread,
                               char *why, size_t whylen)
{
    const char *msg = NULL;
    if (worker < 0 || worker >= s->P)
        msg = "no such worker";
    else if (c != s->wclock[worker])
        msg = "update out of order";
    else if (c < s->clock || c > s->clock + (uint64_t)s->S)
        msg = "clock outside the staleness window";
    else if (kread > s->clock || c - kread > (uint64_t)s->S)
        msg = "read clock outside the staleness bound";
    if (!msg)
        return GCOLL_OK;
    if (why)
        snprintf(why, whylen,
                 "%s (worker %d, clock %llu, read at %llu; shard at clock %llu, "
                 "S = %d)",
                 msg, worker, (unsigned long long)c, (unsigned long long)kread,
                 (unsigned long long)s->clock, s->S);
    return GCOLL_ERR_INVALID;
}

float *gcoll_ssp_row(gcoll_ssp_shard_t *s, uint64_t c, uint64_t kread, float *scale_p)
{
    *scale_p = (float)(gcoll_ssp_weight(s->weighting, c - kread) / (double)s->P);
    return s->acc + (size_t)(c % ((uint64_t)s->S + 1)) * s->n;
}

int gcoll_ssp_commit(gcoll_ssp_shard_t *s, int worker, uint64_t c, uint64_t kread)
{
    size_t rows = (size_t)s->S + 1;
    s->wclock[worker] = c + 1;
    s->npushed[c % rows]++;
    uint64_t tau = c - kread;
    s->hist[tau]++;
    s->napplied++;
    s->tau_sum += (double)tau;
    int done = 0;
    while (s->npushed[s->clock % rows] == s->P) {
        size_t r = (size_t)(s->clock % rows);
        float *row = s->acc + r * s->n;
        for (size_t j = 0; j < s->n; j++) { /* one pass: the row is read and cleared */
            s->w[j] -= s->lr * row[j];
            row[j] = 0.0f;
        }
        s->npushed[r] = 0;
        s->clock++;
        done++;
    }
    return done;
}

gcoll_status_t gcoll_ssp_enable_views(gcoll_ssp_shard_t *s)
{
    if (s->view)
        return GCOLL_OK;
    s->view = malloc((size_t)s->P * (s->n ? s->n : 1) * sizeof(float));
    if (!s->view)
        return GCOLL_ERR_NOMEM;
    for (int p = 0; p < s->P; p++)
        gcoll_ssp_snapshot(s, p);
    return GCOLL_OK;
}

void gcoll_ssp_snapshot(gcoll_ssp_shard_t *s, int worker)
{
    if (s->n)
        memcpy(gcoll_ssp_view(s, worker), s->w, s->n * sizeof(float));
}

void gcoll_ssp_compensate(const gcoll_ssp_shard_t *s, int worker, float *g, float lambda)
{
    const float *v = s->view + (size_t)worker * s->n;
    for (size_t j = 0; j < s->n; j++)
        g[j] += lambda * g[j] * g[j] * (s->w[j] - v[j]);
}
