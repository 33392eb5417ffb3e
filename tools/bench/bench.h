/* bench.h: the benchmark engine behind gcoll-bench (library code, so tests share it):
 * nccl-tests conventions for sizes, timing, placements, algbw and busbw. */
#ifndef GCOLL_BENCH_H
#define GCOLL_BENCH_H

#include <stddef.h>

#include "gcoll.h"

typedef enum {
    BENCH_ALLREDUCE,
    BENCH_ALLGATHER,
    BENCH_REDUCE_SCATTER,
    BENCH_ALLTOALL,
    BENCH_BROADCAST,
    BENCH_BARRIER,
    BENCH_COMPRESSED, /* gcoll_compressed_allreduce of float32 with a compressor */
    BENCH_SENDRECV,   /* nccl-tests' pattern: every rank sends to rank+1, receives from rank-1 */
    BENCH_REDUCE,
    BENCH_GATHER,
    BENCH_SCATTER,
    BENCH_NCOLL
} bench_coll_t;

/* -a: how each rank's time makes the reported one (nccl-tests' meanings) */
enum { BENCH_AVG_RANK0, BENCH_AVG_MEAN, BENCH_AVG_MIN, BENCH_AVG_MAX };
/* -z: 0 posts the iterations as nonblocking calls and waits for all at the end; 1 makes a
 * blocking call then a barrier per iteration; 2 a blocking call per iteration, no barrier */
enum { BENCH_Z_NONBLOCKING, BENCH_Z_BARRIER, BENCH_Z_BLOCKING, BENCH_NZ };

typedef struct {
    bench_coll_t coll;
    gcoll_dtype_t dtype;
    gcoll_op_t op;
    int root;
    size_t min_bytes, max_bytes;
    double factor; /* multiplicative step (-f); <= 1: use step */
    size_t step;   /* additive step (-i) */
    int iters, warmup;
    int check;        /* checked runs per size and placement (-c); 0: none */
    int average;      /* BENCH_AVG_* (-a) */
    int blocking;     /* BENCH_Z_* (-z) */
    const char *spec; /* BENCH_COMPRESSED: the compressor */
} bench_opts_t;

/* One placement (out-of-place or in-place) of one size. */
typedef struct {
    int ran;        /* 0: the collective has no such placement */
    double time_us; /* time per operation, combined over ranks as -a says */
    double algbw;   /* GB/s: size / time */
    double busbw;   /* GB/s: algbw * the collective's factor */
    long wrong;     /* elements wrong over all ranks, -1 when not checked */
} bench_result_t;

typedef struct {
    size_t bytes;       /* nccl-tests "size": per-rank payload, total for gathers */
    size_t count;       /* elements, nccl-tests "count" */
    bench_result_t oop; /* out of place */
    bench_result_t ip;  /* in place */
    /* BENCH_COMPRESSED only (its result is in oop) */
    double wire_bytes;  /* bytes this rank sent per operation (mean over ranks) */
    double ratio;       /* uncompressed payload / wire bytes */
    double comp_us;     /* compress + decompress time per operation (slowest rank) */
    double rel_err;     /* ||compressed - dense|| / ||dense|| of one fresh step */
    const char *scheme; /* gcoll_compressed_scheme: "sparse", "ring", "alltoall", ... */
} bench_row_t;

/* Names: collectives as --coll spells them; dtypes and ops as gcoll_dtype_name and
 * gcoll_op_name do (a few nccl-tests aliases too: float, half, double, int). 0 or -1. */
int bench_parse_coll(const char *s, bench_coll_t *c);
const char *bench_coll_name(bench_coll_t c);
int bench_parse_dtype(const char *s, gcoll_dtype_t *d);
int bench_parse_op(const char *s, gcoll_op_t *o);
#define BENCH_NDTYPES (GCOLL_FLOAT8_E5M2 + 1)
#define BENCH_NOPS (GCOLL_BXOR + 1)

/* Whether the collective reduces (takes -o), has a root (-r), has an in-place or an
 * out-of-place form. */
int bench_coll_reduces(bench_coll_t c);
int bench_coll_rooted(bench_coll_t c);
int bench_coll_has_ip(bench_coll_t c);
int bench_coll_has_oop(bench_coll_t c);

/* NULL if op applies to dtype, else why not (as gcoll refuses it). */
const char *bench_op_refused(gcoll_dtype_t d, gcoll_op_t op);

/* busbw / algbw for a collective on n ranks (nccl-tests' doc/PERFORMANCE.md). */
double bench_bus_factor(bench_coll_t c, int n);

/* Combines each rank's time t as -a says (BENCH_AVG_*): every rank gets the result. */
gcoll_status_t bench_combine_time(gcoll_comm_t *comm, int average, double *t);

/* Runs the sweep; calls emit(row, ctx) on every rank for each size. Collective. */
gcoll_status_t bench_run(gcoll_comm_t *comm, const bench_opts_t *o,
                         void (*emit)(const bench_row_t *row, void *ctx), void *ctx);

/* ---- check.c: inputs and the reference results of -c ---- */

/* Fills elements [0, n) of buf with rank r's input elements [first, first + n). */
void bench_fill(const bench_opts_t *o, void *buf, size_t n, int r, size_t first);
/* Elements of out [0, n) that differ from the reduction over ranks 0..nranks-1 of their
 * input elements [first, first + n) (from == -1), or from rank from's elements
 * [first, first + n) (from >= 0: a collective that moves data). */
long bench_wrong(const bench_opts_t *o, const void *out, size_t n, int nranks, int from,
                 size_t first);

/* ---- compressed.c ---- */
gcoll_status_t bench_compressed_row(gcoll_comm_t *comm, const bench_opts_t *o,
                                    gcoll_compressor_t *c, size_t count, float *in, float *out,
                                    float *ref, bench_row_t *row);

#endif /* GCOLL_BENCH_H */
