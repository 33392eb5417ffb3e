/* test_bucket_plan.c: property tests of the bucketer's layout rule (bucket_plan.c) on
 * random models, links and ready orders (fixed seeds): every element in exactly one bucket,
 * in order; bucket sizes within the rule's bounds; cuts greedy; enough buckets to pipeline,
 * not so many that fixed costs dominate; the same inputs give the same layout; and the link
 * fit recovering a synthetic link. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bucket/bucket_plan.h"

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static double unif(uint64_t *s)
{
    return (double)rng(s) / (double)(1ull << 53);
}

/* A random model: nt tensors of log-uniform sizes (1 .. 4M elements, a few empty), a few
 * codec groups in runs (4-, 8- and 2-byte elements), ready times increasing with noise. */
static int make_model(uint64_t *s, gcoll_plan_tensor_t *t, int max)
{
    int nt = 1 + (int)(rng(s) % (uint64_t)max);
    int group = 0;
    double ready = 0;
    for (int i = 0; i < nt; i++) {
        if (rng(s) % 10 == 0)
            group = (int)(rng(s) % 3);
        static const size_t esz[3] = {4, 8, 2}; /* a group is a codec and a dtype */
        t[i].esz = esz[group];
        t[i].count = (size_t)exp(unif(s) * log(4e6));
        if (rng(s) % 20 == 0)
            t[i].count = 0; /* a tensor with no elements still belongs to a bucket */
        t[i].group = group;
        ready += unif(s) * 0.01;
        t[i].ready = ready;
    }
    return nt;
}

static size_t lim_of(const gcoll_plan_rule_t *r, int bucket, size_t esz)
{
    size_t lim = bucket == 0 ? r->first : r->target;
    return lim < esz ? esz : lim;
}

/* The layout's invariants for tensors t (taken in order) cut by rule r. */
static void check_layout(const gcoll_plan_tensor_t *t, const int *order, int nt,
                         const gcoll_plan_rule_t *r, const gcoll_plan_seg_t *seg, int ns)
{
    assert_true(ns >= nt);
    size_t *bytes = calloc((size_t)ns + 1, sizeof(size_t));
    int *group = calloc((size_t)ns + 1, sizeof(int));
    double *t_first = calloc((size_t)ns + 1, sizeof(double));
    assert_non_null(bytes);
    /* segments follow the order, each tensor's pieces contiguous from 0 to its count, in
     * consecutive buckets numbered from 0 without gaps */
    int s = 0, prev_bucket = -1;
    for (int k = 0; k < nt; k++) {
        int i = order ? order[k] : k;
        size_t off = 0;
        do {
            assert_true(s < ns);
            assert_int_equal(seg[s].t, i);
            assert_true(seg[s].toff == off);
            assert_true(seg[s].bucket == prev_bucket || seg[s].bucket == prev_bucket + 1);
            if (seg[s].bucket != prev_bucket) {
                group[seg[s].bucket] = t[i].group;
                t_first[seg[s].bucket] = t[i].ready;
            }
            /* one codec group per bucket */
            assert_int_equal(group[seg[s].bucket], t[i].group);
            /* the time rule: a tensor joins only within flush_s of the bucket's first */
            if (r->flush_s > 0 && seg[s].toff == 0 && bytes[seg[s].bucket] >= r->min)
                assert_true(t[i].ready - t_first[seg[s].bucket] <= r->flush_s);
            bytes[seg[s].bucket] += seg[s].n * t[i].esz;
            prev_bucket = seg[s].bucket;
            off += seg[s].n;
            s++;
        } while (off < t[i].count);
        assert_true(off == t[i].count);
    }
    assert_int_equal(s, ns);
    int nb = prev_bucket + 1;
    /* sizes: within the limit (split), or one whole tensor above it (not split); greedy:
     * the next bucket's first piece would not have fit, unless a group or the time rule cut */
    for (int s2 = 0, j = -1; s2 < ns; s2++) {
        if (seg[s2].bucket == j)
            continue;
        j = seg[s2].bucket;
        size_t esz = t[seg[s2].t].esz, lim = lim_of(r, j, esz);
        int full = 0; /* segments with elements */
        for (int s3 = s2; s3 < ns && seg[s3].bucket == j; s3++)
            full += seg[s3].n > 0;
        /* whole tensors (GCOLL_BUCKET_BYTES): one larger than the limit is a bucket alone */
        if (r->split || full > 1)
            assert_true(bytes[j] <= lim);
        if (j + 1 < nb) {
            int n2 = s2;
            while (seg[n2].bucket == j)
                n2++;
            const gcoll_plan_tensor_t *nx = &t[seg[n2].t];
            int time_cut =
                r->flush_s > 0 && bytes[j] >= r->min && nx->ready - t_first[j] > r->flush_s;
            if (group[j + 1] == group[j] && !time_cut && bytes[j] > 0)
                assert_true(bytes[j] + seg[n2].n * nx->esz > lim);
        }
    }
    free(bytes);
    free(group);
    free(t_first);
}

static void test_rule_bounds(void **state)
{
    (void)state;
    uint64_t s = 42;
    for (int it = 0; it < 20000; it++) {
        size_t total = (size_t)exp(unif(&s) * log(4e9));
        gcoll_plan_link_t link = {.bw = rng(&s) % 4 ? exp(log(1e7) + unif(&s) * log(1e3)) : 0,
                                  .msg_s = rng(&s) % 4 ? unif(&s) * 5e-3 : 0};
        gcoll_plan_rule_t r;
        gcoll_plan_rule_auto(total, &link, &r);
        /* DDP's first bucket: at most 1 MiB, never above the others */
        assert_true(r.first <= GCOLL_PLAN_FIRST);
        assert_true(r.first <= r.target);
        assert_true(r.first == r.target || r.first == GCOLL_PLAN_FIRST);
        assert_true(r.target <= GCOLL_PLAN_MAX);
        assert_true(r.min >= GCOLL_PLAN_MIN_BYTES || r.min == GCOLL_PLAN_MAX);
        assert_true(r.min <= r.target);
        /* the fixed cost stays under GCOLL_PLAN_OVERHEAD of a bucket's transfer, unless the
         * largest bucket cannot reach that */
        if (link.bw > 0 && link.msg_s > 0 && r.target < GCOLL_PLAN_MAX)
            assert_true(link.msg_s <= GCOLL_PLAN_OVERHEAD * (double)r.target / link.bw * 1.0001);
        /* enough buckets to pipeline where the fixed cost allows */
        if (total / GCOLL_PLAN_PIPE >= r.min && total / GCOLL_PLAN_PIPE <= GCOLL_PLAN_MAX)
            assert_true(r.target == total / GCOLL_PLAN_PIPE);
        assert_true(r.split);
        /* flush: the time a target bucket takes on the link */
        if (link.bw > 0)
            assert_true(fabs(r.flush_s - (double)r.target / link.bw) < 1e-9 * r.flush_s + 1e-15);
        else
            assert_true(r.flush_s == 0);
    }
}

static void test_cut_properties(void **state)
{
    (void)state;
    enum { MAXT = 200 };
    gcoll_plan_tensor_t t[MAXT];
    int order[MAXT];
    uint64_t s = 7;
    for (int it = 0; it < 3000; it++) {
        int nt = make_model(&s, t, MAXT);
        size_t total = 0;
        for (int i = 0; i < nt; i++)
            total += t[i].count * t[i].esz;
        gcoll_plan_link_t link = {.bw = exp(log(1e7) + unif(&s) * log(1e3)),
                                  .msg_s = unif(&s) * 1e-3};
        gcoll_plan_rule_t r;
        int kind = it % 3;
        if (kind == 2) { /* GCOLL_BUCKET_BYTES: whole tensors, one size */
            size_t x = (size_t)exp(unif(&s) * log(64e6)) + 1;
            r = (gcoll_plan_rule_t){.first = x, .target = x};
        } else {
            gcoll_plan_rule_auto(total, &link, &r);
            if (kind == 0)
                r.flush_s = 0;
        }
        /* an order: registration, or the ready order shuffled a little */
        for (int i = 0; i < nt; i++)
            order[i] = i;
        for (int i = 0; it % 2 && i < nt; i++) {
            int j = (int)(rng(&s) % (uint64_t)nt), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        gcoll_plan_seg_t *seg, *again;
        int ns = gcoll_plan_cut(t, order, nt, &r, &seg);
        check_layout(t, order, nt, &r, seg, ns);
        /* a pure function: the same layout again (what every rank relies on) */
        assert_int_equal(gcoll_plan_cut(t, order, nt, &r, &again), ns);
        assert_memory_equal(seg, again, (size_t)ns * sizeof(*seg));
        /* the count of buckets: by size alone, every two consecutive buckets of a group run
         * together exceed the limit, so fixed costs stay bounded by the rule's min size */
        int nb = seg[ns - 1].bucket + 1, runs = 1;
        for (int k = 1; k < nt; k++)
            runs += t[order[k]].group != t[order[k - 1]].group;
        if (r.flush_s == 0 && kind != 2)
            assert_true((size_t)nb <= 2 * (total / r.target) + 3 * (size_t)runs + 2);
        /* and enough to pipeline: a model of one group larger than PIPE targets is cut into
         * at least PIPE buckets (tensors split) */
        if (kind == 0 && runs == 1 && total >= (size_t)GCOLL_PLAN_PIPE * r.target)
            assert_true(nb >= GCOLL_PLAN_PIPE);
        free(seg);
        free(again);
    }
}

static void test_fit_link(void **state)
{
    (void)state;
    uint64_t s = 3;
    for (int it = 0; it < 200; it++) {
        double bw = exp(log(1e7) + unif(&s) * log(1e3)), a = unif(&s) * 2e-3;
        double x[24], y[24], ymax = 0;
        for (int i = 0; i < 24; i++) {
            x[i] = exp(log(1e4) + unif(&s) * log(1e4));
            y[i] = (a + x[i] / bw) * (1 + 0.001 * (2 * unif(&s) - 1));
            ymax = fmax(ymax, y[i]);
        }
        gcoll_plan_link_t l;
        assert_int_equal(gcoll_plan_fit_link(x, y, 24, 1e-4, &l), 1);
        assert_true(fabs(l.bw - bw) < 0.02 * bw);
        /* the intercept to within the noise of the samples (0.1% of the largest) */
        assert_true(fabs(l.msg_s - a) < 0.02 * a + 0.002 * ymax);
    }
    /* one size only: the aggregate rate after the fallback's fixed cost */
    double x[3] = {1e6, 1e6, 1e6}, y[3] = {0.0101, 0.0101, 0.0101};
    gcoll_plan_link_t l;
    assert_int_equal(gcoll_plan_fit_link(x, y, 3, 1e-4, &l), 1);
    assert_true(fabs(l.bw - 1e8) < 1e3);
    assert_true(l.msg_s == 1e-4);
    /* nothing measured */
    double z[2] = {0, 0};
    assert_int_equal(gcoll_plan_fit_link(z, z, 2, 1e-4, &l), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_bounds),
        cmocka_unit_test(test_cut_properties),
        cmocka_unit_test(test_fit_link),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
