/* ticks.c: the time-stamp counter as a clock for timing, calibrated against CLOCK_MONOTONIC. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/ticks.h"

int gcoll_ticks_tsc;
static double ns_per_tick = 1.0;
static pthread_once_t once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
/* A (monotonic ns, TSC) pair read close together: the pair of 5 whose TSC reads, taken
 * either side of the clock read, are nearest (a preempted read is not used). */
static void pair(uint64_t *ns, uint64_t *tsc)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t a = __rdtsc(), n = gcoll_time_ns(), b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *ns = n;
            *tsc = a + (b - a) / 2;
        }
    }
}

static int kernel_uses_tsc(void)
{
    char src[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f)
        return 0;
    int ok = fgets(src, sizeof(src), f) != NULL;
    fclose(f);
    return ok && strncmp(src, "tsc\n", 4) == 0;
}
#endif

static void init_once(void)
{
#if defined(__x86_64__)
    if (!kernel_uses_tsc())
        return;
    uint64_t ns0 = 0, tsc0 = 0, ns1 = 0, tsc1 = 0;
    pair(&ns0, &tsc0);
    /* 200 us: a read's uncertainty (tens of ns) is then 1e-4 of the interval */
    do
        pair(&ns1, &tsc1);
    while (ns1 - ns0 < 200000u);
    if (tsc1 <= tsc0)
        return;
    ns_per_tick = (double)(ns1 - ns0) / (double)(tsc1 - tsc0);
    __atomic_store_n(&gcoll_ticks_tsc, 1, __ATOMIC_RELEASE);
#endif
}

void gcoll_ticks_init(void)
{
    pthread_once(&once, init_once);
}

uint64_t gcoll_ticks_to_ns(uint64_t ticks)
{
    return gcoll_ticks_tsc ? (uint64_t)((double)ticks * ns_per_tick) : ticks;
}
