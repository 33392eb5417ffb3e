/* bucket_plan.h: the bucketer's layout rule -- how large its buckets are, where they are
 * cut and where a large tensor is split. Pure functions of their inputs, so every rank that
 * passes the same (agreed) inputs gets the same layout. Internal. */
#ifndef GCOLL_BUCKET_PLAN_H
#define GCOLL_BUCKET_PLAN_H

#include <stddef.h>

#define GCOLL_PLAN_FIRST (1u << 20) /* DDP's first bucket: reduction starts at once */
#define GCOLL_PLAN_MAX (25u << 20)  /* DDP's bucket_cap_mb: the largest automatic bucket */
#define GCOLL_PLAN_PIPE 8           /* buckets a model is cut into to pipeline */
#define GCOLL_PLAN_OVERHEAD 0.1     /* at most this share of a bucket's time fixed cost */
#define GCOLL_PLAN_MIN_BYTES (64u << 10)

/* What the rule knows of the link: the bytes per second a rank sends and the fixed cost of
 * one bucket's collective (latency of its ring steps, the progress thread's turn). Zero
 * for either: unknown (the rule then sizes by the model alone). */
typedef struct {
    double bw;
    double msg_s;
} gcoll_plan_link_t;

typedef struct {
    size_t first;   /* the first bucket's bytes */
    size_t target;  /* every other bucket's bytes (a tensor larger is split when split) */
    size_t min;     /* no bucket below this is cut by time (per-message cost) */
    double flush_s; /* time rule: a bucket is closed when the next tensor is ready this much
                     * later than its first (0: by size only) */
    int split;      /* split tensors larger than target into pieces */
} gcoll_plan_rule_t;

/* The automatic rule for a model of total_bytes on link: a first bucket of at most 1 MiB,
 * then GCOLL_PLAN_PIPE buckets, none so small that the fixed cost passes
 * GCOLL_PLAN_OVERHEAD of its transfer, none above GCOLL_PLAN_MAX. flush_s is the time a
 * bucket of target bytes occupies the link (0 when the rate is unknown). */
void gcoll_plan_rule_auto(size_t total_bytes, const gcoll_plan_link_t *link, gcoll_plan_rule_t *r);

/* One tensor as the plan sees it. */
typedef struct {
    size_t count;
    size_t esz;   /* bytes per element */
    int group;    /* tensors of different groups (codec, dtype) never share a bucket */
    double ready; /* when it became ready (seconds, any origin); used with flush_s */
} gcoll_plan_tensor_t;

/* A piece of a tensor in a bucket: elements [toff, toff + n) of tensor t. */
typedef struct {
    int t;
    int bucket;
    size_t toff, n;
} gcoll_plan_seg_t;

/* Cuts the tensors, taken in the given order (a permutation of 0..nt-1; NULL: 0..nt-1),
 * into buckets by rule r. Each tensor's pieces are consecutive segments in consecutive
 * buckets; buckets are numbered from 0 in launch order. Returns the number of segments
 * written to *seg_p (malloc'd, the caller frees) or -1 when out of memory. */
int gcoll_plan_cut(const gcoll_plan_tensor_t *t, const int *order, int nt,
                   const gcoll_plan_rule_t *r, gcoll_plan_seg_t **seg_p);

/* Least-squares fit of time = msg_s + bytes / bw over n (bytes, time) samples; falls back
 * to the aggregate rate with fixed cost fallback_msg_s when the fit is not physical
 * (negative cost or rate, or too few distinct sizes). 0 if no sample has bytes. */
int gcoll_plan_fit_link(const double *bytes, const double *secs, int n, double fallback_msg_s,
                        gcoll_plan_link_t *link);

#endif
