/* fuzz_log_stub.c: silent logging for fuzz builds (malformed input is logged on every call). */
#include "base/log.h"

int gcoll_log_level_g = GCOLL_LOG_NONE;
unsigned gcoll_log_subsys_g = 0;

void gcoll_log_init(void) {}
void gcoll_log_set_rank(int rank)
{
    (void)rank;
}
void gcoll_log_write(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
{
    (void)level;
    (void)subsys;
    (void)file;
    (void)line;
    (void)fmt;
}
void gcoll_log_trace_status(const char *file, int line, gcoll_status_t st)
{
    (void)file;
    (void)line;
    (void)st;
}
