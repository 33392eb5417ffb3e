/* bucket_plan.c: the bucketer's layout rule (bucket_plan.h). DDP's rule (a 1 MiB first
 * bucket, then bucket_cap_mb) sized to the model and the link, with ByteScheduler's
 * partitioning of large tensors (Peng et al., SOSP'19) and a time rule fixed from measured
 * ready times, as DDP rebuilds its buckets after the first iteration (Li et al., VLDB'20). */
#include "bucket/bucket_plan.h"

#include <math.h>
#include <stdlib.h>

static size_t clamp_sz(size_t x, size_t lo, size_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

void gcoll_plan_rule_auto(size_t total_bytes, const gcoll_plan_link_t *link, gcoll_plan_rule_t *r)
{
    /* the fixed cost of a bucket stays under GCOLL_PLAN_OVERHEAD of its transfer */
    size_t min = GCOLL_PLAN_MIN_BYTES;
    if (link && link->bw > 0 && link->msg_s > 0) {
        double x = link->msg_s * link->bw / GCOLL_PLAN_OVERHEAD;
        min =
            x >= (double)GCOLL_PLAN_MAX ? GCOLL_PLAN_MAX : clamp_sz((size_t)x, min, GCOLL_PLAN_MAX);
    }
    /* enough buckets that the last, exposed after backward, is a small share */
    size_t target = clamp_sz(total_bytes / GCOLL_PLAN_PIPE, min, GCOLL_PLAN_MAX);
    r->target = target;
    r->min = min;
    r->first = target < GCOLL_PLAN_FIRST ? target : GCOLL_PLAN_FIRST;
    r->split = 1;
    r->flush_s = link && link->bw > 0 ? (double)target / link->bw : 0;
}

typedef struct {
    gcoll_plan_seg_t *seg;
    int nseg, cap;
    int nb;   /* buckets closed */
    int open; /* a bucket is open (number nb) */
    int group;
    size_t bytes;   /* in the open bucket */
    double t_first; /* ready time of its first tensor */
} cut_t;

static int push(cut_t *c, int t, size_t toff, size_t n)
{
    if (c->nseg == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        gcoll_plan_seg_t *s = realloc(c->seg, (size_t)cap * sizeof(*s));
        if (!s)
            return -1;
        c->seg = s;
        c->cap = cap;
    }
    c->seg[c->nseg++] = (gcoll_plan_seg_t){.t = t, .bucket = c->nb, .toff = toff, .n = n};
    return 0;
}

static void close_bucket(cut_t *c)
{
    if (c->open)
        c->nb++;
    c->open = 0;
    c->bytes = 0;
}

/* Places tensor i (all of it, or in pieces) into the open bucket and new ones. */
static int place(cut_t *c, const gcoll_plan_tensor_t *t, int i, const gcoll_plan_rule_t *r)
{
    size_t esz = t->esz ? t->esz : 1, left = t->count, toff = 0;
    if (c->open && (c->group != t->group ||
                    (r->flush_s > 0 && c->bytes >= r->min && t->ready - c->t_first > r->flush_s)))
        close_bucket(c);
    for (;;) {
        size_t lim = c->nb == 0 ? r->first : r->target;
        if (lim < esz)
            lim = esz;
        if (c->open && c->bytes > 0 && c->bytes + left * esz > lim) {
            close_bucket(c);
            continue;
        }
        size_t n = left;
        if (r->split && left * esz > lim)
            n = lim / esz; /* a piece of its own bucket (holding no bytes yet) */
        if (!c->open) {
            c->open = 1;
            c->group = t->group;
            c->t_first = t->ready;
        }
        if (push(c, i, toff, n) != 0)
            return -1;
        c->bytes += n * esz;
        toff += n;
        left -= n;
        if (left == 0)
            return 0;
        close_bucket(c);
    }
}

int gcoll_plan_cut(const gcoll_plan_tensor_t *t, const int *order, int nt,
                   const gcoll_plan_rule_t *r, gcoll_plan_seg_t **seg_p)
{
    cut_t c = {0};
    for (int k = 0; k < nt; k++) {
        int i = order ? order[k] : k;
        if (place(&c, &t[i], i, r) != 0) {
            free(c.seg);
            return -1;
        }
    }
    *seg_p = c.seg;
    return c.nseg;
}

int gcoll_plan_fit_link(const double *bytes, const double *secs, int n, double fallback_msg_s,
                        gcoll_plan_link_t *link)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!(bytes[i] > 0) || !(secs[i] > 0))
            continue;
        sx += bytes[i];
        sy += secs[i];
        sxx += bytes[i] * bytes[i];
        sxy += bytes[i] * secs[i];
        m++;
    }
    if (m == 0)
        return 0;
    double det = m * sxx - sx * sx;
    if (m >= 3 && det > 1e-9 * sxx * m) {
        double slope = (m * sxy - sx * sy) / det, a = (sy - slope * sx) / m;
        if (slope > 0 && a >= 0) {
            link->bw = 1 / slope;
            link->msg_s = a;
            return 1;
        }
    }
    /* one size only, or noise: the aggregate rate after the fallback's fixed cost */
    double wire = sy - m * fallback_msg_s;
    link->msg_s = fallback_msg_s;
    link->bw = sx / (wire > 0.1 * sy ? wire : sy);
    return 1;
}
