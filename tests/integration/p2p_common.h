/* p2p_common.h: what p2p_check.c and anysrc_check.c share: CHECK, which counts a failure in
 * the includer's `failures` and prints it with the program's name (CHECK_PROG), the rank
 * and gcoll_last_error(); and a monotonic clock in seconds. */
#ifndef GCOLL_P2P_COMMON_H
#define GCOLL_P2P_COMMON_H

#include <stdio.h>
#include <time.h>

#include "gcoll.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s rank %d: FAIL: ", CHECK_PROG, rank);                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", gcoll_last_error());                                        \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif /* GCOLL_P2P_COMMON_H */
