/* gcoll-bench: nccl-tests-style benchmark of gcoll's collectives; a thin command line over
 * the engine in tools/bench/. Runs under gcoll-run or mpirun. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "tool_error.h"

typedef enum { OUT_TABLE, OUT_CSV, OUT_JSON } out_t;

typedef struct {
    out_t out;
    int rank, rows;
    const bench_opts_t *o;
} printer_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gcoll-bench [options]   (run it under gcoll-run -n N or mpirun)\n"
            "  -o COLL   allreduce (default), allgather, reduce_scatter, alltoall, broadcast\n"
            "  -b SIZE   smallest size in bytes (default 8; K, M, G suffixes)\n"
            "  -e SIZE   largest size (default 32M)\n"
            "  -f F      multiply the size by F at each step (default 2)\n"
            "  -i STEP   or add STEP bytes at each step (with -f 0)\n"
            "  -n N      timed iterations per size (default 20)\n"
            "  -w N      warm-up iterations per size (default 5)\n"
            "  -c        check results (#wrong column)\n"
            "  -d TYPE   float (default), half, bfloat16, double, int32, int64, bool, int8,\n"
            "            uint8, int16, uint32, uint64, float8_e4m3, float8_e5m2\n"
            "  -r OP     sum (default), avg, min, max, prod, band, bor, bxor\n"
            "  -R ROOT   broadcast root (default 0)\n"
            "  -a ALGO   allreduce algorithm: ring, rhd, tree, rd, auto (sets GCOLL_ALGO)\n"
            "  -z SPEC   compressed allreduce with compressor SPEC (float sum); extra columns:\n"
            "            wire bytes per rank per op, compression ratio, codec time (input scan,\n"
            "            compression, decompression into the output), and the\n"
            "            relative error of one fresh step against the dense sum; with -c, the\n"
            "            result is checked against what every rank's codec sent, summed\n"
            "  --csv     comma-separated output      --json   JSON output\n"
            "Sizes follow nccl-tests: for gathers, size is the total gathered. algbw = size /\n"
            "time; busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter,\n"
            "alltoall), 1 (broadcast). Time is the mean per operation on the slowest rank.\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1048576, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1073741824.0, end++;
    if (end == s || *end || v < 0)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static void emit(const bench_row_t *r, void *ctx)
{
    printer_t *p = ctx;
    if (p->rank != 0)
        return;
    const char *type = gcoll_dtype_name(p->o->dtype);
    const char *op = (p->o->coll == BENCH_ALLREDUCE || p->o->coll == BENCH_REDUCE_SCATTER)
                         ? gcoll_op_name(p->o->op)
                         : "none";
    char wrong[32];
    if (r->wrong < 0)
        snprintf(wrong, sizeof(wrong), "N/A");
    else
        snprintf(wrong, sizeof(wrong), "%ld", r->wrong);
    if (p->o->spec) {
        switch (p->out) {
        case OUT_TABLE:
            printf("%12zu %12zu %12.2f %10.3f %10.3f %12.0f %8.1f %10.2f %9.2e %8s  %s\n", r->bytes,
                   r->count, r->time_us, r->algbw, r->busbw, r->wire_bytes, r->ratio, r->comp_us,
                   r->rel_err, wrong, r->scheme);
            break;
        case OUT_CSV:
            printf("%zu,%zu,%.3f,%.4f,%.4f,%.0f,%.3f,%.3f,%.4e,%s,%s\n", r->bytes, r->count,
                   r->time_us, r->algbw, r->busbw, r->wire_bytes, r->ratio, r->comp_us, r->rel_err,
                   wrong, r->scheme);
            break;
        case OUT_JSON:
            printf("%s\n  {\"size\": %zu, \"count\": %zu, \"time_us\": %.3f, \"algbw\": %.4f, "
                   "\"busbw\": %.4f, \"wire_bytes\": %.0f, \"ratio\": %.3f, \"comp_us\": %.3f, "
                   "\"rel_err\": %.4e, \"wrong\": %ld, \"scheme\": \"%s\"}",
                   p->rows ? "," : "", r->bytes, r->count, r->time_us, r->algbw, r->busbw,
                   r->wire_bytes, r->ratio, r->comp_us, r->rel_err, r->wrong, r->scheme);
            break;
        }
        p->rows++;
        fflush(stdout);
        return;
    }
    switch (p->out) {
    case OUT_TABLE:
        printf("%12zu %12zu %9s %6s %12.2f %10.3f %10.3f %8s\n", r->bytes, r->count, type, op,
               r->time_us, r->algbw, r->busbw, wrong);
        break;
    case OUT_CSV:
        printf("%zu,%zu,%s,%s,%.3f,%.4f,%.4f,%s\n", r->bytes, r->count, type, op, r->time_us,
               r->algbw, r->busbw, wrong);
        break;
    case OUT_JSON:
        printf("%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
               "\"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %ld}",
               p->rows ? "," : "", r->bytes, r->count, type, op, r->time_us, r->algbw, r->busbw,
               r->wrong);
        break;
    }
    p->rows++;
    fflush(stdout);
}

int main(int argc, char **argv)
{
    bench_opts_t o = {.coll = BENCH_ALLREDUCE,
                      .dtype = GCOLL_FLOAT32,
                      .op = GCOLL_SUM,
                      .min_bytes = 8,
                      .max_bytes = 32 << 20,
                      .factor = 2,
                      .iters = 20,
                      .warmup = 5};
    printer_t p = {.out = OUT_TABLE, .o = &o};
    static const struct option longopts[] = {{"csv", no_argument, NULL, 'C'},
                                             {"json", no_argument, NULL, 'J'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "o:b:e:f:i:n:w:cd:r:R:a:z:h", longopts, NULL)) != -1) {
        int bad = 0;
        /* clang-format off */
        switch (c) {
        case 'o': bad = bench_parse_coll(optarg, &o.coll); break;
        case 'b': bad = parse_size(optarg, &o.min_bytes); break;
        case 'e': bad = parse_size(optarg, &o.max_bytes); break;
        case 'f': o.factor = atof(optarg); bad = o.factor != 0 && o.factor <= 1; break;
        case 'i': bad = parse_size(optarg, &o.step); break;
        case 'n': o.iters = atoi(optarg); bad = o.iters < 1; break;
        case 'w': o.warmup = atoi(optarg); bad = o.warmup < 0; break;
        case 'c': o.check = 1; break;
        case 'd': bad = bench_parse_dtype(optarg, &o.dtype); break;
        case 'r': bad = bench_parse_op(optarg, &o.op); break;
        case 'R': o.root = atoi(optarg); break;
        case 'a': setenv("GCOLL_ALGO", optarg, 1); break;
        case 'z': o.spec = optarg; break;
        case 'C': p.out = OUT_CSV; break;
        case 'J': p.out = OUT_JSON; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        /* clang-format on */
        if (bad) {
            fprintf(stderr, "gcoll-bench: bad value '%s' for -%c\n", optarg, c);
            return 2;
        }
    }
    if (o.min_bytes > o.max_bytes || (o.factor == 0 && o.step == 0)) {
        fprintf(stderr, "gcoll-bench: need -b <= -e and a step (-f > 1 or -i > 0)\n");
        return 2;
    }
    gcoll_comm_t *comm;
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        tool_error("gcoll-bench", "gcoll_comm_init", "");
        return 1;
    }
    p.rank = gcoll_comm_rank(comm);
    if (o.root < 0 || o.root >= gcoll_comm_size(comm)) {
        fprintf(stderr, "gcoll-bench: root %d is not a rank\n", o.root);
        gcoll_comm_destroy(comm);
        return 2;
    }
    if (p.rank == 0) {
        const char *algo = getenv("GCOLL_ALGO");
        if (p.out == OUT_TABLE) {
            printf("# gcoll-bench %s: %s%s%s on %d ranks over %s, algorithm %s, %d iterations "
                   "(%d warm-up)\n",
                   gcoll_version(), o.spec ? "compressed " : "", bench_coll_name(o.coll),
                   o.spec ? "" : "", gcoll_comm_size(comm), gcoll_comm_transport(comm),
                   algo ? algo : "auto", o.iters, o.warmup);
            if (o.spec)
                printf("# compressor %s; algbw and busbw count uncompressed bytes (effective)\n"
                       "#%11s %12s %12s %10s %10s %12s %8s %10s %9s %8s  %s\n",
                       o.spec, "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw", "wire(B)",
                       "ratio", "comp(us)", "relerr", "#wrong", "scheme");
            else
                printf("#%11s %12s %9s %6s %12s %10s %10s %8s\n", "size(B)", "count", "type",
                       "redop", "time(us)", "algbw(GB/s)", "busbw", "#wrong");
        } else if (p.out == OUT_CSV && o.spec) {
            printf(
                "size,count,time_us,algbw_GBps,busbw_GBps,wire_bytes,ratio,comp_us,rel_err,wrong,"
                "scheme\n");
        } else if (p.out == OUT_CSV) {
            printf("size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong\n");
        } else {
            printf("[");
        }
    }
    st = bench_run(comm, &o, emit, &p);
    if (p.rank == 0 && p.out == OUT_JSON)
        printf("\n]\n");
    if (st != GCOLL_OK) {
        /* the communicator's first error, else gcoll_last_error: a failure outside the
         * communicator (a bad -z spec) */
        const char *e = gcoll_comm_last_error(comm);
        fprintf(stderr, "gcoll-bench: rank %d: %s\n", p.rank, *e ? e : gcoll_last_error());
        /* the peers may be in a collective this rank never joins: tell them, or they wait
         * for it until GCOLL_TIMEOUT_MS */
        gcoll_comm_abort(comm);
    }
    gcoll_comm_destroy(comm);
    return st == GCOLL_OK ? 0 : 1;
}
