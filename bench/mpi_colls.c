/* mpi_colls.c: Open MPI's point-to-point exchange, MPI_Reduce, MPI_Gather and MPI_Scatter
 * (float32, sum), timed as gcoll-bench --coll sendrecv/reduce/gather/scatter -z 2 -a 3 times
 * gcoll's: blocking calls, out of place, a barrier after the warm-up, the mean time per
 * operation on the slowest rank. Sizes, algbw and busbw as nccl-tests (doc/PERFORMANCE.md):
 * size is one rank's message for sendrecv and reduce and the total over ranks for gather
 * and scatter; busbw = algbw for sendrecv and reduce, algbw * (n-1)/n for gather and
 * scatter. sendrecv is nccl-tests' pattern: every rank sends to rank+1 and receives from
 * rank-1 at once (MPI_Sendrecv). For bench/ompi-compare.sh. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>

#include "peer_common.h"

enum { SENDRECV, REDUCE, GATHER, SCATTER };

static void run(int c, float *in, float *out, int count, int root, int rank, int n)
{
    switch (c) {
    case SENDRECV:
        MPI_Sendrecv(in, count, MPI_FLOAT, (rank + 1) % n, 0, out, count, MPI_FLOAT,
                     (rank + n - 1) % n, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
    case REDUCE:
        MPI_Reduce(in, out, count, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        break;
    case GATHER:
        MPI_Gather(in, count, MPI_FLOAT, out, count, MPI_FLOAT, root, MPI_COMM_WORLD);
        break;
    default:
        MPI_Scatter(in, count, MPI_FLOAT, out, count, MPI_FLOAT, root, MPI_COMM_WORLD);
        break;
    }
}

/* Wrong elements of this rank's output after one run on inputs peer_val(rank, i). */
static long check(int c, float *in, float *out, int count, int root, int rank, int n)
{
    int nin = c == SCATTER ? count * n : count;
    for (int i = 0; i < nin; i++)
        in[i] = peer_val(rank, (size_t)i);
    for (int i = 0; i < (c == GATHER ? count * n : count); i++)
        out[i] = -99.0f;
    run(c, in, out, count, root, rank, n);
    long wrong = 0;
    if (c == SENDRECV) {
        for (int i = 0; i < count; i++)
            wrong += out[i] != peer_val((rank + n - 1) % n, (size_t)i);
    } else if (c == SCATTER) {
        for (int i = 0; i < count; i++)
            wrong += out[i] != peer_val(root, (size_t)rank * count + i);
    } else if (rank == root && c == GATHER) {
        for (int k = 0; k < n; k++)
            for (int i = 0; i < count; i++)
                wrong += out[(size_t)k * count + i] != peer_val(k, (size_t)i);
    } else if (rank == root) {
        for (int i = 0; i < count; i++) {
            float want = 0;
            for (int k = 0; k < n; k++)
                want += peer_val(k, (size_t)i);
            wrong += out[i] != want;
        }
    }
    return wrong;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    peer_opts_t o;
    int rc = peer_parse(argc, argv, &o);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    static const char *const names[] = {"sendrecv", "reduce", "gather", "scatter"};
    int c = -1;
    for (int i = 0; i < 4; i++)
        if (o.coll && !strcmp(o.coll, names[i]))
            c = i;
    if (c < 0 || o.root < 0 || o.root >= n) {
        if (rank == 0)
            fprintf(stderr, "mpi_colls: need --coll sendrecv|reduce|gather|scatter and -r 0..%d\n",
                    n - 1);
        MPI_Finalize();
        return 2;
    }
    /* gathers: size is the total, one rank sends size/n */
    int rooted_all = c == GATHER || c == SCATTER;
    size_t maxc = o.max_bytes / 4 / (rooted_all ? (size_t)n : 1);
    if (maxc * (size_t)n > INT32_MAX) {
        fprintf(stderr, "mpi_colls: -e too large for an int count\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *in = calloc(maxc * (size_t)n + 1, 4), *out = calloc(maxc * (size_t)n + 1, 4);
    if (!in || !out) {
        fprintf(stderr, "mpi_colls: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0) {
        if (o.csv)
            printf("size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong\n");
        else
            printf("# Open MPI %s on %d ranks, root %d, %d iterations after %d warm-up\n"
                   "#%11s %12s %12s %10s %10s %8s\n",
                   names[c], n, o.root, o.iters, o.warmup, "size(B)", "count", "time(us)", "algbw",
                   "busbw", "#wrong");
    }
    for (size_t bytes = o.min_bytes; bytes; bytes = peer_next(&o, bytes)) {
        int count = (int)(bytes / 4 / (rooted_all ? (size_t)n : 1));
        size_t size = (size_t)count * 4 * (rooted_all ? (size_t)n : 1);
        for (size_t i = 0; i < (size_t)count * (size_t)n; i++)
            in[i] = 1.0f;
        for (int w = 0; w < o.warmup; w++)
            run(c, in, out, count, o.root, rank, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = peer_now_us();
        for (int it = 0; it < o.iters; it++)
            run(c, in, out, count, o.root, rank, n);
        double t = (peer_now_us() - t0) / o.iters, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        long wrong = -1;
        if (o.check) {
            long mine = check(c, in, out, count, o.root, rank, n);
            MPI_Allreduce(&mine, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
        if (rank == 0) {
            double algbw = tmax > 0 ? (double)size / tmax / 1e3 : 0;
            double busbw = algbw * (rooted_all ? (double)(n - 1) / n : 1.0);
            char w[32];
            if (wrong < 0)
                snprintf(w, sizeof(w), "N/A");
            else
                snprintf(w, sizeof(w), "%ld", wrong);
            const char *op = c == REDUCE ? "sum" : "none";
            if (o.csv)
                printf("%zu,%d,float32,%s,%.3f,%.4f,%.4f,%s\n", size, count, op, tmax, algbw, busbw,
                       w);
            else
                printf("%12zu %12d %12.2f %10.3f %10.3f %8s\n", size, count, tmax, algbw, busbw, w);
            fflush(stdout);
        }
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
