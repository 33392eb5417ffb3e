/* modes.h: gcoll-train's training modes beyond the bucketer's synchronous data parallelism:
 * local SGD with compressed deltas, and stragglers to test them with; the summary lines
 * every mode prints. */
#ifndef GCOLL_TRAIN_MODES_H
#define GCOLL_TRAIN_MODES_H

#include <getopt.h>
#include <stdio.h>

#include "gcoll.h"
#include "train.h"

typedef struct {
    int local_steps;             /* H of local SGD; 0: the bucketer's synchronous mode */
    int local_warmup;            /* synchronous steps before H applies (PostLocalSGD) */
    int local_momentum;          /* gcoll_lsgd_momentum_t */
    double straggle;             /* rotating straggler: one rank per step works F times (0: none) */
    int slow_rank;               /* persistent straggler (-1: none) */
    double slow_factor;          /* its factor */
    int async;                   /* the bounded-staleness parameter server */
    int staleness;               /* its S */
    const char *pull_compressor; /* its pull answers' codec (NULL: dense) */
    double dc_lambda;            /* its DC-ASGD compensation (0: off) */
    int weighting;               /* its gcoll_ps_weight_t */
    int weighting_set;
    int prefetch; /* its pulls prefetched (1, the default) */
    int prefetch_set;
} train_mode_opts_t;

void train_mode_opts_default(train_mode_opts_t *mo);

/* Long options of the modes, for gcoll-train's getopt table, their ids from
 * TRAIN_MODE_OPT_BASE up to TRAIN_MODE_OPT_END (excluded). */
enum {
    TRAIN_MODE_OPT_BASE = 512,
    TRAIN_OPT_LOCAL_STEPS = TRAIN_MODE_OPT_BASE,
    TRAIN_OPT_LOCAL_WARMUP,
    TRAIN_OPT_LOCAL_MOMENTUM,
    TRAIN_OPT_STRAGGLE,
    TRAIN_OPT_SLOW_RANK,
    TRAIN_OPT_SLOW_FACTOR,
    TRAIN_OPT_ASYNC,
    TRAIN_OPT_STALENESS,
    TRAIN_OPT_PULL_COMPRESSOR,
    TRAIN_OPT_DC_LAMBDA,
    TRAIN_OPT_STALENESS_WEIGHT,
    TRAIN_OPT_PREFETCH,
    TRAIN_MODE_OPT_END
};
#define TRAIN_MODE_LONGOPTS                                                                        \
    {"local-steps", required_argument, NULL, TRAIN_OPT_LOCAL_STEPS},                               \
        {"local-warmup", required_argument, NULL, TRAIN_OPT_LOCAL_WARMUP},                         \
        {"local-momentum", required_argument, NULL, TRAIN_OPT_LOCAL_MOMENTUM},                     \
        {"straggle", required_argument, NULL, TRAIN_OPT_STRAGGLE},                                 \
        {"slow-rank", required_argument, NULL, TRAIN_OPT_SLOW_RANK},                               \
        {"slow-factor", required_argument, NULL, TRAIN_OPT_SLOW_FACTOR},                           \
        {"async", no_argument, NULL, TRAIN_OPT_ASYNC},                                             \
        {"staleness", required_argument, NULL, TRAIN_OPT_STALENESS},                               \
        {"pull-compressor", required_argument, NULL, TRAIN_OPT_PULL_COMPRESSOR},                   \
        {"dc-lambda", required_argument, NULL, TRAIN_OPT_DC_LAMBDA},                               \
        {"prefetch", required_argument, NULL, TRAIN_OPT_PREFETCH},                                 \
    {                                                                                              \
        "staleness-weight", required_argument, NULL, TRAIN_OPT_STALENESS_WEIGHT                    \
    }
extern const char train_mode_usage[];

/* Handles option id c (one of train_mode_longopts) with its argument. Returns 0, or -1
 * after printing the error. */
int train_mode_option(train_mode_opts_t *mo, int c, const char *arg);
/* Checks the combination with o (prints the error); 0 when usable. */
int train_mode_check(const train_mode_opts_t *mo, const train_opts_t *o);

/* The async mode (tools/train/async.c), called by train_run_mode. */
int train_run_async(const train_opts_t *o, const train_mode_opts_t *mo, const train_data_t *d,
                    gcoll_comm_t *comm, FILE *out, int keep_params, train_result_t *res);

/* Whether a mode other than the bucketer's synchronous one is selected (or a straggler,
 * which only the modes' loop simulates). */
int train_mode_active(const train_mode_opts_t *mo);

/* Runs the selected mode, as train_run does (same output format). Collective. */
int train_run_mode(const train_opts_t *o, const train_mode_opts_t *mo, const train_data_t *d,
                   gcoll_comm_t *comm, FILE *out, int keep_params, train_result_t *res);

/* Optimizer steps this rank takes in the run train_run or train_run_mode makes. */
size_t train_total_steps(const train_opts_t *o, const train_data_t *d, int size);

/* The summary lines scripts parse, on rank 0 (out may be NULL elsewhere):
 * "total wire MB: X" (bytes_sent of this rank since c0) and "steps per second: X". */
void train_print_summary(FILE *out, gcoll_comm_t *comm, const gcoll_counters_t *c0, double seconds,
                         size_t steps);

/* Extra passes of forward and backward (real compute) rank takes at step s under mo. */
int train_straggle_passes(const train_mode_opts_t *mo, uint64_t seed, uint64_t step, int rank,
                          int size);

double train_now_s(void);

/* Shared by the modes' loops: prints a failed call with the communicator's detail (returns
 * -1); this rank's share of the test set's loss and correct predictions, summed. */
int train_mode_fail(gcoll_comm_t *comm, const char *what, gcoll_status_t st);
void train_mode_evaluate(train_mlp_t *m, const train_split_t *t, size_t n, int rank, int size,
                         float *x, uint8_t *y, uint32_t *idx, double *loss_sum, long *correct);
/* The end of an epoch: records its figures (v: summed train loss, correct test predictions,
 * test loss, wire and raw bytes; examples: those the train loss sums over) in res and, on
 * rank 0 (out not NULL), prints its line, as CSV with csv set. */
void train_epoch_done(FILE *out, int csv, train_result_t *res, int epoch, const double v[5],
                      size_t examples, size_t ntest, double secs, double wait_s);
/* With GCOLL_ADAPT: one line after the epoch's ("adapt: epoch E ..."; "# " before it in
 * CSV) with the bucketer's noise scale, noise share, stage, phase boost and each bucket's
 * density (or width); nothing without adaptation or when out is NULL. */
void train_adapt_report(FILE *out, int csv, const gcoll_bucketer_t *b, int epoch);
/* keep_params: copies every parameter into res->params (0, or -1 out of memory). */
/* The model and the batch buffers every mode trains with (x, y and idx hold 500 examples
 * or a batch, whichever is more: evaluation runs 500 at a time). */
typedef struct {
    train_mlp_t m;
    float *x;
    uint8_t *y;
    uint32_t *perm; /* ntrain */
    uint32_t *idx;
} train_work_t;
/* Creates them for o's layer sizes on d's input; -1 after printing why (nothing held). */
int train_work_init(train_work_t *w, const train_opts_t *o, const train_data_t *d, size_t ntrain,
                    int rank);
void train_work_free(train_work_t *w);
/* The end of an epoch of the synchronous modes: evaluates this rank's share of the test set
 * on w, sums the epoch's figures over the ranks (loss_sum, and the bytes since c0) and
 * records and prints them as train_epoch_done does, timed from t0. 0, or -1 after
 * printing the failed call. */
int train_epoch_end(gcoll_comm_t *comm, FILE *out, int csv, train_result_t *res, int epoch,
                    train_work_t *w, const train_split_t *test, size_t ntest, double loss_sum,
                    const gcoll_counters_t *c0, size_t examples, double t0, double wait_s);
/* The run's first line: "gcoll-train: P ranks (transport), MLP 784-512-256-10 (N
 * parameters), sgemm NAME", after prefix ("# " in CSV). */
void train_print_model(FILE *out, const char *prefix, gcoll_comm_t *comm, const train_work_t *w);
int train_keep_params(const train_mlp_t *m, int rank, train_result_t *res);

#endif
