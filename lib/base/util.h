/* util.h: internal helpers shared by every layer: status propagation, time, bounds. */
#ifndef GCOLL_UTIL_H
#define GCOLL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "gcoll.h"
#include "base/log.h"

#define GCOLL_UNUSED __attribute__((unused))
#define GCOLL_LIKELY(x) __builtin_expect(!!(x), 1)
#define GCOLL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GCOLL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GCOLL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GCOLL_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define GCOLL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Propagate a failing status, logging where it passed through (as NCCL's NCCLCHECK). */
#define GCOLL_CHECK(call)                                                                          \
    do {                                                                                           \
        gcoll_status_t _st = (call);                                                               \
        if (GCOLL_UNLIKELY(_st < 0)) {                                                             \
            gcoll_log_trace_status(__FILE__, __LINE__, _st);                                       \
            return _st;                                                                            \
        }                                                                                          \
    } while (0)

/* Store a failing status in st and jump to a cleanup label named after what it undoes. */
#define GCOLL_CHECK_GOTO(call, st, label)                                                          \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if (GCOLL_UNLIKELY((st) < 0)) {                                                            \
            gcoll_log_trace_status(__FILE__, __LINE__, (st));                                      \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Monotonic clock in nanoseconds / milliseconds. */
static inline uint64_t gcoll_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t gcoll_time_ms(void)
{
    return gcoll_time_ns() / 1000000ull;
}

/* Milliseconds left until deadline_ms (monotonic), clamped to [0, cap_ms]. */
static inline int gcoll_ms_left(uint64_t deadline_ms, int cap_ms)
{
    uint64_t now = gcoll_time_ms();
    if (now >= deadline_ms)
        return 0;
    uint64_t left = deadline_ms - now;
    return left > (uint64_t)cap_ms ? cap_ms : (int)left;
}

/* a * b without overflow; returns 0 and sets *out on success, -1 on overflow. */
static inline int gcoll_mul_size(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Little-endian load/store helpers for wire formats (host is little-endian on every
 * platform we build for, but the helpers keep the intent visible and unaligned-safe). */
static inline void gcoll_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void gcoll_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void gcoll_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t gcoll_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t gcoll_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t gcoll_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif /* GCOLL_UTIL_H */
