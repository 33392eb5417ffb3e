/* ticks.h: a cheap clock for timing calls, never for deadlines (those read CLOCK_MONOTONIC,
 * gcoll_time_ns). On x86-64 it is the CPU's time-stamp counter when the kernel itself keeps
 * time by it (clocksource "tsc": the kernel has found it constant-rate and in step across
 * CPUs); elsewhere, and on any other CPU, it is gcoll_time_ns. Why: every call is timed at
 * its start and end (the ns_total counter), and on this VM a clock_gettime costs 22 ns
 * against 10 for rdtsc, a fifth of a blocking 8 B reduce over shared memory. */
#ifndef GCOLL_TICKS_H
#define GCOLL_TICKS_H

#include <stdint.h>

#include "base/util.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* Nonzero when gcoll_ticks reads the TSC (after gcoll_ticks_init). */
extern int gcoll_ticks_tsc;

/* Decides the source, and calibrates the TSC against CLOCK_MONOTONIC (about 0.2 ms, once
 * per process; thread safe). Until it has run, gcoll_ticks is gcoll_time_ns. */
void gcoll_ticks_init(void);

static inline uint64_t gcoll_ticks(void)
{
#if defined(__x86_64__)
    if (gcoll_ticks_tsc)
        return __rdtsc();
#endif
    return gcoll_time_ns();
}

/* A difference of gcoll_ticks in nanoseconds. */
uint64_t gcoll_ticks_to_ns(uint64_t ticks);

#endif
