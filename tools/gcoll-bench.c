/* gcoll-bench: a benchmark of gcoll's collectives with nccl-tests' flags and output
 * (github.com/NVIDIA/nccl-tests: README's arguments, doc/PERFORMANCE.md's busbw); a thin
 * command line over the engine in tools/bench/. Runs under gcoll-run or mpirun. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "tool_error.h"

typedef enum { OUT_TABLE, OUT_CSV, OUT_JSON } out_t;

typedef struct {
    out_t out;
    int rank, ranks, rows;
    const bench_opts_t *o;
    long wrong;    /* over every checked row and placement */
    double bw_sum; /* busbw summed over every row and placement that ran */
    int bw_n;
} printer_t;

static const char *const algos[] = {"auto", "ring", "rhd", "tree", "rd"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gcoll-bench [options]   (run it under gcoll-run -n N or mpirun)\n"
            "nccl-tests' flags:\n"
            "  -b,--minbytes SIZE      smallest size in bytes (default 8; K, M, G suffixes)\n"
            "  -e,--maxbytes SIZE      largest size (default 32M)\n"
            "  -f,--stepfactor F       multiply the size by F at each step (default 2; 0 or 1:\n"
            "                          add -i instead)\n"
            "  -i,--stepbytes SIZE     add SIZE at each step when -f is 0 or 1 (default 1M;\n"
            "                          giving -i alone sets -f 1)\n"
            "  -n,--iters N            timed iterations per size (default 20)\n"
            "  -w,--warmup_iters N     warm-up iterations per size (default 5)\n"
            "  -c,--check N            check the result of N more runs per size and placement\n"
            "                          (#wrong column; default 1, 0: no check)\n"
            "  -o,--op OP              sum (default), avg, min, max, prod, band, bor, bxor, all\n"
            "  -d,--datatype TYPE      float32 (default), float16, bfloat16, float64, int32,\n"
            "                          int64, bool, int8, uint8, int16, uint32, uint64,\n"
            "                          float8_e4m3, float8_e5m2, all (also float, half,\n"
            "                          double, int)\n"
            "  -r,--root R             root of broadcast, reduce, gather, scatter (default 0)\n"
            "  -a,--average 0|1|2|3    reported time: rank 0's, mean over ranks (default),\n"
            "                          minimum, maximum\n"
            "  -z,--blocking 0|1|2     0: post the iterations as nonblocking calls, then wait\n"
            "                          for all (default); 1: blocking call and barrier per\n"
            "                          iteration; 2: blocking call per iteration, no barrier\n"
            "gcoll's own:\n"
            "  --coll NAME             allreduce (default), allgather, reduce_scatter,\n"
            "                          alltoall, broadcast, barrier, compressed, sendrecv,\n"
            "                          reduce, gather, scatter\n"
            "  --compressor SPEC       compressed allreduce (float32 sum) with compressor\n"
            "                          SPEC (implies --coll compressed); extra columns: wire\n"
            "                          bytes per rank per op, compression ratio, codec time,\n"
            "                          relative error of one fresh step against the dense sum\n"
            "  --algo ALGO             allreduce algorithm: auto, ring, rhd, tree, rd (sets\n"
            "                          GCOLL_ALGO)\n"
            "  --csv                   comma-separated output\n"
            "  --json                  JSON output (a list of records)\n"
            "  -h,--help\n"
            "Sizes follow nccl-tests: for allgather, reduce_scatter, alltoall, gather and\n"
            "scatter, size is the total over ranks. algbw = size / time; busbw = algbw *\n"
            "2(n-1)/n (allreduce, compressed), (n-1)/n (allgather, reduce_scatter, alltoall,\n"
            "gather, scatter), 1 (broadcast, reduce, sendrecv). sendrecv: every rank sends\n"
            "to rank+1 and receives from rank-1 at once.\n"
            "Every size runs out of place, then in place where the call has that form.\n");
}

/* Strict number parsers: the whole argument, in range. */
static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1048576, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1073741824.0, end++;
    if (end == s || *end || errno || !(v >= 0) || v * mul > 1e15)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* A value with room for 'width' characters, as precise as fits (nccl-tests' columns). */
static const char *num(char *buf, int width, double v)
{
    static const char *const fmt[] = {"%*.2f", "%*.1f", "%*.0f"};
    for (int i = 0; i < 3; i++)
        if (snprintf(buf, 32, fmt[i], width, v) <= width)
            return buf;
    snprintf(buf, 32, "%*.1e", width, v);
    return buf;
}

static void tally(printer_t *p, const bench_result_t *r)
{
    if (!r->ran)
        return;
    p->bw_sum += r->busbw;
    p->bw_n++;
    if (r->wrong > 0)
        p->wrong += r->wrong;
}

static void table_cell(const bench_result_t *r)
{
    char t[32], a[32], b[32], w[32];
    if (!r->ran) {
        printf("  %7s  %6s  %6s  %6s", "-", "-", "-", "-");
        return;
    }
    if (r->wrong < 0)
        snprintf(w, sizeof(w), "N/A");
    else
        snprintf(w, sizeof(w), "%ld", r->wrong);
    printf("  %7s  %6s  %6s  %6s", num(t, 7, r->time_us), num(a, 6, r->algbw), num(b, 6, r->busbw),
           w);
}

static void csv_cell(const bench_result_t *r)
{
    if (!r->ran) {
        printf(",,,");
        return;
    }
    printf("%.3f,%.4f,%.4f,", r->time_us, r->algbw, r->busbw);
    if (r->wrong < 0)
        printf("N/A");
    else
        printf("%ld", r->wrong);
}

static void json_cell(const char *key, const bench_result_t *r)
{
    if (!r->ran) {
        printf(", \"%s\": null", key);
        return;
    }
    printf(", \"%s\": {\"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": ", key,
           r->time_us, r->algbw, r->busbw);
    if (r->wrong < 0)
        printf("null}");
    else
        printf("%ld}", r->wrong);
}

static void emit_compressed(const bench_row_t *r, printer_t *p)
{
    char wrong[32];
    if (r->oop.wrong < 0)
        snprintf(wrong, sizeof(wrong), "N/A");
    else
        snprintf(wrong, sizeof(wrong), "%ld", r->oop.wrong);
    switch (p->out) {
    case OUT_TABLE:
        printf("%12zu %12zu %12.2f %10.3f %10.3f %12.0f %8.1f %10.2f %9.2e %8s  %s\n", r->bytes,
               r->count, r->oop.time_us, r->oop.algbw, r->oop.busbw, r->wire_bytes, r->ratio,
               r->comp_us, r->rel_err, wrong, r->scheme);
        break;
    case OUT_CSV:
        printf("%zu,%zu,%.3f,%.4f,%.4f,%.0f,%.3f,%.3f,%.4e,%s,%s\n", r->bytes, r->count,
               r->oop.time_us, r->oop.algbw, r->oop.busbw, r->wire_bytes, r->ratio, r->comp_us,
               r->rel_err, wrong, r->scheme);
        break;
    case OUT_JSON:
        printf("%s\n  {\"collective\": \"compressed\", \"ranks\": %d, \"compressor\": \"%s\", "
               "\"size\": %zu, \"count\": %zu, \"time_us\": %.3f, \"algbw\": %.4f, "
               "\"busbw\": %.4f, \"wire_bytes\": %.0f, \"ratio\": %.3f, \"comp_us\": %.3f, "
               "\"rel_err\": %.4e, \"wrong\": %s, \"scheme\": \"%s\"}",
               p->rows ? "," : "", p->ranks, p->o->spec, r->bytes, r->count, r->oop.time_us,
               r->oop.algbw, r->oop.busbw, r->wire_bytes, r->ratio, r->comp_us, r->rel_err,
               r->oop.wrong < 0 ? "null" : wrong, r->scheme);
        break;
    }
}

static void emit(const bench_row_t *r, void *ctx)
{
    printer_t *p = ctx;
    tally(p, &r->oop); /* on every rank: the counts are over ranks, and so is the exit status */
    tally(p, &r->ip);
    if (p->rank != 0)
        return;
    const bench_opts_t *o = p->o;
    if (o->coll == BENCH_COMPRESSED) {
        emit_compressed(r, p);
        p->rows++;
        fflush(stdout);
        return;
    }
    const char *type = gcoll_dtype_name(o->dtype);
    const char *op = bench_coll_reduces(o->coll) ? gcoll_op_name(o->op) : "none";
    int root = bench_coll_rooted(o->coll) ? o->root : -1;
    switch (p->out) {
    case OUT_TABLE:
        printf("%12zu  %12zu  %8s  %6s  %6d", r->bytes, r->count, type, op, root);
        table_cell(&r->oop);
        table_cell(&r->ip);
        printf("\n");
        break;
    case OUT_CSV:
        printf("%zu,%zu,%s,%s,", r->bytes, r->count, type, op);
        csv_cell(&r->oop);
        printf(",");
        csv_cell(&r->ip);
        printf(",%d,%s,%d\n", root, bench_coll_name(o->coll), p->ranks);
        break;
    case OUT_JSON:
        printf("%s\n  {\"collective\": \"%s\", \"ranks\": %d, \"size\": %zu, \"count\": %zu, "
               "\"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
               p->rows ? "," : "", bench_coll_name(o->coll), p->ranks, r->bytes, r->count, type, op,
               root);
        json_cell("out_of_place", &r->oop);
        json_cell("in_place", &r->ip);
        printf("}");
        break;
    }
    p->rows++;
    fflush(stdout);
}

static void header(const printer_t *p, gcoll_comm_t *comm)
{
    const bench_opts_t *o = p->o;
    if (p->out == OUT_JSON) {
        printf("[");
        return;
    }
    if (p->out == OUT_CSV) {
        if (o->coll == BENCH_COMPRESSED)
            printf("size,count,time_us,algbw_GBps,busbw_GBps,wire_bytes,ratio,comp_us,rel_err,"
                   "wrong,scheme\n");
        else
            printf("size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,ip_time_us,"
                   "ip_algbw_GBps,ip_busbw_GBps,ip_wrong,root,collective,ranks\n");
        return;
    }
    const char *algo = getenv("GCOLL_ALGO");
    printf("# gcoll-bench %s: %s on %d ranks over %s, algorithm %s, %d iterations (%d warm-up), "
           "-c %d -a %d -z %d\n",
           gcoll_version(), bench_coll_name(o->coll), p->ranks, gcoll_comm_transport(comm),
           algo ? algo : "auto", o->iters, o->warmup, o->check, o->average, o->blocking);
    if (o->coll == BENCH_COMPRESSED) {
        printf("# compressor %s; algbw and busbw count uncompressed bytes (effective)\n"
               "#%11s %12s %12s %10s %10s %12s %8s %10s %9s %8s  %s\n",
               o->spec, "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw", "wire(B)", "ratio",
               "comp(us)", "relerr", "#wrong", "scheme");
        return;
    }
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count",
           "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s\n", "(B)", "(elements)",
           "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
}

/* Prints "bad value 'V' for OPT; valid: LIST" and returns 2. */
static int refuse(const char *opt, const char *v, const char *valid)
{
    fprintf(stderr, "gcoll-bench: bad value '%s' for %s; valid: %s\n", v, opt, valid);
    return 2;
}

int main(int argc, char **argv)
{
    bench_opts_t o = {.coll = BENCH_ALLREDUCE,
                      .dtype = GCOLL_FLOAT32,
                      .op = GCOLL_SUM,
                      .min_bytes = 8,
                      .max_bytes = 32 << 20,
                      .factor = 2,
                      .step = 1 << 20,
                      .iters = 20,
                      .warmup = 5,
                      .check = 1,
                      .average = BENCH_AVG_MEAN,
                      .blocking = BENCH_Z_NONBLOCKING};
    printer_t p = {.out = OUT_TABLE, .o = &o};
    int all_dtypes = 0, all_ops = 0, coll_given = 0, factor_given = 0, step_given = 0;
    enum { O_COLL = 256, O_COMPRESSOR, O_ALGO, O_CSV, O_JSON };
    static const struct option longopts[] = {{"minbytes", required_argument, NULL, 'b'},
                                             {"maxbytes", required_argument, NULL, 'e'},
                                             {"stepfactor", required_argument, NULL, 'f'},
                                             {"stepbytes", required_argument, NULL, 'i'},
                                             {"iters", required_argument, NULL, 'n'},
                                             {"warmup_iters", required_argument, NULL, 'w'},
                                             {"check", required_argument, NULL, 'c'},
                                             {"op", required_argument, NULL, 'o'},
                                             {"datatype", required_argument, NULL, 'd'},
                                             {"root", required_argument, NULL, 'r'},
                                             {"average", required_argument, NULL, 'a'},
                                             {"blocking", required_argument, NULL, 'z'},
                                             {"coll", required_argument, NULL, O_COLL},
                                             {"compressor", required_argument, NULL, O_COMPRESSOR},
                                             {"algo", required_argument, NULL, O_ALGO},
                                             {"csv", no_argument, NULL, O_CSV},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c, li;
    opterr = 0; /* getopt's own messages would come before ours; we name the option */
    while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:o:d:r:a:z:h", longopts, &li)) != -1) {
        char *end;
        switch (c) {
        case 'b':
            if (parse_size(optarg, &o.min_bytes))
                return refuse("-b/--minbytes", optarg, "a size in bytes (K, M, G suffixes)");
            break;
        case 'e':
            if (parse_size(optarg, &o.max_bytes))
                return refuse("-e/--maxbytes", optarg, "a size in bytes (K, M, G suffixes)");
            break;
        case 'f':
            errno = 0;
            o.factor = strtod(optarg, &end);
            if (end == optarg || *end || errno || !(o.factor == 0 || o.factor >= 1) ||
                o.factor > 1e6)
                return refuse("-f/--stepfactor", optarg, "0 or 1 (step by -i), or a factor > 1");
            factor_given = 1;
            break;
        case 'i':
            if (parse_size(optarg, &o.step) || o.step == 0)
                return refuse("-i/--stepbytes", optarg, "a size in bytes > 0");
            step_given = 1;
            break;
        case 'n':
            if (parse_int(optarg, 1, INT_MAX, &o.iters))
                return refuse("-n/--iters", optarg, "an integer >= 1");
            break;
        case 'w':
            if (parse_int(optarg, 0, INT_MAX, &o.warmup))
                return refuse("-w/--warmup_iters", optarg, "an integer >= 0");
            break;
        case 'c':
            if (parse_int(optarg, 0, 1000000, &o.check))
                return refuse("-c/--check", optarg, "0 (no check) or the number of checked runs");
            break;
        case 'o':
            all_ops = strcmp(optarg, "all") == 0;
            if (!all_ops && bench_parse_op(optarg, &o.op))
                return refuse("-o/--op", optarg, "sum avg min max prod band bor bxor all");
            break;
        case 'd':
            all_dtypes = strcmp(optarg, "all") == 0;
            if (!all_dtypes && bench_parse_dtype(optarg, &o.dtype))
                return refuse("-d/--datatype", optarg,
                              "float32 float16 bfloat16 float64 int32 int64 bool int8 uint8 int16 "
                              "uint32 uint64 float8_e4m3 float8_e5m2 all (aliases: float half "
                              "double int)");
            break;
        case 'r':
            if (parse_int(optarg, 0, INT_MAX, &o.root))
                return refuse("-r/--root", optarg, "a rank, 0 to ranks-1");
            break;
        case 'a':
            if (parse_int(optarg, 0, 3, &o.average))
                return refuse("-a/--average", optarg, "0 (rank 0), 1 (mean), 2 (min), 3 (max)");
            break;
        case 'z':
            if (parse_int(optarg, 0, BENCH_NZ - 1, &o.blocking))
                return refuse("-z/--blocking", optarg,
                              "0 (nonblocking), 1 (blocking + barrier), 2 (blocking)");
            break;
        case O_COLL:
            if (bench_parse_coll(optarg, &o.coll))
                return refuse("--coll", optarg,
                              "allreduce allgather reduce_scatter alltoall broadcast barrier "
                              "compressed sendrecv reduce gather scatter");
            coll_given = 1;
            break;
        case O_COMPRESSOR:
            o.spec = optarg;
            break;
        case O_ALGO: {
            size_t k = 0;
            while (k < sizeof(algos) / sizeof(algos[0]) && strcmp(optarg, algos[k]) != 0)
                k++;
            if (k == sizeof(algos) / sizeof(algos[0]))
                return refuse("--algo", optarg, "auto ring rhd tree rd");
            setenv("GCOLL_ALGO", optarg, 1);
            break;
        }
        case O_CSV:
            p.out = OUT_CSV;
            break;
        case O_JSON:
            p.out = OUT_JSON;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "gcoll-bench: %s needs a value\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        default:
            if (optopt)
                fprintf(stderr, "gcoll-bench: unknown option '-%c'\n", optopt);
            else
                fprintf(stderr, "gcoll-bench: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gcoll-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (step_given && !factor_given)
        o.factor = 1; /* -i alone steps by -i, as in nccl-tests */
    if (o.min_bytes > o.max_bytes) {
        fprintf(stderr, "gcoll-bench: -b %zu is larger than -e %zu\n", o.min_bytes, o.max_bytes);
        return 2;
    }
    if (o.spec && !coll_given)
        o.coll = BENCH_COMPRESSED;
    if (o.coll == BENCH_COMPRESSED) {
        if (!o.spec) {
            fprintf(stderr, "gcoll-bench: --coll compressed needs --compressor SPEC\n");
            return 2;
        }
        if (all_dtypes || all_ops || o.dtype != GCOLL_FLOAT32 || o.op != GCOLL_SUM) {
            fprintf(stderr, "gcoll-bench: the compressed allreduce takes -d float32 -o sum\n");
            return 2;
        }
    } else if (o.spec) {
        fprintf(stderr, "gcoll-bench: --compressor goes with --coll compressed, not %s\n",
                bench_coll_name(o.coll));
        return 2;
    }
    if (!all_dtypes && !all_ops && bench_coll_reduces(o.coll) && bench_op_refused(o.dtype, o.op)) {
        fprintf(stderr, "gcoll-bench: -o %s with -d %s: %s\n", gcoll_op_name(o.op),
                gcoll_dtype_name(o.dtype), bench_op_refused(o.dtype, o.op));
        return 2;
    }
    if (o.spec) {
        gcoll_compressor_t *z;
        if (gcoll_compressor_create(o.spec, &z) != GCOLL_OK) {
            tool_error("gcoll-bench", "--compressor", "");
            return 2;
        }
        gcoll_compressor_destroy(z);
    }
    gcoll_comm_t *comm;
    if (gcoll_comm_init(&comm) != GCOLL_OK) {
        tool_error("gcoll-bench", "gcoll_comm_init", "");
        return 1;
    }
    p.rank = gcoll_comm_rank(comm);
    p.ranks = gcoll_comm_size(comm);
    if (o.root >= p.ranks) {
        if (p.rank == 0)
            fprintf(stderr, "gcoll-bench: bad value '%d' for -r/--root; valid: 0 to %d\n", o.root,
                    p.ranks - 1);
        gcoll_comm_destroy(comm);
        return 2;
    }
    if (p.rank == 0)
        header(&p, comm);
    gcoll_status_t st = GCOLL_OK;
    /* -d all, -o all: every dtype, every op that applies to it (nccl-tests' "all") */
    int every = all_dtypes && o.coll != BENCH_BARRIER; /* a barrier has no dtype */
    int d0 = every ? 0 : (int)o.dtype, d1 = every ? BENCH_NDTYPES : d0 + 1;
    int reduces = bench_coll_reduces(o.coll);
    int op0 = all_ops && reduces ? 0 : (int)o.op, op1 = all_ops && reduces ? BENCH_NOPS : op0 + 1;
    for (int d = d0; d < d1 && st == GCOLL_OK; d++)
        for (int op = op0; op < op1 && st == GCOLL_OK; op++) {
            o.dtype = (gcoll_dtype_t)d;
            o.op = (gcoll_op_t)op;
            if (reduces && bench_op_refused(o.dtype, o.op))
                continue;
            st = bench_run(comm, &o, emit, &p);
        }
    if (p.rank == 0) {
        if (p.out == OUT_JSON) {
            printf("\n]\n");
        } else if (p.out == OUT_TABLE) {
            printf("# %-20s : %ld %s\n", "Out of bounds values", p.wrong,
                   p.wrong ? "FAILED" : "OK");
            printf("# %-20s : %g\n", "Avg bus bandwidth", p.bw_n ? p.bw_sum / p.bw_n : 0.0);
            printf("#\n");
        }
    }
    if (st == GCOLL_ERR_NOMEM)
        fprintf(stderr, "gcoll-bench: rank %d: no memory for the buffers of -e %zu bytes\n", p.rank,
                o.max_bytes);
    else if (st != GCOLL_OK) {
        /* the communicator's first error, else gcoll_last_error: a failure outside the
         * communicator (a bad --compressor spec) */
        const char *e = gcoll_comm_last_error(comm);
        fprintf(stderr, "gcoll-bench: rank %d: %s: %s\n", p.rank, gcoll_status_string(st),
                *e ? e : gcoll_last_error());
    }
    /* the peers may be in a collective this rank never joins: tell them, or they wait for
     * it until GCOLL_TIMEOUT_MS */
    if (st != GCOLL_OK)
        gcoll_comm_abort(comm);
    gcoll_comm_destroy(comm);
    return st != GCOLL_OK || p.wrong ? 1 : 0;
}
