/* async.c: gcoll-train --async: bounded-staleness asynchronous SGD over gcoll's in-job
 * parameter server (gcoll_ps_*). Each step a worker pulls the model (SSP may hold it back
 * until the slowest worker is within S clocks), computes its gradient on its slice of the
 * global batch, folds it into its momentum buffer (v = m v + g, on the worker: with S = 0
 * the owners' average of the v's is synchronous SGD's momentum) and pushes v compressed.
 * No collective may run while the server does, so the model is evaluated once, after
 * gcoll_ps_finish has gathered it on every rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "modes.h"

/* One run of train_run_async: its sizes and what it holds. */
typedef struct {
    const train_opts_t *o;
    const train_mode_opts_t *mo;
    const train_data_t *d;
    gcoll_comm_t *comm;
    FILE *out;
    int rank, size;
    size_t ntrain, ntest, global, steps; /* steps per epoch */
    float momentum;
    int weighting; /* gcoll_ps_weight_t */
    train_work_t w;
    gcoll_ps_t *ps;
    const float *push[2 * TRAIN_MAX_LAYERS]; /* what is pushed, per tensor */
} as_run_t;

/* The parameter server with the model's tensors, started; -1 after saying why. */
static int as_server(as_run_t *a)
{
    const train_opts_t *o = a->o;
    const train_mode_opts_t *mo = a->mo;
    train_work_t *w = &a->w;
    gcoll_ps_config_t pc = {.staleness = mo->staleness,
                            .lr = o->lr,
                            .compressor = o->compressor,
                            .pull_compressor = mo->pull_compressor,
                            .weighting = (gcoll_ps_weight_t)a->weighting,
                            .dc_lambda = (float)mo->dc_lambda,
                            .prefetch = mo->prefetch};
    gcoll_status_t st = gcoll_ps_create(a->comm, &pc, &a->ps);
    if (st != GCOLL_OK) {
        train_mode_fail(a->comm, "gcoll_ps_create", st);
        return -1;
    }
    for (int l = 0; l < w->m.nl && st == GCOLL_OK; l++) {
        st = gcoll_ps_add_tensor(a->ps, w->m.l[l].w, (size_t)w->m.l[l].in * w->m.l[l].out, NULL);
        if (st == GCOLL_OK)
            st = gcoll_ps_add_tensor(a->ps, w->m.l[l].b, (size_t)w->m.l[l].out, NULL);
        /* what is pushed: the momentum buffer, or the gradient without momentum */
        a->push[2 * l] = a->momentum > 0 ? w->m.l[l].vw : w->m.l[l].gw;
        a->push[2 * l + 1] = a->momentum > 0 ? w->m.l[l].vb : w->m.l[l].gb;
    }
    if (st == GCOLL_OK)
        st = gcoll_ps_start(a->ps);
    if (st != GCOLL_OK) {
        train_mode_fail(a->comm, "gcoll_ps_start", st);
        return -1;
    }
    return 0;
}

/* Rank 0's header: the model and the run's settings. */
static void as_header(const as_run_t *a)
{
    const train_opts_t *o = a->o;
    const train_mode_opts_t *mo = a->mo;
    FILE *out = a->out;
    train_print_model(out, "", a->comm, &a->w);
    fprintf(out,
            "async SGD: parameter server with staleness bound S=%d, weight %s, push "
            "compressor %s, worker momentum %g; batch %d per rank (%zu global), lr %g; "
            "%zu steps per epoch on %zu examples, %zu test; seed %llu",
            mo->staleness, a->weighting == GCOLL_PS_WEIGHT_NONE ? "1" : "1/(1+tau)", o->compressor,
            (double)a->momentum, o->batch, a->global, (double)o->lr, a->steps, a->ntrain, a->ntest,
            (unsigned long long)o->seed);
    if (mo->pull_compressor)
        fprintf(out, "; pull compressor %s", mo->pull_compressor);
    if (mo->dc_lambda > 0)
        fprintf(out, "; DC-ASGD lambda %g", mo->dc_lambda);
    fprintf(out, "; pulls %s", mo->prefetch ? "prefetched" : "waited");
    if (mo->straggle > 0)
        fprintf(out, "; rotating straggler x%g", mo->straggle);
    if (mo->slow_rank >= 0)
        fprintf(out, "; rank %d slow x%g", mo->slow_rank, mo->slow_factor);
    fprintf(out, "\n# per epoch: rank 0's train loss and pull wait (the test set is "
                 "evaluated once, after the last epoch)\n");
    fflush(out);
}

/* The worker's momentum buffer: v = m v + g. */
static void as_velocity(train_mlp_t *m, float momentum)
{
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        for (size_t j = 0; j < (size_t)L->in * L->out; j++)
            L->vw[j] = momentum * L->vw[j] + L->gw[j];
        for (size_t j = 0; j < (size_t)L->out; j++)
            L->vb[j] = momentum * L->vb[j] + L->gb[j];
    }
}

/* Epoch e: pull, compute and push every step (gstep counts them over the run); -1 after
 * saying why. */
static int as_epoch(as_run_t *a, int e, uint64_t *gstep, train_result_t *res)
{
    const train_opts_t *o = a->o;
    train_work_t *w = &a->w;
    gcoll_status_t st;
    double t0 = train_now_s(), loss_sum = 0.0;
    gcoll_ps_stats_t s0;
    gcoll_ps_stats(a->ps, &s0);
    train_permutation(w->perm, a->ntrain, o->seed, (uint64_t)e);
    for (size_t s = 0; s < a->steps; s++, (*gstep)++) {
        if ((st = gcoll_ps_pull(a->ps)) != GCOLL_OK) {
            train_mode_fail(a->comm, "gcoll_ps_pull", st);
            return -1;
        }
        train_gather(&a->d->train, w->perm + s * a->global + (size_t)a->rank * o->batch,
                     (size_t)o->batch, w->x, w->y);
        int extra = train_straggle_passes(a->mo, o->seed, *gstep, a->rank, a->size);
        double loss = 0;
        for (int k = 0; k <= extra; k++) {
            loss = train_mlp_forward(&w->m, w->x, w->y, o->batch, NULL);
            train_mlp_backward(&w->m, w->y, NULL, NULL);
        }
        if (!isfinite(loss)) {
            fprintf(stderr,
                    "gcoll-train: rank %d: the loss diverged (%g) at epoch %d step "
                    "%zu: try a smaller --lr\n",
                    a->rank, loss, e + 1, s);
            return -1;
        }
        loss_sum += loss;
        if (a->momentum > 0)
            as_velocity(&w->m, a->momentum);
        if ((st = gcoll_ps_push(a->ps, a->push)) != GCOLL_OK) {
            train_mode_fail(a->comm, "gcoll_ps_push", st);
            return -1;
        }
    }
    gcoll_ps_stats_t s1;
    gcoll_ps_stats(a->ps, &s1);
    double tl = loss_sum / (double)a->steps;
    if (e == 0)
        res->first_loss = tl;
    res->last_loss = tl;
    if (a->out) {
        fprintf(a->out, "epoch %d: rank 0 train loss %.4f, %.2f s, pull wait %.2f s\n", e + 1, tl,
                train_now_s() - t0, s1.wait_s - s0.wait_s);
        fflush(a->out);
    }
    return 0;
}

/* After gcoll_ps_finish: the gathered model on the test set, and rank 0's summary of the
 * run (t_train seconds of training); -1 after saying why. */
static int as_test(as_run_t *a, double t_train, train_result_t *res)
{
    train_work_t *w = &a->w;
    FILE *out = a->out;
    gcoll_status_t st;
    gcoll_ps_stats_t fs;
    gcoll_ps_stats(a->ps, &fs);
    double test_loss = 0.0;
    long correct = 0;
    train_mode_evaluate(&w->m, &a->d->test, a->ntest, a->rank, a->size, w->x, w->y, w->idx,
                        &test_loss, &correct);
    double v[2] = {(double)correct, test_loss};
    if ((st = gcoll_allreduce(a->comm, v, v, 2, GCOLL_FLOAT64, GCOLL_SUM)) != GCOLL_OK) {
        train_mode_fail(a->comm, "test statistics", st);
        return -1;
    }
    res->final_acc = v[0] / (double)a->ntest;
    if (out) {
        fprintf(out,
                "test loss %.4f after %.2f s of training; staleness histogram (tau: "
                "updates):",
                v[1] / (double)a->ntest, t_train);
        for (int k = 0; k < 9; k++)
            if (fs.hist[k])
                fprintf(out, " %d%s:%llu", k, k == 8 ? "+" : "", (unsigned long long)fs.hist[k]);
        fprintf(out, "\nfinal test accuracy: %.4f\nmax clock gap: %llu\nmean staleness: %.4f\n",
                res->final_acc, (unsigned long long)fs.max_gap, fs.mean_staleness);
        fflush(out);
    }
    return 0;
}

int train_run_async(const train_opts_t *o, const train_mode_opts_t *mo, const train_data_t *d,
                    gcoll_comm_t *comm, FILE *out, int keep_params, train_result_t *res)
{
    as_run_t a = {.o = o, .mo = mo, .d = d, .comm = comm, .out = out};
    a.rank = gcoll_comm_rank(comm);
    a.size = gcoll_comm_size(comm);
    a.ntrain = o->limit && o->limit < d->train.n ? o->limit : d->train.n;
    a.ntest = o->test_limit && o->test_limit < d->test.n ? o->test_limit : d->test.n;
    a.global = (size_t)o->batch * (size_t)a.size;
    a.steps = a.ntrain / a.global;
    /* With S > 0 asynchrony adds a momentum of its own (Mitliagkas et al. 2016, "Asynchrony
     * begets momentum"), so the worker's is lower, and updates count whole: at S = 4 under
     * --straggle 2 on 2 ranks, 5 epochs, momentum 0.7 with f = 1 ended 0.41-0.88 points
     * below synchronous SGD on 5 seeds, 0.9 with 1/(1+tau) 0.47-2.16 on 3
     * (docs/results/local-sgd.md). S = 0 is synchronous SGD, with its momentum. */
    a.momentum = o->momentum >= 0.0f ? o->momentum : mo->staleness > 0 ? 0.7f : 0.9f;
    a.weighting = mo->weighting_set   ? mo->weighting
                  : mo->staleness > 0 ? GCOLL_PS_WEIGHT_NONE
                                      : GCOLL_PS_WEIGHT_INVERSE;
    int rc = -1;
    if (train_work_init(&a.w, o, d, a.ntrain, a.rank) != 0)
        return -1;
    int started = 0;
    if (as_server(&a) != 0)
        goto out;
    started = 1;
    if (out)
        as_header(&a);
    uint64_t gstep = 0;
    double t_start = train_now_s();
    for (int e = 0; e < o->epochs; e++)
        if (as_epoch(&a, e, &gstep, res) != 0)
            goto out;
    double t_train = train_now_s() - t_start;
    started = 0;
    gcoll_status_t st;
    if ((st = gcoll_ps_finish(a.ps)) != GCOLL_OK) {
        train_mode_fail(comm, "gcoll_ps_finish", st);
        goto out;
    }
    if (as_test(&a, t_train, res) != 0)
        goto out;
    if (keep_params && train_keep_params(&a.w.m, a.rank, res) != 0)
        goto out;
    rc = 0;
out:
    if (started)
        gcoll_comm_abort(comm); /* the server must not wait for this worker */
    gcoll_ps_destroy(a.ps);
    train_work_free(&a.w);
    return rc;
}
