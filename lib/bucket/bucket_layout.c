/* bucket_layout.c: where the bucketer's buckets are cut (bucket_plan.c's rule applied to
 * the registered tensors) and their one rebuild from measured ready times and link rate,
 * moving the codec states to the new layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket/bucketer_int.h"
#include "base/util.h"
#include "core/ops.h"

/* The fixed cost of one bucket's ring allreduce assumed until one is measured: 2(P-1)
 * steps of a TCP round trip's half on a LAN and the progress thread's turn. */
double gcoll_bk_default_msg_s(int size)
{
    return size > 1 ? 50e-6 * 2 * (size - 1) + 100e-6 : 0;
}

/* The rule the layout follows: GCOLL_BUCKET_BYTES when set (buckets up to that size,
 * tensors whole), else the automatic one for this model on b->link (bucket_plan.h). */
void gcoll_bk_layout_rule(const gcoll_bucketer_t *b, gcoll_plan_rule_t *r, int timed)
{
    if (!b->autosize) {
        *r = (gcoll_plan_rule_t){.first = b->cfg.bucket_bytes, .target = b->cfg.bucket_bytes};
        return;
    }
    size_t total = 0;
    for (int i = 0; i < b->nt; i++)
        total += b->t[i].count * gcoll_dtype_size(b->t[i].dtype);
    gcoll_plan_rule_auto(total, &b->link, r);
    if (!timed)
        r->flush_s = 0;
}

/* Cuts the tensors, taken in order (NULL: registration order), into buckets by rule r:
 * b->seg, b->bk (their segments, counts and codec specs) and each tensor's pieces. */
gcoll_status_t gcoll_bk_layout(gcoll_bucketer_t *b, const int *order, const gcoll_plan_rule_t *r,
                               const double *ready)
{
    gcoll_plan_tensor_t *pt = calloc((size_t)b->nt + 1, sizeof(*pt));
    if (!pt)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < b->nt; i++) {
        tensor_t *t = &b->t[i];
        pt[i] = (gcoll_plan_tensor_t){.count = t->count,
                                      .esz = gcoll_dtype_size(t->dtype),
                                      .group = i,
                                      .ready = ready ? ready[i] : 0};
        for (int j = 0; j < i; j++) /* one group per (codec, dtype) */
            if (b->t[j].dtype == t->dtype && strcmp(b->t[j].chosen, t->chosen) == 0) {
                pt[i].group = pt[j].group;
                break;
            }
    }
    gcoll_plan_seg_t *ps = NULL;
    int ns = gcoll_plan_cut(pt, order, b->nt, r, &ps);
    free(pt);
    if (ns < 0)
        return GCOLL_ERR_NOMEM;
    b->nb = ns ? ps[ns - 1].bucket + 1 : 0;
    b->nseg = ns;
    b->seg = calloc((size_t)ns + 1, sizeof(seg_t));
    b->bk = calloc((size_t)b->nb + 1, sizeof(bucket_t));
    b->tok = calloc((size_t)b->nb + 1, sizeof(*b->tok));
    b->neg = calloc((size_t)b->nb + 1, sizeof(*b->neg));
    if (!b->seg || !b->bk || !b->tok || !b->neg) {
        free(ps);
        return GCOLL_ERR_NOMEM;
    }
    for (int s = 0; s < ns; s++) {
        bucket_t *k = &b->bk[ps[s].bucket];
        tensor_t *t = &b->t[ps[s].t];
        if (k->n++ == 0) {
            k->seg0 = s;
            k->dtype = t->dtype;
            k->b = b;
            if (!(k->spec = strdup(t->chosen))) {
                free(ps);
                return GCOLL_ERR_NOMEM;
            }
        }
        b->seg[s] = (seg_t){.t = ps[s].t,
                            .bucket = ps[s].bucket,
                            .toff = ps[s].toff,
                            .n = ps[s].n,
                            .foff = k->count};
        k->count += ps[s].n;
        if (ps[s].toff == 0) {
            t->seg0 = s;
            t->bucket = ps[s].bucket;
        }
        t->nseg++;
    }
    free(ps);
    return GCOLL_OK;
}

void gcoll_bk_log_layout(const gcoll_bucketer_t *b, const char *why)
{
    for (int s = 0; s < b->nseg && GCOLL_LOG_ON(GCOLL_LOG_INFO, GCOLL_SUBSYS_COLL); s++) {
        const seg_t *g = &b->seg[s];
        const tensor_t *t = &b->t[g->t];
        char rule[32];
        if (t->rule >= 0)
            snprintf(rule, sizeof(rule), "policy rule %d", t->rule + 1);
        char part[96] = ""; /* a split tensor's piece */
        if (g->n != t->count)
            snprintf(part, sizeof(part), ", piece %zu..%zu", g->toff, g->toff + g->n);
        GCOLL_INFO(GCOLL_SUBSYS_COLL,
                   "bucketer: tensor %d '%s' (layer '%.*s', %zu elements%s) -> bucket %d, %s "
                   "(%s)",
                   g->t, t->name, (int)gcoll_policy_layer_len(t->name), t->name, t->count, part,
                   g->bucket, b->bk[g->bucket].spec,
                   t->rule >= 0    ? rule
                   : t->rule == -1 ? "default"
                   : t->spec       ? "explicit"
                                   : "not float32");
    }
    GCOLL_INFO(GCOLL_SUBSYS_COLL,
               "bucketer: %d tensors in %d buckets (%s; link %.1f MB/s, "
               "%.0f us per bucket assumed)",
               b->nt, b->nb, why, b->link.bw / 1e6, b->link.msg_s * 1e6);
}

/* Moves what the codec states remember (the residual, DGC's velocity, the step) from the
 * old buckets to the new ones, element by element through the tensors. */
static void move_states(gcoll_bucketer_t *b, const bucket_t *obk, int onb, const seg_t *oseg,
                        const int *oseg0, const int *onseg)
{
    for (int j = 0; j < b->nb; j++) {
        bucket_t *k = &b->bk[j];
        if (!k->state)
            continue;
        for (int s = k->seg0; s < k->seg0 + k->n; s++) {
            const seg_t *g = &b->seg[s];
            for (int o = oseg0[g->t]; o < oseg0[g->t] + onseg[g->t]; o++) {
                const seg_t *h = &oseg[o];
                const bucket_t *ok = &obk[h->bucket];
                size_t lo = GCOLL_MAX(g->toff, h->toff);
                size_t hi = GCOLL_MIN(g->toff + g->n, h->toff + h->n);
                if (lo >= hi || !ok->state || h->bucket >= onb)
                    continue;
                k->state->step = ok->state->step;
                size_t to = g->foff + lo - g->toff, from = h->foff + lo - h->toff;
                if (k->state->e && ok->state->e)
                    memcpy(k->state->e + to, ok->state->e + from, (hi - lo) * sizeof(float));
                if (k->state->u && ok->state->u)
                    memcpy(k->state->u + to, ok->state->u + from, (hi - lo) * sizeof(float));
            }
        }
    }
}

/* Whether every old bucket's state can move (compressed allreduce keeps a residual of its
 * reduced chunk, which belongs to no tensor element: such layouts stay). */
static int states_movable(const gcoll_bucketer_t *b)
{
    for (int j = 0; j < b->nb; j++)
        if (b->bk[j].state && b->bk[j].state->server)
            return 0;
    return 1;
}

static int by_ready(const void *x, const void *y, void *arg)
{
    const double *r = arg;
    int i = *(const int *)x, j = *(const int *)y;
    return r[i] < r[j] ? -1 : r[i] > r[j] ? 1 : i - j;
}

/* Insertion sort with a context (qsort_r is not portable); n is the tensor count. */
static void sort_order(int *order, int n, const double *ready)
{
    for (int i = 1; i < n; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0 && by_ready(&order[j], &x, (void *)ready) > 0) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = x;
    }
}

/* Frees a layout's buckets (nb of bk), segments and the priority arrays. */
static void layout_free(bucket_t *bk, int nb, seg_t *seg, gcoll_request_t **tok, int32_t *neg)
{
    for (int j = 0; bk && j < nb; j++)
        gcoll_bk_free(&bk[j]);
    free(bk);
    free(seg);
    free(tok);
    free(neg);
}

/* After the second communicating step (the first warms connections and pages): the ranks
 * agree on each tensor's ready time (the latest) and each bucket's collective time (the
 * shortest: the rank that waited least), fit the link from the latter and cut the buckets
 * again in ready order with the time rule. The same agreed numbers give every rank the
 * same layout. */
gcoll_status_t gcoll_bk_rebuild(gcoll_bucketer_t *b)
{
    int nt = b->nt, nb = b->nb;
    double *v = calloc((size_t)(nt + 2 * nb) + 1, sizeof(double));
    int *order = calloc((size_t)nt + 1, sizeof(int));
    int *oseg0 = calloc((size_t)nt + 1, sizeof(int)), *onseg = calloc((size_t)nt + 1, sizeof(int));
    int *obucket = calloc((size_t)nt + 1, sizeof(int));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!v || !order || !oseg0 || !onseg || !obucket)
        goto out;
    for (int i = 0; i < nt; i++)
        v[i] = b->t[i].t_ready;
    for (int j = 0; j < nb; j++) {
        v[nt + j] = -b->bk[j].wire_s; /* MAX of the negation: the shortest */
        v[nt + nb + j] = (double)(b->bk[j].count * gcoll_dtype_size(b->bk[j].dtype));
    }
    int movable = states_movable(b);
    v[nt + 2 * nb] = movable;
    st = gcoll_op_allreduce(b->comm, v, (size_t)(nt + 2 * nb) + 1, GCOLL_FLOAT64, GCOLL_MAX);
    if (st != GCOLL_OK)
        goto out;
    for (int j = 0; j < nb; j++)
        v[nt + j] = -v[nt + j];
    b->rebuilt = 1;
    gcoll_plan_link_t link = b->link;
    gcoll_plan_fit_link(v + nt + nb, v + nt, nb, gcoll_bk_default_msg_s(b->comm->size), &link);
    if (v[nt + 2 * nb] < 1) { /* some rank's states cannot move: MAX of 0 on all is 0 */
        GCOLL_INFO(GCOLL_SUBSYS_COLL, "bucketer: layout kept (compressed allreduce states)");
        st = GCOLL_OK;
        goto out;
    }
    for (int i = 0; i < nt; i++) {
        order[i] = i;
        oseg0[i] = b->t[i].seg0;
        onseg[i] = b->t[i].nseg;
        obucket[i] = b->t[i].bucket;
        b->t[i].nseg = 0;
    }
    sort_order(order, nt, v);
    b->link = link;
    gcoll_plan_rule_t r;
    gcoll_bk_layout_rule(b, &r, 1);
    bucket_t *obk = b->bk;
    seg_t *oseg = b->seg;
    gcoll_request_t **otok = b->tok;
    int32_t *oneg = b->neg;
    int onb = b->nb, onseg_all = b->nseg;
    b->bk = NULL;
    b->nb = 0;
    st = gcoll_bk_layout(b, order, &r, v);
    for (int j = 0; j < b->nb && st == GCOLL_OK; j++)
        st = gcoll_bk_setup(b, j);
    if (st == GCOLL_OK) {
        move_states(b, obk, onb, oseg, oseg0, onseg);
        gcoll_bk_mark_checks(b);
        char why[128];
        snprintf(why, sizeof(why),
                 "rebuilt from measured ready times: first %zu, then %zu "
                 "bytes, flush after %.1f ms",
                 r.first, r.target, r.flush_s * 1e3);
        gcoll_bk_log_layout(b, why);
        layout_free(obk, onb, oseg, otok, oneg);
    } else { /* out of memory: the old layout stays */
        layout_free(b->bk, b->nb, b->seg, b->tok, b->neg);
        b->bk = obk;
        b->nb = onb;
        b->seg = oseg;
        b->nseg = onseg_all;
        b->tok = otok;
        b->neg = oneg;
        for (int i = 0; i < nt; i++) {
            b->t[i].seg0 = oseg0[i];
            b->t[i].nseg = onseg[i];
            b->t[i].bucket = obucket[i];
        }
    }
out:
    free(v);
    free(order);
    free(oseg0);
    free(onseg);
    free(obucket);
    return st;
}
