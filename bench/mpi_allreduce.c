/* mpi_allreduce.c: MPI_Allreduce (float32, sum) timed like gcoll-bench, for compare-dense.sh. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>

#include "peer_common.h"

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
    size_t maxc = o.max_bytes / 4;
    if (maxc > INT32_MAX) {
        fprintf(stderr, "mpi_allreduce: -e too large for an int count\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *in = calloc(maxc + 1, 4), *out = calloc(maxc + 1, 4);
    if (!in || !out) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0) {
        char what[64];
        int maj, min;
        MPI_Get_version(&maj, &min);
        snprintf(what, sizeof(what), "MPI %d.%d MPI_Allreduce", maj, min);
        peer_header(&o, what, n);
    }
    for (size_t bytes = o.min_bytes; bytes; bytes = peer_next(&o, bytes)) {
        int count = (int)(bytes / 4);
        /* same input as gcoll-bench: out of place, every element 1 */
        for (int i = 0; i < count; i++)
            in[i] = 1.0f;
        for (int w = 0; w < o.warmup; w++)
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = peer_now_us();
        for (int it = 0; it < o.iters; it++)
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (peer_now_us() - t0) / o.iters, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        long wrong = -1;
        if (o.check) {
            for (int i = 0; i < count; i++)
                in[i] = peer_val(rank, (size_t)i);
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            long mine = 0;
            for (int i = 0; i < count; i++) {
                float want = 0;
                for (int k = 0; k < n; k++)
                    want += peer_val(k, (size_t)i);
                mine += out[i] != want;
            }
            MPI_Allreduce(&mine, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
        if (rank == 0)
            peer_row(&o, (size_t)count * 4, n, tmax, wrong);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
