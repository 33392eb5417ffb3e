/* bucketer_int.h: the bucketer's state, shared by bucketer.c (registration, runs, steps),
 * bucket_layout.c (cutting and rebuilding buckets), bucket_sched.c (launch order and
 * priorities) and adapt_bucket.c (the adaptation of each bucket's codec between steps).
 * Internal. */
#ifndef GCOLL_BUCKETER_INT_H
#define GCOLL_BUCKETER_INT_H

#include <pthread.h>

#include "adapt/adapt.h"
#include "adapt/adapt_stat.h"
#include "bucket/bucket_plan.h"
#include "core/comm.h"
#include "compress/compress.h"
#include "collectives/compressed/compressed.h"
#include "bucket/policy.h"

typedef struct {
    char *name;
    float *grad;
    size_t count;
    gcoll_dtype_t dtype;
    char *spec;         /* explicit, or NULL: the policy decides */
    const char *chosen; /* the spec it gets (explicit, a rule's, the default or "none") */
    int rule;           /* the policy rule that chose it; -1 the default, -2 explicit/dtype */
    int bucket;         /* its first bucket */
    int seg0, nseg;     /* its pieces: segments [seg0, seg0 + nseg), in consecutive buckets */
    int ready;
    double t_ready; /* since the step's first ready(), this rank's clock */
} tensor_t;

/* Elements [toff, toff + n) of tensor t at foff in its bucket's fused buffer. */
typedef struct {
    int t, bucket;
    size_t toff, n, foff;
} seg_t;

typedef struct {
    int seg0, n; /* segments [seg0, seg0 + n) */
    size_t count;
    gcoll_dtype_t dtype;
    char *spec;
    char label[160];
    gcoll_compressor_t *comp;
    gcoll_tensor_state_t *state;
    size_t *ends; /* per-tensor selection: each tensor's end in the fused buffer */
    float *fused;
    float *acc; /* local accumulation across GCOLL_ACCUMULATE_STEPS (NULL when 1) */
    int nready;
    int launched, ran; /* this step: complete here (queued); reduced (progress thread) */
    gcoll_request_t *req;
    gcoll_bucketer_t *b;
    /* adaptation: measured on the progress thread during the bucket's run */
    int adaptive;    /* the codec has a density to tune */
    int check_after; /* adaptive, with bandwidth adaptation, and another adaptive bucket
                      * after it: the mid-step check runs after this one */
    gcoll_density_ctl_t ctl;
    gcoll_bw_est_t bw;   /* this bucket's own wire rate, for the mid-step check */
    double base_density; /* the spec's */
    double t_launch, run_s, comp_s, bytes, norm2;
    double copy_s;         /* gathering into the fused buffer and scattering back */
    double wire_s;         /* the collective alone (codec and wire), for the layout's link fit */
    gcoll_status_t st;     /* of its run this step */
    int quant;             /* adaptive in bit width (qsgd, q8), not density */
    int orig_q8;           /* the spec's format was q8 */
    int streamed;          /* this run took the streamed top-k scheme */
    double wire_busy;      /* the time this run waited on the wire (the ns_wire counter) */
    double dens_now;       /* the density decided for this step (before mid-step cuts) */
    gcoll_adapt_sig_t sig; /* noise scale, stage, energy */
    double sample[GCOLL_SNR_SAMPLE]; /* this rank's gradient at the sampled coordinates */
    size_t m;
    /* the codec worker (GCOLL_BUCKET_PIPELINE, bucket_sched.c): this step's gather and
     * encode done ahead of the bucket's turn on the wire */
    int pre_ok;   /* may be encoded ahead: nothing decided on the wire changes its encode */
    int enc;      /* this step: ENC_NONE, ENC_BUSY (worker or progress thread), ENC_DONE */
    double enc_s; /* the gather and encode, seconds */
    double enc_t; /* when the encode ended, seconds */
    gcoll_encoded_t staged;
} bucket_t;

enum { ENC_NONE = 0, ENC_BUSY = 1, ENC_DONE = 2 };

struct gcoll_bucketer {
    gcoll_comm_t *comm;
    gcoll_bucketer_config_t cfg;
    char *policy_text;
    char *default_spec;
    gcoll_policy_t policy;
    pthread_mutex_t lock;
    tensor_t *t;
    int nt, capt;
    bucket_t *bk;
    int nb;
    seg_t *seg;
    int nseg;
    int finalized;
    int autosize; /* GCOLL_BUCKET_BYTES unset: sized by the model and the link */
    int priority; /* GCOLL_BUCKET_PRIORITY: queued buckets run first layers first */
    int rebuild;  /* GCOLL_BUCKET_REBUILD: boundaries fixed from measured ready times */
    int rebuilt;
    int comm_steps;         /* communicating steps completed (until the rebuild) */
    gcoll_plan_link_t link; /* what the layout assumed of the link */
    gcoll_request_t **tok;  /* priority: one request per launched bucket this step */
    int32_t *neg;           /* priority: the flags the tokens agree on */
    int ntok;
    pthread_cond_t cond;  /* a bucket launched (tokens wait) or reduced (wait_tensor) */
    double t_first_ready; /* this step's first ready(), seconds; 0: none yet */
    int next_launch;
    long step; /* steps completed */
    int adapt; /* GCOLL_ADAPT: GCOLL_AR_* bits */
    gcoll_phase_t phase;
    double boost;      /* the phase's ramp (gcoll_phase_boost) */
    gcoll_bw_est_t bw; /* of all adaptive buckets together */
    double window;     /* the last agreed backward window, seconds */
    double mid_scale;  /* this step's mid-step cut of the densities (1: none) */
    int mid_fired;     /* mid-step checks that found the link slower this step */
    long adapted;      /* communicating steps adapt() has seen */
    /* GCOLL_BUCKET_PIPELINE: a codec worker encodes launched buckets while the progress
     * thread has another on the wire */
    int pipeline;
    int worker_on, worker_stop;
    int on_wire; /* the progress thread is exchanging a bucket: the worker may encode */
    pthread_t worker;
    pthread_cond_t wcond; /* a bucket to encode, or stop */
    char err[512];
};

/* Is this a step that communicates (the last of an accumulation cycle)? */
static inline int gcoll_bk_communicating(const gcoll_bucketer_t *b)
{
    return (b->step + 1) % b->cfg.accumulate_steps == 0;
}

/* bucketer.c */
void gcoll_bk_free(bucket_t *k);
gcoll_status_t gcoll_bk_setup(gcoll_bucketer_t *b, int j);
void gcoll_bk_mark_checks(gcoll_bucketer_t *b);
/* On the progress thread: gather, reduce (compressed for float32), scatter back. */
gcoll_status_t gcoll_bk_run_one(gcoll_comm_t *comm, bucket_t *k);
/* Bucket k's local part, on any thread that holds k (k->enc ENC_BUSY): the gather, the
 * adaptation's samples of the input and the encode stage; the outcome in k->staged. */
void gcoll_bk_encode(bucket_t *k);

/* bucket_layout.c */
double gcoll_bk_default_msg_s(int size);
void gcoll_bk_layout_rule(const gcoll_bucketer_t *b, gcoll_plan_rule_t *r, int timed);
gcoll_status_t gcoll_bk_layout(gcoll_bucketer_t *b, const int *order, const gcoll_plan_rule_t *r,
                               const double *ready);
void gcoll_bk_log_layout(const gcoll_bucketer_t *b, const char *why);
gcoll_status_t gcoll_bk_rebuild(gcoll_bucketer_t *b);

/* bucket_sched.c: queues the complete buckets among those holding tensor t. */
gcoll_status_t gcoll_bk_launch(gcoll_bucketer_t *b, const tensor_t *t);
/* The codec worker: started at the first ready() where some bucket may be encoded ahead,
 * stopped by gcoll_bucketer_destroy. Waiting (with b->lock held) until no encode runs,
 * before the step's state is reset or the buckets rebuilt. */
gcoll_status_t gcoll_bk_worker_start(gcoll_bucketer_t *b);
void gcoll_bk_worker_stop(gcoll_bucketer_t *b);
gcoll_status_t gcoll_bk_encodes_idle(gcoll_bucketer_t *b);
/* On the progress thread, before bucket k's exchange: its encode done (by the worker, or
 * here if the worker has not started it), within GCOLL_TIMEOUT_MS. */
gcoll_status_t gcoll_bk_encoded(gcoll_comm_t *comm, bucket_t *k);
/* The progress thread starts (on 1) or ends (0) a bucket's exchange. */
void gcoll_bk_on_wire(gcoll_bucketer_t *b, int on);

/* adapt_bucket.c. Swaps a bucket's compressor for a copy at density d; the residuals stay. */
gcoll_status_t gcoll_bucket_set_density(bucket_t *k, double d);
/* Mid-step check after adaptive bucket k (on the progress thread). */
gcoll_status_t gcoll_bucket_midstep(gcoll_comm_t *comm, bucket_t *k);
/* After a communicating step: the agreement and every adaptive bucket's next decision. */
gcoll_status_t gcoll_bucketer_adapt(gcoll_bucketer_t *b, double t_end);

#endif /* GCOLL_BUCKETER_INT_H */
