/* mpi_rooted.c: MPI_Reduce, MPI_Gather and MPI_Scatter (float32, root 0) timed as
 * tests/integration/rooted_check.c's "time" mode times gcoll's, for compare-rooted.sh:
 * bytes per rank from 8 B to MAX in steps of 4x, 3 warm-up calls, then enough calls to fill
 * about 0.2 s; the slowest rank's mean. Rank 0 prints "kind bytes us".
 * usage: mpi_rooted [MAX [reduce|gather|scatter]] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t max = argc > 1 ? strtoul(argv[1], NULL, 10) : 16u << 20;
    const char *only = argc > 2 ? argv[2] : NULL;
    static const char *const kinds[] = {"reduce", "gather", "scatter"};
    char *a = calloc(max * (size_t)size, 1), *b = calloc(max * (size_t)size, 1);
    if (!a || !b || max / 4 > 0x7fffffff) {
        fprintf(stderr, "mpi_rooted: cannot allocate %zu bytes\n", max * (size_t)size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int k = 0; k < 3; k++) {
        if (only && strcmp(only, kinds[k]) != 0)
            continue;
        for (size_t bytes = 8; bytes <= max; bytes *= 4) {
            int n = (int)(bytes / 4), iters = 3;
            double per = 0;
            for (int round = 0; round < 2; round++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                for (int i = 0; i < iters; i++) {
                    if (k == 0)
                        MPI_Reduce(a, b, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
                    else if (k == 1)
                        MPI_Gather(a, n, MPI_FLOAT, b, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
                    else
                        MPI_Scatter(a, n, MPI_FLOAT, b, n, MPI_FLOAT, 0, MPI_COMM_WORLD);
                }
                double t = (MPI_Wtime() - t0) / iters;
                MPI_Allreduce(&t, &per, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                iters = (int)(0.2 / per) + 1;
                if (iters > 2000)
                    iters = 2000;
            }
            if (rank == 0)
                printf("%s %zu %.1f\n", kinds[k], bytes, per * 1e6);
        }
    }
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
