/* bucketer_int.h: the bucketer's internal state, shared by bucketer.c (layout, launch,
 * the runs) and adapt_bucket.c (the adaptation of each bucket's codec between steps). */
#ifndef GCOLL_BUCKETER_INT_H
#define GCOLL_BUCKETER_INT_H

#include <pthread.h>

#include "adapt.h"
#include "adapt_stat.h"
#include "comm.h"
#include "compress/compress.h"
#include "policy.h"

typedef struct {
    char *name;
    float *grad;
    size_t count;
    gcoll_dtype_t dtype;
    char *spec;         /* explicit, or NULL: the policy decides */
    const char *chosen; /* the spec it gets (explicit, a rule's, the default or "none") */
    int rule;           /* the policy rule that chose it; -1 the default, -2 explicit/dtype */
    int bucket;
    size_t off; /* in the bucket's fused buffer */
    int ready;
} tensor_t;

typedef struct {
    int first, n; /* tensors [first, first+n) */
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
    int quant;             /* adaptive in bit width (qsgd, q8), not density */
    int orig_q8;           /* the spec's format was q8 */
    int streamed;          /* this run took the streamed top-k scheme */
    double wire_busy;      /* the time this run waited on the wire (the ns_wire counter) */
    double dens_now;       /* the density decided for this step (before mid-step cuts) */
    gcoll_adapt_sig_t sig; /* noise scale, stage, energy */
    double sample[GCOLL_SNR_SAMPLE]; /* this rank's gradient at the sampled coordinates */
    size_t m;
} bucket_t;

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
    int finalized;
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
    char err[512];
};

/* adapt_bucket.c. Swaps a bucket's compressor for a copy at density d; the residuals stay. */
gcoll_status_t gcoll_bucket_set_density(bucket_t *k, double d);
/* Mid-step check after adaptive bucket k (on the progress thread). */
gcoll_status_t gcoll_bucket_midstep(gcoll_comm_t *comm, bucket_t *k);
/* After a communicating step: the agreement and every adaptive bucket's next decision. */
gcoll_status_t gcoll_bucketer_adapt(gcoll_bucketer_t *b, double t_end);

#endif /* GCOLL_BUCKETER_INT_H */
