/* model.h: gcoll-model's alpha-beta-gamma cost model of the allreduce algorithms, its
 * parameters and its least-squares fit (tools/model/model.c). */
#ifndef GCOLL_MODEL_H
#define GCOLL_MODEL_H

#include <stddef.h>

#define MODEL_MAX_CODECS 16

/* A codec's costs from gcoll-codec-bench, per float of the dense input. */
typedef struct {
    char spec[64];
    double ratio;   /* compressed bytes / dense bytes */
    double density; /* k / n for a sparsifier, 0 for a quantizer */
    double enc;     /* s per element: encode with error feedback ("ef" column) */
    double dec;     /* s per element: decode into a dense output ("dec") */
    double acc;     /* s per element: decode-and-accumulate, dense ("acc") */
    double acc_nz;  /* s per received nonzero: sparse accumulate ("acc ns/nz") */
} model_codec_t;

typedef struct {
    char link[32];
    double cores;  /* CPUs the measured ranks shared; 0: one core per rank */
    int wire_cpu;  /* 1: the link is memory copies by the CPU (loopback) */
    double alpha;  /* s per message on the link */
    double beta;   /* s per byte on the link */
    double gamma;  /* s per byte reduced */
    double kappa;  /* codec time in a collective / gcoll-codec-bench's time alone */
    double ialpha; /* s per step inside a host (shared memory) */
    double ibeta;  /* s per byte copied inside a host */
    int nfit;      /* measurements fitted */
    double rms;    /* root mean square relative error of the fit */
    int ncodec;
    model_codec_t codec[MODEL_MAX_CODECS];
} model_t;

typedef enum {
    ALG_RING,
    ALG_RHD,
    ALG_RD,
    ALG_TREE,
    ALG_ALLGATHER,  /* sparse: every rank's pairs to every rank (SparCML SSAR) */
    ALG_STREAMED,   /* sparse: the allgather streamed during the selection pass */
    ALG_SPLIT,      /* sparse: reduce by index range, gather the union (gcoll's split) */
    ALG_OKTOPK,     /* sparse: split with a global top-k of the sum, O(k) (Ok-Topk) */
    ALG_ALLTOALL,   /* quantizer: all-to-all, reduce, re-compress, gather (1-bit Adam) */
    ALG_QRING,      /* quantizer: re-quantizing ring */
    ALG_COMPRESSED, /* what gcoll_compressed_allreduce picks for the codec */
    ALG_BEST,       /* the fastest of the flat dense algorithms */
    ALG_COUNT
} model_algo_t;

extern const char *const model_algo_names[ALG_COUNT];

typedef struct {
    int ranks;    /* P */
    double bytes; /* dense size of the tensor */
    model_algo_t algo;
    const model_codec_t *codec; /* NULL: dense */
    double density;             /* > 0: overrides a sparsifier's density */
    int ppn;                    /* ranks per host; > 1 and < P: hierarchical */
    int nics;                   /* hierarchical: NICs per host its rails share; 0: one per rank */
    double cores;               /* CPUs shared by the ranks of a host; 0: one per rank */
    double load; /* runnable processes on the host, if more than its ranks (load average) */
} model_query_t;

/* Parses ALGO; returns ALG_COUNT if unknown. */
model_algo_t model_algo_parse(const char *s);
/* 1 if ALGO needs a codec of that kind (sparse: top-k family), 0 if dense only. */
int model_algo_valid(model_algo_t a, const model_codec_t *c);
/* Predicted time in seconds; a negative value if the query is not valid (why says so). */
double model_predict(const model_t *m, const model_query_t *q, char *why, size_t len);
/* The scheme ALG_COMPRESSED / ALG_BEST resolves to. */
model_algo_t model_resolve(const model_t *m, const model_query_t *q);

typedef struct {
    model_query_t q;
    double time; /* measured, s */
} model_obs_t;

/* Fits alpha, beta, gamma and kappa (nonnegative) to OBS by least squares on the relative
 * error. FIXED_MASK bit 0/1/2/3 keeps alpha/beta/gamma/kappa as M has them. Returns 0, or -1 with
 * WHY. */
int model_fit(model_t *m, const model_obs_t *obs, int n, unsigned fixed_mask, char *why,
              size_t len);

/* The codec named SPEC in M, or NULL. */
const model_codec_t *model_codec_find(const model_t *m, const char *spec);

/* ---- files (tools/model/model_io.c) ---------------------------------------------------- */

typedef struct {
    char link[32];
    model_obs_t *obs;
    int n, cap;
} model_obs_set_t;

typedef struct {
    const char *link;
    int ranks[64], nranks;
    double smin, smax;
    int use_load; /* take each row's load column into its CPU share */
    int use_min;  /* repeated runs: the fastest instead of the median */
} model_filter_t;

/* Prints "gcoll-model: " FMT (with A and B) to stderr; returns 2, the tools' usage status. */
int model_die(const char *fmt, const char *a, const char *b);
/* A size in bytes with an optional K, M or G (powers of 1024) suffix; 0 or -1. */
int model_parse_bytes(const char *s, double *out);
/* A finite number >= MIN with nothing after it; 0 or -1. */
int model_parse_num(const char *s, double *out, double min);
/* The parameters file: "key value" lines and "codec SPEC ratio density enc dec acc acc_nz"
 * (PATH NULL: standard output). 0, or 2 with a message. */
int model_params_write(const model_t *m, const char *path);
int model_params_read(model_t *m, const char *path);
/* gcoll-codec-bench's output: each codec's figures of the largest tensor. 0 or 2. */
int model_codec_bench_read(model_t *m, const char *path);
/* Appends the rows of PATH that FLT keeps; every bad row is an error naming file:line. */
int model_meas_read(const model_t *m, const char *path, const model_filter_t *flt,
                    model_obs_set_t *set);
/* Repeated runs of a case become one row (median, or fastest); runs[] counts them. */
void model_obs_median(model_obs_set_t *set, int *runs, int use_min);

#endif
