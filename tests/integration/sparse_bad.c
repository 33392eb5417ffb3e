/* sparse_bad: a misbehaving peer in a sparse allreduce. Rank `victim` announces a wrong
 * dense size and sends indices beyond the real one (through the library's internal entry
 * that skips the local checks); every rank must fail with an error, none may crash or
 * write past its output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/sparse.h"
#include "api/sparse_api.h"

int main(int argc, char **argv)
{
    int victim = argc > 1 ? atoi(argv[1]) : 1;
    gcoll_comm_t *comm;
    if (gcoll_comm_init(&comm) != GCOLL_OK)
        return 1;
    int rank = gcoll_comm_rank(comm);
    enum { COUNT = 1000, NNZ = 50 };
    uint32_t idx[NNZ];
    float val[NNZ];
    for (int i = 0; i < NNZ; i++) {
        idx[i] = (uint32_t)(rank == victim ? COUNT + 10 * i : 7 * i);
        val[i] = 1.0f;
    }
    /* a guard after the output catches a write past it */
    float *out = malloc((COUNT + 16) * sizeof(float));
    for (int i = 0; i < COUNT + 16; i++)
        out[i] = -7.0f;
    gcoll_status_t st = gcoll_sparse_submit(
        comm, idx, val, NNZ, COUNT, out, GCOLL_SUM,
        rank == victim ? GCOLL_SPARSE_NOCHECK | GCOLL_SPARSE_BADCOUNT : 0, NULL);
    int bad = 0;
    for (int i = COUNT; i < COUNT + 16; i++)
        bad |= out[i] != -7.0f;
    printf("rank %d: sparse allreduce with a misbehaving rank %d: %s | %s%s\n", rank, victim,
           gcoll_status_string(st), gcoll_comm_last_error(comm), bad ? " | GUARD OVERWRITTEN" : "");
    free(out);
    gcoll_comm_destroy(comm);
    return st != GCOLL_OK && !bad ? 0 : 1;
}
