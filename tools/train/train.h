/* train.h: data-parallel minibatch SGD of the MLP over a gcoll communicator, gradients
 * reduced (and compressed) by gcoll's bucketer layer by layer during the backward pass. */
#ifndef GCOLL_TRAIN_TRAIN_H
#define GCOLL_TRAIN_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "gcoll.h"
#include "data.h"
#include "mlp.h"

typedef struct {
    int epochs;
    const char *compressor; /* default codec of the bucketer ("none": dense fp32) */
    const char *policy;     /* GCOLL_LAYER_POLICY syntax, "" or NULL for none */
    uint64_t seed;          /* initialization and shuffles */
    int batch;              /* examples per rank per step */
    float lr;
    int lr_schedule;     /* TRAIN_LR_*, or -1: cosine, constant with --async */
    float momentum;      /* < 0: 0.9, or 0 when a DGC codec is in use (it has its own) */
    size_t limit;        /* train on the first N examples (0: all) */
    size_t test_limit;   /* evaluate on the first N test examples (0: all) */
    size_t bucket_bytes; /* 0: GCOLL_BUCKET_BYTES; 1: one bucket per tensor */
    double warmup_frac;  /* sparsifiers whose spec sets no warmup_steps warm up over this
                          * fraction of the training steps */
    int csv;
    int sizes[TRAIN_MAX_LAYERS + 1]; /* hidden and output widths; sizes[0] is the input */
    int nsizes;
} train_opts_t;

/* Learning-rate schedules over the run's steps: constant; cosine annealing to 0 (Loshchilov
 * and Hutter 2017, SGDR without restarts); step: x0.1 at 50% and again at 75% (the shape of
 * the step decays DGC's and most ImageNet recipes use). */
enum { TRAIN_LR_CONSTANT = 0, TRAIN_LR_COSINE, TRAIN_LR_STEP };
/* Parses "constant", "cosine" or "step"; -1 when unknown. */
int train_lr_schedule_parse(const char *s);
const char *train_lr_schedule_name(int schedule);
/* The learning rate at step t (0-based) of total steps. */
float train_lr_at(const train_opts_t *o, size_t t, size_t total);

/* Defaults: 784-512-256-10, batch 64, lr 0.05 (cosine), momentum auto, 5 epochs, seed 1,
 * dense, warm-up over 10% of the steps. */
void train_opts_default(train_opts_t *o);

typedef struct {
    double first_loss, last_loss;   /* mean train loss of the first and last epoch */
    double final_acc;               /* test accuracy after the last epoch */
    uint64_t wire_bytes, raw_bytes; /* this rank's traffic, summed over epochs */
    float *params;                  /* when keep_params: every parameter (caller frees) */
    size_t nparams;
} train_result_t;

/* gcoll-train's layer rule for a DGC compressor given without a policy: the output layer
 * and every tensor of at most 2/density elements go dense (the DGC authors' implementation
 * sends tensors that small dense), the rest on the spec. Returns buf, or NULL when the
 * compressor is not a plain DGC spec. */
const char *train_dgc_layer_rule(const char *compressor, char *buf, size_t len);
/* Whether spec or policy puts any tensor on a DGC codec. */
int train_uses_dgc(const char *compressor, const char *policy);
/* Whether a codec spec takes the optimizer's momentum itself: dgc, or randomk with
 * momentum=M > 0 (the optimizer then runs plain SGD on its tensors by default). */
int train_codec_momentum(const char *spec);
/* gcoll-train's default for random-k with classic error feedback given without momentum=:
 * the spec with momentum=M added (the optimizer's momentum, handed to the codec; the
 * optimizer then runs without momentum on it), in buf; NULL when the spec is not such a
 * random-k or does not fit. docs/compressors.md, "Random-k with error feedback". */
const char *train_randomk_spec(const char *compressor, float momentum, char *buf, size_t len);
/* Whether momentum goes before compression: a single codec with error feedback (not none,
 * not DGC or random-k with momentum=, not ef=0) and no layer policy. */
int train_momentum_first(const char *compressor, const char *policy);

/* Trains on d (every rank passes the same data) and writes per-epoch lines to out on rank 0
 * (out may be NULL). Returns 0, or -1 after printing the error to stderr. Collective. */
int train_run(const train_opts_t *o, const train_data_t *d, gcoll_comm_t *comm, FILE *out,
              int keep_params, train_result_t *res);

#endif
