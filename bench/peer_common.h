/* peer_common.h: command line, size sweep and CSV rows shared by the peer drivers (C and C++). */
#ifndef GCOLL_BENCH_PEER_COMMON_H
#define GCOLL_BENCH_PEER_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The subset of gcoll-bench's options the peers need, with its defaults, so that
 * compare-dense.sh passes the same flags to every driver. */
typedef struct {
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, check, csv;
    const char *algo;  /* driver-specific; NULL: the driver's default */
    const char *store; /* gloo: FileStore directory */
    const char *coll;  /* mpi_colls: --coll (NULL: the driver's only collective) */
    int root;          /* mpi_colls: -r */
} peer_opts_t;

static inline double peer_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* "4K", "256M", "8": binary suffixes like gcoll-bench. Returns 0 on a bad value. */
static inline int peer_parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0')
        return 0;
    *out = (size_t)v;
    return 1;
}

static inline void peer_usage(const char *prog, FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  -b SIZE  smallest size in bytes (default 8; K, M, G suffixes)\n"
            "  -e SIZE  largest size (default 32M)\n"
            "  -f F     multiply the size by F at each step (default 2)\n"
            "  -n N     timed iterations per size (default 20)\n"
            "  -w N     warm-up iterations per size (default 5)\n"
            "  -c N     check results (#wrong column) when N > 0 (gcoll-bench's -c)\n"
            "  -a ALGO  algorithm (gloo: ring_chunked, halving_doubling)\n"
            "  -s DIR   gloo: FileStore directory for the rendezvous\n"
            "  --coll C mpi_colls: sendrecv, reduce, gather, scatter\n"
            "  -r ROOT  mpi_colls: root of reduce, gather, scatter (default 0)\n"
            "  --csv    comma-separated output\n"
            "Float32 sum (allreduce, or mpi_colls' --coll). Time is the mean per operation on\n"
            "the slowest rank; algbw = size / time, busbw as in nccl-tests.\n",
            prog);
}

/* Returns 0 to go on, 1 to exit successfully (-h), -1 on a bad argument. */
static inline int peer_parse(int argc, char **argv, peer_opts_t *o)
{
    peer_opts_t d = {8, 32u << 20, 2.0, 20, 5, 0, 0, NULL, NULL, NULL, 0};
    *o = d;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            peer_usage(argv[0], stdout);
            return 1;
        } else if (!strcmp(a, "--csv")) {
            o->csv = 1;
        } else if (v && !strcmp(a, "-c")) {
            o->check = atoi(v) > 0, ok = v[0] >= '0' && v[0] <= '9', i++;
        } else if (v && !strcmp(a, "-b")) {
            ok = peer_parse_size(v, &o->min_bytes), i++;
        } else if (v && !strcmp(a, "-e")) {
            ok = peer_parse_size(v, &o->max_bytes), i++;
        } else if (v && !strcmp(a, "-f")) {
            o->factor = atof(v), ok = o->factor > 1.0, i++;
        } else if (v && !strcmp(a, "-n")) {
            o->iters = atoi(v), ok = o->iters > 0, i++;
        } else if (v && !strcmp(a, "-w")) {
            o->warmup = atoi(v), ok = o->warmup >= 0, i++;
        } else if (v && !strcmp(a, "-a")) {
            o->algo = v, i++;
        } else if (v && !strcmp(a, "-s")) {
            o->store = v, i++;
        } else if (v && !strcmp(a, "--coll")) {
            o->coll = v, i++;
        } else if (v && !strcmp(a, "-r")) {
            o->root = atoi(v), ok = v[0] >= '0' && v[0] <= '9', i++;
        } else {
            ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "%s: bad argument '%s'\n", argv[0], a);
            peer_usage(argv[0], stderr);
            return -1;
        }
    }
    if (o->min_bytes < 4 || o->min_bytes > o->max_bytes) {
        fprintf(stderr, "%s: need 4 <= -b <= -e\n", argv[0]);
        return -1;
    }
    return 0;
}

static inline void peer_header(const peer_opts_t *o, const char *what, int n)
{
    if (o->csv) {
        printf("size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong\n");
    } else {
        printf("# %s: allreduce on %d ranks, %d iterations after %d warm-up\n", what, n, o->iters,
               o->warmup);
        printf("#%11s %12s %9s %6s %12s %10s %10s %8s\n", "size(B)", "count", "type", "redop",
               "time(us)", "algbw", "busbw", "#wrong");
    }
}

/* t_us: mean time per operation on the slowest rank; wrong < 0: not checked. */
static inline void peer_row(const peer_opts_t *o, size_t bytes, int n, double t_us, long wrong)
{
    double algbw = t_us > 0 ? (double)bytes / t_us / 1e3 : 0;
    double busbw = algbw * 2.0 * (n - 1) / n;
    char w[32];
    if (wrong < 0)
        snprintf(w, sizeof(w), "N/A");
    else
        snprintf(w, sizeof(w), "%ld", wrong);
    if (o->csv)
        printf("%zu,%zu,float32,sum,%.3f,%.4f,%.4f,%s\n", bytes, bytes / 4, t_us, algbw, busbw, w);
    else
        printf("%12zu %12zu %9s %6s %12.2f %10.3f %10.3f %8s\n", bytes, bytes / 4, "float32", "sum",
               t_us, algbw, busbw, w);
    fflush(stdout);
}

/* Next size of the sweep; 0 when done. */
static inline size_t peer_next(const peer_opts_t *o, size_t bytes)
{
    size_t next = (size_t)((double)bytes * o->factor);
    return next > bytes && next <= o->max_bytes ? next : 0;
}

/* Element i of rank r's input for -c: small integers, exact in float32 sums. */
static inline float peer_val(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 3) % 9) - 4);
}

#endif
