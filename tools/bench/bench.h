/* bench.h: the benchmark engine behind gcoll-bench (library code, so tests share it):
 * nccl-tests conventions for sizes, timing, algbw and busbw. */
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
} bench_coll_t;

typedef struct {
    bench_coll_t coll;
    gcoll_dtype_t dtype;
    gcoll_op_t op;
    int root;
    size_t min_bytes, max_bytes;
    double factor; /* multiplicative step (-f); 0: use step */
    size_t step;   /* additive step (-i) */
    int iters, warmup;
    int check;        /* verify results (-c) */
    const char *spec; /* -z: compressed allreduce with this compressor (NULL: dense) */
} bench_opts_t;

typedef struct {
    size_t bytes;   /* nccl-tests "size": per-rank payload, total for gathers */
    size_t count;   /* elements, nccl-tests "count" */
    double time_us; /* mean time per operation, slowest rank */
    double algbw;   /* GB/s: bytes / time */
    double busbw;   /* GB/s: algbw * collective factor */
    long wrong;     /* elements wrong across ranks, -1 when not checked */
    /* compressed runs only */
    double wire_bytes;  /* bytes this rank sent per operation (mean over ranks) */
    double ratio;       /* uncompressed payload / wire bytes */
    double comp_us;     /* compress + decompress time per operation (slowest rank) */
    double rel_err;     /* ||compressed - dense|| / ||dense|| of one fresh step */
    const char *scheme; /* gcoll_compressed_scheme: "sparse", "ring", "alltoall", ... */
} bench_row_t;

int bench_parse_coll(const char *s, bench_coll_t *c);
const char *bench_coll_name(bench_coll_t c);
int bench_parse_dtype(const char *s, gcoll_dtype_t *d);
int bench_parse_op(const char *s, gcoll_op_t *o);

/* busbw / algbw for a collective on n ranks (nccl-tests' PERFORMANCE.md). */
double bench_bus_factor(bench_coll_t c, int n);

/* Runs the sweep; calls emit(row, ctx) on every rank for each size. Collective. */
gcoll_status_t bench_run(gcoll_comm_t *comm, const bench_opts_t *o,
                         void (*emit)(const bench_row_t *row, void *ctx), void *ctx);

#endif /* GCOLL_BENCH_H */
