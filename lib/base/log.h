/* log.h: leveled, subsystem-masked logging to stderr or GCOLL_DEBUG_FILE, rank-prefixed. */
#ifndef GCOLL_LOG_H
#define GCOLL_LOG_H

#include "gcoll.h"

typedef enum {
    GCOLL_LOG_NONE = 0,
    GCOLL_LOG_WARN = 1,
    GCOLL_LOG_INFO = 2,
    GCOLL_LOG_DEBUG = 3,
    GCOLL_LOG_TRACE = 4
} gcoll_log_level_t;

enum {
    GCOLL_SUBSYS_INIT = 1u << 0,
    GCOLL_SUBSYS_NET = 1u << 1,
    GCOLL_SUBSYS_COLL = 1u << 2,
    GCOLL_SUBSYS_COMPRESS = 1u << 3,
    GCOLL_SUBSYS_ADAPT = 1u << 4,
    GCOLL_SUBSYS_ALL = 0xffffffffu
};

extern int gcoll_log_level_g;
extern unsigned gcoll_log_subsys_g;

/* Reads GCOLL_DEBUG, GCOLL_DEBUG_SUBSYS, GCOLL_DEBUG_FILE once (idempotent, thread safe). */
void gcoll_log_init(void);
/* Sets the rank shown in the line prefix (-1: unknown). */
void gcoll_log_set_rank(int rank);
void gcoll_log_write(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void gcoll_log_trace_status(const char *file, int line, gcoll_status_t st);
/* Sets the calling thread's gcoll_last_error(). Every GCOLL_WARN does, whatever the log
 * level (GCOLL_DEBUG=none loses nothing); a failed call's status path does too. */
void gcoll_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define GCOLL_LOG_ON(level, subsys)                                                                \
    (gcoll_log_level_g >= (level) && (gcoll_log_subsys_g & (subsys)))

#define GCOLL_WARN(...)                                                                            \
    gcoll_log_write(GCOLL_LOG_WARN, GCOLL_SUBSYS_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define GCOLL_INFO(subsys, ...)                                                                    \
    do {                                                                                           \
        if (GCOLL_LOG_ON(GCOLL_LOG_INFO, subsys))                                                  \
            gcoll_log_write(GCOLL_LOG_INFO, subsys, __FILE__, __LINE__, __VA_ARGS__);              \
    } while (0)
#define GCOLL_DEBUG(subsys, ...)                                                                   \
    do {                                                                                           \
        if (GCOLL_LOG_ON(GCOLL_LOG_DEBUG, subsys))                                                 \
            gcoll_log_write(GCOLL_LOG_DEBUG, subsys, __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)
#define GCOLL_TRACE(subsys, ...)                                                                   \
    do {                                                                                           \
        if (GCOLL_LOG_ON(GCOLL_LOG_TRACE, subsys))                                                 \
            gcoll_log_write(GCOLL_LOG_TRACE, subsys, __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)

#endif /* GCOLL_LOG_H */
