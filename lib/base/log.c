/* log.c: the logger behind GCOLL_WARN/INFO/DEBUG/TRACE; configured by GCOLL_DEBUG*. */
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/config.h"

int gcoll_log_level_g = GCOLL_LOG_WARN;
unsigned gcoll_log_subsys_g = GCOLL_SUBSYS_ALL;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;
static char log_host[64] = "?";
static int log_rank = -1;

static const char *const level_names[] = {"NONE", "WARN", "INFO", "DEBUG", "TRACE"};

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", GCOLL_SUBSYS_INIT},         {"NET", GCOLL_SUBSYS_NET},     {"COLL", GCOLL_SUBSYS_COLL},
    {"COMPRESS", GCOLL_SUBSYS_COMPRESS}, {"ADAPT", GCOLL_SUBSYS_ADAPT}, {"ALL", GCOLL_SUBSYS_ALL},
};

static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
        if (subsys_names[i].bit == subsys)
            return subsys_names[i].name;
    return "ALL";
}

int gcoll_log_parse_level(const char *s)
{
    for (int i = 0; i <= GCOLL_LOG_TRACE; i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

/* "INIT,NET" or "^COMPRESS" (all but); unknown names are an error. */
int gcoll_log_parse_subsys(const char *s, unsigned *mask_p)
{
    int invert = (*s == '^');
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s + invert);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t i;
        for (i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
            if (strcasecmp(tok, subsys_names[i].name) == 0)
                break;
        if (i == sizeof(subsys_names) / sizeof(subsys_names[0]))
            return -1;
        mask |= subsys_names[i].bit;
    }
    *mask_p = invert ? ~mask : mask;
    return 0;
}

/* Expands %h (host) and %p (pid) in GCOLL_DEBUG_FILE, as NCCL_DEBUG_FILE does. */
static void open_log_file(const char *pattern)
{
    char path[1024];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 32 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    log_file = fopen(path, "a");
    if (log_file == NULL)
        fprintf(stderr, "gcoll WARN cannot open GCOLL_DEBUG_FILE '%s': %s; logging to stderr\n",
                path, strerror(errno));
    else
        setvbuf(log_file, NULL, _IOLBF, 0);
}

static void log_init_once(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    log_host[sizeof(log_host) - 1] = '\0';
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *lvl = getenv("GCOLL_DEBUG");
    if (lvl && *lvl) {
        int l = gcoll_log_parse_level(lvl);
        if (l < 0)
            fprintf(stderr,
                    "gcoll WARN GCOLL_DEBUG='%s' is not one of none|warn|info|debug|trace;"
                    " using warn\n",
                    lvl);
        else
            gcoll_log_level_g = l;
    }
    const char *sub = getenv("GCOLL_DEBUG_SUBSYS");
    if (sub && *sub && gcoll_log_parse_subsys(sub, &gcoll_log_subsys_g) != 0) {
        fprintf(stderr,
                "gcoll WARN GCOLL_DEBUG_SUBSYS='%s' names an unknown subsystem"
                " (INIT,NET,COLL,COMPRESS,ADAPT,ALL); logging all\n",
                sub);
        gcoll_log_subsys_g = GCOLL_SUBSYS_ALL;
    }
    const char *file = getenv("GCOLL_DEBUG_FILE");
    if (file && *file)
        open_log_file(file);
}

void gcoll_log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void gcoll_log_set_rank(int rank)
{
    gcoll_log_init();
    log_rank = rank;
}

/* The calling thread's last error or warning, as NCCL's ncclGetLastError(NULL). */
static _Thread_local char last_error[2048];

void gcoll_set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

const char *gcoll_last_error(void)
{
    return last_error;
}

void gcoll_log_write(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
{
    gcoll_log_init();
    int shown = level <= gcoll_log_level_g && (gcoll_log_subsys_g & subsys);
    if (!shown && level != GCOLL_LOG_WARN)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == GCOLL_LOG_WARN)
        snprintf(last_error, sizeof(last_error), "%s", msg);
    if (!shown)
        return;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char rank[16];
    if (log_rank >= 0)
        snprintf(rank, sizeof(rank), "%d", log_rank);
    else
        snprintf(rank, sizeof(rank), "?");
    pthread_mutex_lock(&log_lock);
    FILE *out = log_file ? log_file : stderr;
    if (level >= GCOLL_LOG_DEBUG)
        fprintf(out, "%s:%d [%s] gcoll %s %s %s:%d %s\n", log_host, (int)getpid(), rank,
                level_names[level], subsys_name(subsys), base, line, msg);
    else
        fprintf(out, "%s:%d [%s] gcoll %s %s\n", log_host, (int)getpid(), rank, level_names[level],
                msg);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
}

void gcoll_log_trace_status(const char *file, int line, gcoll_status_t st)
{
    if (GCOLL_LOG_ON(GCOLL_LOG_TRACE, GCOLL_SUBSYS_ALL))
        gcoll_log_write(GCOLL_LOG_TRACE, GCOLL_SUBSYS_ALL, file, line, "-> %s",
                        gcoll_status_string(st));
}
