/* run.h: what gcoll-run's parts share: limits, exit codes, the job's state, and its helpers. */
#ifndef GCOLL_RUN_H
#define GCOLL_RUN_H

#ifdef HAVE_CONFIG_H
#include "base/config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, environ */
#endif

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>

#ifdef PACKAGE_VERSION
#define GRUN_VERSION PACKAGE_VERSION
#else
#define GRUN_VERSION "0.1.0"
#endif

#define GRUN_MAX_RANKS 1024
/* Longer lines are split so a rank that never writes '\n' cannot make us buffer without bound. */
#define GRUN_LINE_MAX (64 * 1024)
#define GRUN_OUT_CAP (4 * GRUN_LINE_MAX)
#define GRUN_KEY_BYTES 32
#define GRUN_NOTE_MAX 8192
#define GRUN_ROOT_MAX 256
/* Lets a rank's children that are exiting with it be reaped before we call them leftovers. */
#define GRUN_SETTLE_MS 200
/* A rank that exited with status 0 while the others still run that long after is reported
 * (they may be waiting for it); rank exits a moment apart are normal. */
#define GRUN_EARLY_MS 3000
/* After SIGKILL only uninterruptible sleep delays exit; do not wait on it forever. */
#define GRUN_KILL_WAIT_MS 5000
/* Descendants of a killed process become our children (subreaper) and need their own SIGKILL. */
#define GRUN_SWEEP_MS 100
/* Bounds the wait for EOF when a pipe outlives every process we know of (fd passed elsewhere). */
#define GRUN_DRAIN_MS 1000

enum {
    GRUN_EXIT_USAGE = 2,
    GRUN_EXIT_TIMEOUT = 124,
    GRUN_EXIT_INTERNAL = 125,
    GRUN_EXIT_NOEXEC = 127,
};

struct rank_env {
    int rank;
    const char *kv; /* VAR=VALUE, points into argv */
};

struct opts {
    int nranks;
    const char **xenv; /* VAR=VALUE from -x, pointing into argv */
    size_t nxenv;
    struct rank_env *renv;
    size_t nrenv;
    const char *root;
    bool key_from_env, keep_going, quiet;
    bool no_bind;     /* --bind none */
    double timeout_s; /* 0: none */
    double grace_s;
    char **prog_argv;
};

struct stream {
    int fd;     /* read end of the rank's stdout or stderr pipe; -1 once closed */
    int dest;   /* index into job.out */
    bool split; /* the last line was cut at GRUN_LINE_MAX: a '\n' right after ends it */
    size_t len, cap;
    char *buf; /* partial line carried over between reads */
};

enum rank_state { RANK_UNSTARTED, RANK_RUNNING, RANK_EXITED };

struct rank {
    pid_t pid;
    enum rank_state state;
    struct stream streams[2];
};

struct outbuf {
    int fd;
    bool broken; /* a write failed: output for this fd is dropped from now on */
    size_t len;
    char data[GRUN_OUT_CAP];
};

enum phase { PHASE_RUNNING, PHASE_TERMINATING, PHASE_KILLING };

struct job {
    const struct opts *o;
    struct rank *ranks;
    struct pollfd *pfds;
    struct stream **pstreams; /* pfds[i + 1] belongs to pstreams[i] */
    int *prank;
    pid_t self;
    int sigfd, devnull;
    sigset_t orig_mask;
    struct sigaction orig_chld;
    struct rlimit orig_nofile;
    enum phase phase;
    uint64_t timeout_deadline, grace_deadline, kill_deadline, next_sweep;
    uint64_t strays_deadline, drain_deadline; /* 0: not armed */
    bool children_left;                       /* the last waitpid(-1) found unreaped children */
    bool timed_out;
    int early_rank;          /* first rank that exited 0 with others running; -1: none */
    uint64_t early_deadline; /* when to report it if the others still run; 0: reported */
    int abort_code;          /* signal, launch failure or broken stdout: beats everything else */
    int fail_code;           /* first failing rank's status */
    char root[GRUN_ROOT_MAX];
    int ncpus; /* CPUs the ranks are bound to, one each in order; 0: not bound */
    int *cpus;
    char kv_rank[40], kv_local_rank[40], kv_size[40], kv_local_size[40];
    char kv_root[GRUN_ROOT_MAX + 16], kv_key[sizeof "GCOLL_JOB_KEY=" + 2 * GRUN_KEY_BYTES];
    /* torch.distributed's env:// (as torchrun sets them), so a torch script runs unchanged */
    char kv_trank[40], kv_tlocal_rank[40], kv_tsize[40], kv_tlocal_size[40];
    char kv_maddr[GRUN_ROOT_MAX + 16], kv_mport[40];
    struct outbuf out[2];
    char scratch[GRUN_LINE_MAX];
};

static inline uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline uint64_t sec_to_ms(double s)
{
    return (uint64_t)(s * 1000.0 + 0.5);
}

/* output.c: the line-prefixed relay of the ranks' output, and gcoll-run's own messages. */
void grun_note(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void grun_outbuf_flush(struct job *j, int dest);
bool grun_stream_read(struct job *j, int r, struct stream *s);
void grun_stream_close(struct job *j, int r, struct stream *s);

/* procs.c: preparing the job, spawning the ranks, signals, reaping and termination. */
int grun_prepare(struct job *j);
int grun_spawn_rank(struct job *j, int r);
bool grun_ranks_running(const struct job *j);
const char *grun_format_running(const struct job *j, char *buf, size_t cap);
void grun_signal_all(struct job *j, int sig);
void grun_begin_termination(struct job *j);
void grun_escalate(struct job *j, bool grace_over);
void grun_reap(struct job *j);
void grun_handle_signals(struct job *j);

#endif /* GCOLL_RUN_H */
