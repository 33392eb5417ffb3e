/* check.h: what coll_check's parts share: the rank state, FAIL, inputs and expected values. */
#ifndef GCOLL_CHECK_H
#define GCOLL_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcoll.h"

/* Defined in coll_check.c. */
extern int rank, size, failures, checks;
extern gcoll_comm_t *comm;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "rank %d: FAIL: ", rank);                                                  \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        failures++;                                                                                \
    } while (0)

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Input of rank r at index i (coll_check.c), and the reduction of every rank's inputs. */
int input(int r, size_t i, gcoll_op_t op);
double expected(size_t i, gcoll_dtype_t dt, gcoll_op_t op);

/* Modes, each returning its number of failures. */
int run_sparse(void);        /* check_sparse.c */
int run_compressed(void);    /* check_sparse.c */
int run_bucketer(void);      /* check_bucketer.c */
int run_overlap(void);       /* check_overlap.c */
int run_bucket_layers(void); /* check_bucketer.c: GCOLL_LAYER_SELECT */
int run_warmup(void);        /* check_bucketer.c: GCOLL_SPARSE_ALGO=allgather */
int run_adapt(void);         /* check_bucketer.c */
int run_adapt_ctl(void);     /* check_adapt.c: gcoll_adapt on compressed allreduce */
int run_adapt_stream(void);  /* check_adapt.c: streamed top-k under adaptation */
int run_bucket_missing(int victim);
int run_bucket_nan(int victim, int accumulate); /* check_bucketer.c */
int run_efmean(int argc, char **argv);          /* check_ef.c */
int run_onestep(int argc, char **argv);         /* check_ef.c */
int run_clip(void);                             /* check_ef.c */
int run_rss(int argc, char **argv);             /* check_ef.c */
int run_dtypes(void); /* check_dtypes.c: integer, bool and fp8 dtypes, bitwise ops */

#endif /* GCOLL_CHECK_H */
