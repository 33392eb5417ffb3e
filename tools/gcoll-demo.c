/* gcoll-demo: the first thing to run: every rank allreduces a vector whose expected sum it
 * can compute itself, checks it, and prints one line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcoll.h"
#include "tool_error.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t count = argc > 1 ? strtoull(argv[1], NULL, 0) : 1 << 20;
    gcoll_comm_t *comm;
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        tool_error("gcoll-demo", "gcoll_comm_init", "");
        return 1;
    }
    int rank = gcoll_comm_rank(comm), size = gcoll_comm_size(comm);
    float *x = malloc(count * sizeof(float));
    if (!x && count) {
        fprintf(stderr, "gcoll-demo: out of memory\n");
        return 1;
    }
    /* x[i] = rank + i mod 7: the sum over ranks is size*(i mod 7) + size*(size-1)/2. */
    for (size_t i = 0; i < count; i++)
        x[i] = (float)(rank + (int)(i % 7));
    double t0 = now();
    st = gcoll_allreduce(comm, x, x, count, GCOLL_FLOAT32, GCOLL_SUM);
    double dt = now() - t0;
    if (st != GCOLL_OK) {
        fprintf(stderr, "gcoll-demo: allreduce failed: %s\n", gcoll_comm_last_error(comm));
        gcoll_comm_destroy(comm);
        return 1;
    }
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        float want = (float)(size * (int)(i % 7)) + (float)size * (float)(size - 1) / 2.0f;
        if (x[i] != want)
            wrong++;
    }
    printf("rank %d/%d: allreduce of %zu floats over %s: %s (%zu wrong) in %.2f ms\n", rank, size,
           count, gcoll_comm_transport(comm), wrong ? "WRONG" : "verified", wrong, dt * 1e3);
    free(x);
    st = gcoll_comm_destroy(comm);
    return wrong || st != GCOLL_OK ? 1 : 0;
}
