/* two_comms: two communicators in one process (as a torch job has one per process group),
 * each created with gcoll_comm_init_rank at a rendezvous of its own, running large
 * allreduces in turn: iteration i runs on the first, then on the second. Every result is
 * checked (each rank adds rank + 1 + i + which, so element k sums to
 * P(P+1)/2 + P(i + which), exact in float32). A rank that finished on one communicator
 * while a peer still needed an answer from it there must still let that peer finish
 * (transport flush at the end of an operation).
 *   two_comms COUNT ITERS    (GCOLL_RANK, GCOLL_SIZE and GCOLL_ROOT = host:port; the
 *                             communicators meet at port + 1 and port + 2)
 * Exit status 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcoll.h"

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)4 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    const char *rv = getenv("GCOLL_RANK"), *sv = getenv("GCOLL_SIZE"), *root = getenv("GCOLL_ROOT");
    char host[256];
    int port;
    if (!rv || !sv || !root || sscanf(root, "%255[^:]:%d", host, &port) != 2) {
        fprintf(stderr, "two_comms: set GCOLL_RANK, GCOLL_SIZE and GCOLL_ROOT=host:port\n");
        return 2;
    }
    int rank = atoi(rv), size = atoi(sv);
    gcoll_comm_t *c[2];
    for (int w = 0; w < 2; w++) {
        char r[300];
        snprintf(r, sizeof(r), "%s:%d", host, port + 1 + w);
        if (gcoll_comm_init_rank(size, rank, r, &c[w]) != GCOLL_OK) {
            fprintf(stderr, "two_comms rank %d: init of communicator %d failed: %s\n", rank, w,
                    gcoll_last_error());
            return 1;
        }
    }
    float *x = malloc(n * sizeof(float));
    if (!x)
        return 2;
    int bad = 0;
    for (int i = 0; i < iters && !bad; i++)
        for (int w = 0; w < 2 && !bad; w++) {
            for (size_t k = 0; k < n; k++)
                x[k] = (float)(rank + 1 + i + w);
            gcoll_status_t st = gcoll_allreduce(c[w], x, x, n, GCOLL_FLOAT32, GCOLL_SUM);
            if (st != GCOLL_OK) {
                fprintf(stderr, "two_comms rank %d: iteration %d, communicator %d: %s\n", rank, i,
                        w, gcoll_comm_last_error(c[w]));
                bad = 1;
                break;
            }
            float want = (float)(size * (size + 1) / 2 + size * (i + w));
            for (size_t k = 0; k < n; k++)
                if (x[k] != want) {
                    fprintf(stderr,
                            "two_comms rank %d: iteration %d, communicator %d: [%zu] = %g, "
                            "want %g\n",
                            rank, i, w, k, (double)x[k], (double)want);
                    bad = 1;
                    break;
                }
        }
    char tp[32];
    snprintf(tp, sizeof(tp), "%s", gcoll_comm_transport(c[0]));
    for (int w = 0; w < 2; w++)
        if (gcoll_comm_destroy(c[w]) != GCOLL_OK && !bad) {
            fprintf(stderr, "two_comms rank %d: destroy of communicator %d failed\n", rank, w);
            bad = 1;
        }
    free(x);
    if (!bad)
        printf("two_comms rank %d: %d iterations of %zu floats on 2 communicators over %s: ok\n",
               rank, iters, n, tp);
    return bad;
}
