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

int train_run_async(const train_opts_t *o, const train_mode_opts_t *mo, const train_data_t *d,
                    gcoll_comm_t *comm, FILE *out, int keep_params, train_result_t *res)
{
    int rank = gcoll_comm_rank(comm), size = gcoll_comm_size(comm);
    size_t ntrain = o->limit && o->limit < d->train.n ? o->limit : d->train.n;
    size_t ntest = o->test_limit && o->test_limit < d->test.n ? o->test_limit : d->test.n;
    size_t global = (size_t)o->batch * (size_t)size, steps = ntrain / global;
    float momentum = o->momentum >= 0.0f ? o->momentum : 0.9f;
    int rc = -1;
    train_work_t w;
    if (train_work_init(&w, o, d, ntrain, rank) != 0)
        return -1;
    float *x = w.x;
    uint8_t *y = w.y;
    uint32_t *perm = w.perm, *idx = w.idx;
    gcoll_ps_t *ps = NULL;
    int started = 0;
    gcoll_ps_config_t pc = {.staleness = mo->staleness,
                            .lr = o->lr,
                            .compressor = o->compressor,
                            .pull_compressor = mo->pull_compressor,
                            .weighting = (gcoll_ps_weight_t)mo->weighting,
                            .dc_lambda = (float)mo->dc_lambda};
    gcoll_status_t st = gcoll_ps_create(comm, &pc, &ps);
    if (st != GCOLL_OK) {
        train_mode_fail(comm, "gcoll_ps_create", st);
        goto out;
    }
    const float *push[2 * TRAIN_MAX_LAYERS];
    for (int l = 0; l < w.m.nl && st == GCOLL_OK; l++) {
        st = gcoll_ps_add_tensor(ps, w.m.l[l].w, (size_t)w.m.l[l].in * w.m.l[l].out, NULL);
        if (st == GCOLL_OK)
            st = gcoll_ps_add_tensor(ps, w.m.l[l].b, (size_t)w.m.l[l].out, NULL);
        /* what is pushed: the momentum buffer, or the gradient without momentum */
        push[2 * l] = momentum > 0 ? w.m.l[l].vw : w.m.l[l].gw;
        push[2 * l + 1] = momentum > 0 ? w.m.l[l].vb : w.m.l[l].gb;
    }
    if (st == GCOLL_OK)
        st = gcoll_ps_start(ps);
    if (st != GCOLL_OK) {
        train_mode_fail(comm, "gcoll_ps_start", st);
        goto out;
    }
    started = 1;
    if (out) {
        train_print_model(out, "", comm, &w);
        fprintf(out,
                "async SGD: parameter server with staleness bound S=%d, weight %s, push "
                "compressor %s, worker momentum %g; batch %d per rank (%zu global), lr %g; "
                "%zu steps per epoch on %zu examples, %zu test; seed %llu",
                mo->staleness, mo->weighting == GCOLL_PS_WEIGHT_NONE ? "1" : "1/(1+tau)",
                o->compressor, (double)momentum, o->batch, global, (double)o->lr, steps, ntrain,
                ntest, (unsigned long long)o->seed);
        if (mo->pull_compressor)
            fprintf(out, "; pull compressor %s", mo->pull_compressor);
        if (mo->dc_lambda > 0)
            fprintf(out, "; DC-ASGD lambda %g", mo->dc_lambda);
        if (mo->straggle > 0)
            fprintf(out, "; rotating straggler x%g", mo->straggle);
        if (mo->slow_rank >= 0)
            fprintf(out, "; rank %d slow x%g", mo->slow_rank, mo->slow_factor);
        fprintf(out, "\n# per epoch: rank 0's train loss and pull wait (the test set is "
                     "evaluated once, after the last epoch)\n");
        fflush(out);
    }
    uint64_t gstep = 0;
    double t_start = train_now_s();
    for (int e = 0; e < o->epochs; e++) {
        double t0 = train_now_s(), loss_sum = 0.0;
        gcoll_ps_stats_t s0;
        gcoll_ps_stats(ps, &s0);
        train_permutation(perm, ntrain, o->seed, (uint64_t)e);
        for (size_t s = 0; s < steps; s++, gstep++) {
            if ((st = gcoll_ps_pull(ps)) != GCOLL_OK) {
                train_mode_fail(comm, "gcoll_ps_pull", st);
                goto out;
            }
            train_gather(&d->train, perm + s * global + (size_t)rank * o->batch, (size_t)o->batch,
                         x, y);
            int extra = train_straggle_passes(mo, o->seed, gstep, rank, size);
            double loss = 0;
            for (int k = 0; k <= extra; k++) {
                loss = train_mlp_forward(&w.m, x, y, o->batch, NULL);
                train_mlp_backward(&w.m, y, NULL, NULL);
            }
            if (!isfinite(loss)) {
                fprintf(stderr,
                        "gcoll-train: rank %d: the loss diverged (%g) at epoch %d step "
                        "%zu: try a smaller --lr\n",
                        rank, loss, e + 1, s);
                goto out;
            }
            loss_sum += loss;
            if (momentum > 0)
                for (int l = 0; l < w.m.nl; l++) {
                    train_layer_t *L = &w.m.l[l];
                    for (size_t j = 0; j < (size_t)L->in * L->out; j++)
                        L->vw[j] = momentum * L->vw[j] + L->gw[j];
                    for (size_t j = 0; j < (size_t)L->out; j++)
                        L->vb[j] = momentum * L->vb[j] + L->gb[j];
                }
            if ((st = gcoll_ps_push(ps, push)) != GCOLL_OK) {
                train_mode_fail(comm, "gcoll_ps_push", st);
                goto out;
            }
        }
        gcoll_ps_stats_t s1;
        gcoll_ps_stats(ps, &s1);
        double tl = loss_sum / (double)steps;
        if (e == 0)
            res->first_loss = tl;
        res->last_loss = tl;
        if (out) {
            fprintf(out, "epoch %d: rank 0 train loss %.4f, %.2f s, pull wait %.2f s\n", e + 1, tl,
                    train_now_s() - t0, s1.wait_s - s0.wait_s);
            fflush(out);
        }
    }
    double t_train = train_now_s() - t_start;
    started = 0;
    if ((st = gcoll_ps_finish(ps)) != GCOLL_OK) {
        train_mode_fail(comm, "gcoll_ps_finish", st);
        goto out;
    }
    gcoll_ps_stats_t fs;
    gcoll_ps_stats(ps, &fs);
    double test_loss = 0.0;
    long correct = 0;
    train_mode_evaluate(&w.m, &d->test, ntest, rank, size, x, y, idx, &test_loss, &correct);
    double v[2] = {(double)correct, test_loss};
    if ((st = gcoll_allreduce(comm, v, v, 2, GCOLL_FLOAT64, GCOLL_SUM)) != GCOLL_OK) {
        train_mode_fail(comm, "test statistics", st);
        goto out;
    }
    res->final_acc = v[0] / (double)ntest;
    if (out) {
        fprintf(out,
                "test loss %.4f after %.2f s of training; staleness histogram (tau: "
                "updates):",
                v[1] / (double)ntest, t_train);
        for (int k = 0; k < 9; k++)
            if (fs.hist[k])
                fprintf(out, " %d%s:%llu", k, k == 8 ? "+" : "", (unsigned long long)fs.hist[k]);
        fprintf(out, "\nfinal test accuracy: %.4f\nmax clock gap: %llu\nmean staleness: %.4f\n",
                res->final_acc, (unsigned long long)fs.max_gap, fs.mean_staleness);
        fflush(out);
    }
    if (keep_params && train_keep_params(&w.m, rank, res) != 0)
        goto out;
    rc = 0;
out:
    if (started)
        gcoll_comm_abort(comm); /* the server must not wait for this worker */
    gcoll_ps_destroy(ps);
    train_work_free(&w);
    return rc;
}
