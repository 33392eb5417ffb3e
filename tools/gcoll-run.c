/* gcoll-run.c: starts N local ranks of a program, tags their output, stops them together. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, environ */
#endif

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static const char usage_text[] =
    "Usage: gcoll-run -n N [options] [--] prog [args...]\n"
    "\n"
    "Start N local ranks of prog for a gcoll job, copy their output tagged with the rank,\n"
    "and stop all of them as soon as one fails.\n"
    "\n"
    "Options:\n"
    "  -n, --nranks N          number of ranks, 1 to 1024 (required)\n"
    "  -x VAR=VALUE            set VAR for every rank (repeatable)\n"
    "      --rank-env R:VAR=VALUE\n"
    "                          set VAR for rank R only (repeatable), e.g. to inject a fault\n"
    "      --root HOST:PORT    rendezvous address (default 127.0.0.1 and a free port)\n"
    "      --key-from-env      pass on GCOLL_JOB_KEY from the environment instead of\n"
    "                          generating a fresh key\n"
    "      --timeout SEC       stop the job after SEC seconds and exit with status 124\n"
    "      --grace SEC         wait SEC seconds between SIGTERM and SIGKILL (default 3)\n"
    "      --keep-going        do not stop the other ranks when one fails; report each failure\n"
    "  -q, --quiet             do not prefix output lines with \"[rank] \"\n"
    "  -h, --help              show this help and exit\n"
    "  -V, --version           show the version and exit\n"
    "\n"
    "Environment of each rank: gcoll-run's own, plus\n"
    "  GCOLL_RANK, GCOLL_LOCAL_RANK   the rank, 0 to N-1\n"
    "  GCOLL_SIZE, GCOLL_LOCAL_SIZE   N\n"
    "  GCOLL_ROOT                     HOST:PORT where rank 0 listens for the others\n"
    "  GCOLL_JOB_KEY                  32 random bytes in hex, the same for every rank\n"
    "then -x and then --rank-env, each of which may override what came before.\n"
    "\n"
    "Each rank runs in its own process group with stdin from /dev/null. Every line it\n"
    "writes to stdout or stderr is copied to gcoll-run's stdout or stderr, prefixed with\n"
    "\"[rank] \"; lines longer than 64 KiB are split and a last line without a newline gets one.\n"
    "\n"
    "When a rank exits with a non-zero status or is killed by a signal, gcoll-run reports it,\n"
    "sends SIGTERM to the other ranks and SIGKILL to those still running after the grace\n"
    "period. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to gcoll-run stop the job the same way;\n"
    "a second one skips the grace period. Processes that ranks leave behind are stopped too.\n"
    "\n"
    "Exit status:\n"
    "  0        every rank exited with status 0\n"
    "  1-255    status of the first rank that failed (128+S if killed by signal S)\n"
    "  2        usage error\n"
    "  124      the --timeout expired\n"
    "  125      gcoll-run itself failed (e.g. fork)\n"
    "  127      prog could not be executed\n"
    "  128+S    gcoll-run got signal S (130 for SIGINT, 143 for SIGTERM), or 141 if its\n"
    "           stdout was closed\n"
    "When several apply, a signal, a closed stdout or a launch failure wins over a timeout,\n"
    "and a timeout over a failed rank. A rank's own status can equal one of these codes;\n"
    "the message on stderr tells them apart.\n"
    "\n"
    "Example:\n"
    "  gcoll-run -n 4 --timeout 60 --rank-env 2:GCOLL_TEST_FAULT=crash ./test-allreduce\n";

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
    double timeout_s; /* 0: none */
    double grace_s;
    char **prog_argv;
};

struct stream {
    int fd; /* read end of the rank's stdout or stderr pipe; -1 once closed */
    int dest; /* index into job.out */
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

/* What the child writes to the report pipe when it cannot exec; nothing when it can. */
struct child_report {
    int stage;
    int err;
};

enum { STAGE_EXEC, STAGE_SETPGID, STAGE_PDEATHSIG, STAGE_DUP2, STAGE_RLIMIT };
static const char *const stage_names[] = {"exec", "setpgid", "prctl", "dup2", "setrlimit"};

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
    bool children_left; /* the last waitpid(-1) found unreaped children */
    bool timed_out;
    int abort_code; /* signal, launch failure or broken stdout: beats everything else */
    int fail_code; /* first failing rank's status */
    char root[GRUN_ROOT_MAX];
    char kv_rank[40], kv_local_rank[40], kv_size[40], kv_local_size[40];
    char kv_root[GRUN_ROOT_MAX + 16], kv_key[sizeof "GCOLL_JOB_KEY=" + 2 * GRUN_KEY_BYTES];
    struct outbuf out[2];
    char scratch[GRUN_LINE_MAX];
};

static void note(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void begin_termination(struct job *j);

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t sec_to_ms(double s) { return (uint64_t)(s * 1000.0 + 0.5); }

/* Returns 0 or an errno value. Copes with a stdout someone else left non-blocking. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            (void)poll(&pfd, 1, -1);
        } else if (!(w < 0 && errno == EINTR)) {
            return w < 0 ? errno : EIO;
        }
    }
    return 0;
}

static void outbuf_flush(struct job *j, int dest)
{
    struct outbuf *ob = &j->out[dest];
    if (ob->len == 0 || ob->broken) {
        ob->len = 0;
        return;
    }
    int err = write_all(ob->fd, ob->data, ob->len);
    ob->len = 0;
    if (err == 0)
        return;
    ob->broken = true;
    if (dest != 0)
        return; /* nowhere left to complain about stderr */
    /* Behave like a process in a pipeline whose reader went away, but take the ranks along. */
    note(j, "cannot write to stdout: %s; stopping the job", strerror(err));
    if (!j->abort_code)
        j->abort_code = err == EPIPE ? 128 + SIGPIPE : GRUN_EXIT_INTERNAL;
    if (j->phase == PHASE_RUNNING)
        begin_termination(j);
}

/* Messages from gcoll-run itself; flushing first keeps them after the rank output they follow. */
static void note(struct job *j, const char *fmt, ...)
{
    char msg[GRUN_NOTE_MAX];
    size_t n = (size_t)snprintf(msg, sizeof msg, "gcoll-run: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg + n, sizeof msg - n - 1, fmt, ap);
    va_end(ap);
    if (m > 0)
        n += (size_t)m < sizeof msg - n - 1 ? (size_t)m : sizeof msg - n - 2;
    msg[n++] = '\n';
    if (j) {
        outbuf_flush(j, 0);
        outbuf_flush(j, 1);
    }
    (void)write_all(STDERR_FILENO, msg, n);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    note(NULL, "%s\nTry 'gcoll-run --help' for more information.", msg);
    return GRUN_EXIT_USAGE;
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_seconds(const char *s, bool allow_zero, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* The upper bound keeps deadlines in milliseconds far from overflow. */
    if (errno || end == s || *end || !isfinite(v) || v < 0 || (v == 0 && !allow_zero) || v > 1e7)
        return false;
    *out = v;
    return true;
}

/* Accepts VAR=VALUE with VAR a portable shell name, so typos fail here rather than in a rank. */
static bool valid_assignment(const char *kv)
{
    const char *p = kv;
    if (!(*p == '_' || (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z')))
        return false;
    while (*p == '_' || (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
           (*p >= '0' && *p <= '9'))
        p++;
    return *p == '=';
}

static bool valid_root(const char *s)
{
    const char *colon = strrchr(s, ':');
    long port;
    return colon && colon != s && parse_int(colon + 1, 1, 65535, &port);
}

enum { OPT_RANK_ENV = 256, OPT_ROOT, OPT_KEY_FROM_ENV, OPT_TIMEOUT, OPT_GRACE, OPT_KEEP_GOING };

/* Returns -1 to go on, or the exit status to end with (0 after --help or --version). */
static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option longopts[] = {
        {"nranks", required_argument, NULL, 'n'},
        {"rank-env", required_argument, NULL, OPT_RANK_ENV},
        {"root", required_argument, NULL, OPT_ROOT},
        {"key-from-env", no_argument, NULL, OPT_KEY_FROM_ENV},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"grace", required_argument, NULL, OPT_GRACE},
        {"keep-going", no_argument, NULL, OPT_KEEP_GOING},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    long v;
    int c;

    o->grace_s = 3.0;
    opterr = 0;
    /* '+': options end at prog, so its own options are left alone. */
    while ((c = getopt_long(argc, argv, "+:n:x:qhV", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (!parse_int(optarg, LONG_MIN, LONG_MAX, &v))
                return usage_error("-n expects a number of ranks, got '%s'", optarg);
            if (v < 1 || v > GRUN_MAX_RANKS)
                return usage_error("-n must be between 1 and %d, got %ld", GRUN_MAX_RANKS, v);
            o->nranks = (int)v;
            break;
        case 'x': {
            if (!valid_assignment(optarg))
                return usage_error("-x expects VAR=VALUE, got '%s'", optarg);
            const char **nx = realloc(o->xenv, (o->nxenv + 1) * sizeof *nx);
            if (!nx)
                return usage_error("out of memory");
            o->xenv = nx;
            o->xenv[o->nxenv++] = optarg;
            break;
        }
        case OPT_RANK_ENV: {
            char *colon = strchr(optarg, ':');
            if (!colon || !valid_assignment(colon + 1))
                return usage_error("--rank-env expects R:VAR=VALUE, got '%s'", optarg);
            *colon = '\0';
            bool ok = parse_int(optarg, 0, GRUN_MAX_RANKS - 1, &v);
            *colon = ':';
            if (!ok)
                return usage_error("--rank-env expects R:VAR=VALUE with R a rank, got '%s'",
                                   optarg);
            struct rank_env *nr = realloc(o->renv, (o->nrenv + 1) * sizeof *nr);
            if (!nr)
                return usage_error("out of memory");
            o->renv = nr;
            o->renv[o->nrenv++] = (struct rank_env){.rank = (int)v, .kv = colon + 1};
            break;
        }
        case OPT_ROOT:
            if (!valid_root(optarg) || strlen(optarg) >= GRUN_ROOT_MAX)
                return usage_error("--root expects HOST:PORT, got '%s'", optarg);
            o->root = optarg;
            break;
        case OPT_KEY_FROM_ENV:
            o->key_from_env = true;
            break;
        case OPT_TIMEOUT:
            if (!parse_seconds(optarg, false, &o->timeout_s))
                return usage_error("--timeout expects a positive number of seconds, got '%s'",
                                   optarg);
            break;
        case OPT_GRACE:
            if (!parse_seconds(optarg, true, &o->grace_s))
                return usage_error("--grace expects a number of seconds, got '%s'", optarg);
            break;
        case OPT_KEEP_GOING:
            o->keep_going = true;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return fflush(stdout) == 0 ? 0 : 1;
        case 'V':
            puts("gcoll-run (gcoll) " GRUN_VERSION);
            return fflush(stdout) == 0 ? 0 : 1;
        case ':':
            return usage_error("option '%s' needs an argument", argv[optind - 1]);
        default:
            if (optopt > 0 && optopt < 256)
                return usage_error("unknown option '-%c'", optopt);
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (o->nranks == 0)
        return usage_error("missing -n N, the number of ranks");
    if (optind >= argc)
        return usage_error("missing the program to run");
    for (size_t i = 0; i < o->nrenv; i++)
        if (o->renv[i].rank >= o->nranks)
            return usage_error("--rank-env names rank %d but there are only %d ranks",
                               o->renv[i].rank, o->nranks);
    if (o->key_from_env) {
        const char *k = getenv("GCOLL_JOB_KEY");
        if (!k || !*k)
            return usage_error("--key-from-env given but GCOLL_JOB_KEY is not set");
    }
    o->prog_argv = argv + optind;
    return -1;
}

/* Writes 2 * GRUN_KEY_BYTES hex digits and a NUL; returns 0 or an errno value. */
static int make_job_key(char *hex)
{
    static const char digits[] = "0123456789abcdef";
    unsigned char key[GRUN_KEY_BYTES];
    size_t got = 0;
    while (got < sizeof key) {
        ssize_t n = getrandom(key + got, sizeof key - got, 0);
        if (n < 0 && errno != EINTR)
            return errno;
        if (n > 0)
            got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof key; i++) {
        hex[2 * i] = digits[key[i] >> 4];
        hex[2 * i + 1] = digits[key[i] & 15];
    }
    hex[2 * sizeof key] = '\0';
    explicit_bzero(key, sizeof key); /* the key authenticates the job; leave no stray copy */
    return 0;
}

/*
 * Asks the kernel for a free loopback port and releases it for rank 0 to bind. Another
 * process could take it in between; handing rank 0 the bound socket would close that race
 * but would need an interface beyond GCOLL_ROOT.
 */
static int find_free_port(char *out, size_t cap)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int err = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len))
        err = errno;
    else
        snprintf(out, cap, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    close(fd);
    return err;
}

static bool same_name(const char *a, const char *b)
{
    while (*a && *a != '=' && *a == *b)
        a++, b++;
    return (*a == '=' || !*a) && (*b == '=' || !*b);
}

static bool overridden(const char *kv, const char *const *later, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (same_name(kv, later[i]))
            return true;
    return false;
}

/* Builds rank r's environment; strings are borrowed, only the array is allocated. */
static char **build_env(struct job *j, int r)
{
    const struct opts *o = j->o;
    size_t nov = 0, nenv = 0;
    for (char **e = environ; *e; e++)
        nenv++;
    const char **ov = malloc((6 + o->nxenv + o->nrenv) * sizeof *ov);
    char **envp = malloc((nenv + 6 + o->nxenv + o->nrenv + 1) * sizeof *envp);
    if (!ov || !envp) {
        free(ov);
        free(envp);
        return NULL;
    }
    snprintf(j->kv_rank, sizeof j->kv_rank, "GCOLL_RANK=%d", r);
    snprintf(j->kv_local_rank, sizeof j->kv_local_rank, "GCOLL_LOCAL_RANK=%d", r);
    /* In precedence order: later entries override earlier ones with the same name. */
    ov[nov++] = j->kv_rank;
    ov[nov++] = j->kv_size;
    ov[nov++] = j->kv_root;
    if (!o->key_from_env) /* otherwise the inherited GCOLL_JOB_KEY passes through */
        ov[nov++] = j->kv_key;
    ov[nov++] = j->kv_local_rank;
    ov[nov++] = j->kv_local_size;
    for (size_t i = 0; i < o->nxenv; i++)
        ov[nov++] = o->xenv[i];
    for (size_t i = 0; i < o->nrenv; i++)
        if (o->renv[i].rank == r)
            ov[nov++] = o->renv[i].kv;

    size_t n = 0;
    for (char **e = environ; *e; e++)
        if (!overridden(*e, ov, nov))
            envp[n++] = *e;
    for (size_t i = 0; i < nov; i++)
        if (!overridden(ov[i], ov + i + 1, nov - i - 1))
            envp[n++] = (char *)ov[i];
    envp[n] = NULL;
    free(ov);
    return envp;
}

/* Runs in the forked child: only async-signal-safe calls from here on. */
static void __attribute__((noreturn))
child_exec(const struct job *j, char **envp, int out_fd, int err_fd, int report_fd)
{
    struct child_report rep = {.stage = STAGE_SETPGID};

    sigaction(SIGCHLD, &j->orig_chld, NULL);
    sigprocmask(SIG_SETMASK, &j->orig_mask, NULL);
    /* Own group: one kill() reaches what the rank forks, and a terminal ^C reaches only us. */
    if (setpgid(0, 0))
        goto fail;
    /* If gcoll-run dies without cleaning up (SIGKILL), the rank must not outlive it. */
    rep.stage = STAGE_PDEATHSIG;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL))
        goto fail;
    if (getppid() != j->self)
        _exit(GRUN_EXIT_INTERNAL);
    rep.stage = STAGE_RLIMIT;
    if (setrlimit(RLIMIT_NOFILE, &j->orig_nofile))
        goto fail;
    rep.stage = STAGE_DUP2;
    if (dup2(j->devnull, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
        dup2(err_fd, STDERR_FILENO) < 0)
        goto fail;
    /* execvp looks PATH up in environ, so -x PATH=... applies to finding prog too. */
    environ = envp;
    rep.stage = STAGE_EXEC;
    execvp(j->o->prog_argv[0], j->o->prog_argv);
fail:
    rep.err = errno;
    (void)!write(report_fd, &rep, sizeof rep);
    _exit(GRUN_EXIT_NOEXEC);
}

/* Returns 0, or the exit status gcoll-run should end with. */
static int spawn_rank(struct job *j, int r)
{
    int outp[2], errp[2], repp[2];
    struct child_report rep;
    int ret = GRUN_EXIT_INTERNAL;
    ssize_t n;

    if (pipe2(outp, O_CLOEXEC)) {
        note(j, "pipe: %s", strerror(errno));
        return ret;
    }
    if (pipe2(errp, O_CLOEXEC)) {
        note(j, "pipe: %s", strerror(errno));
        goto close_out;
    }
    /* CLOEXEC: EOF on the read end means exec succeeded, a report means it did not. */
    if (pipe2(repp, O_CLOEXEC)) {
        note(j, "pipe: %s", strerror(errno));
        goto close_err;
    }
    char **envp = build_env(j, r);
    if (!envp) {
        note(j, "out of memory");
        goto close_rep;
    }
    pid_t pid = fork();
    if (pid == 0)
        child_exec(j, envp, outp[1], errp[1], repp[1]);
    free(envp);
    if (pid < 0) {
        note(j, "cannot start rank %d: fork: %s", r, strerror(errno));
        goto close_rep;
    }
    close(repp[1]);
    repp[1] = -1;
    /* Blocking is fine: the child reaches exec or its error within microseconds. */
    do
        n = read(repp[0], &rep, sizeof rep);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof rep) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        if (rep.stage == STAGE_EXEC) {
            note(j, "cannot execute '%s': %s", j->o->prog_argv[0], strerror(rep.err));
            ret = GRUN_EXIT_NOEXEC;
        } else {
            note(j, "cannot start rank %d: %s: %s", r, stage_names[rep.stage], strerror(rep.err));
        }
        goto close_rep;
    }
    close(repp[0]);
    close(outp[1]);
    close(errp[1]);
    /* Only our read ends are non-blocking: the rank's write ends must stay blocking. */
    fcntl(outp[0], F_SETFL, fcntl(outp[0], F_GETFL) | O_NONBLOCK);
    fcntl(errp[0], F_SETFL, fcntl(errp[0], F_GETFL) | O_NONBLOCK);
    j->ranks[r].pid = pid;
    j->ranks[r].state = RANK_RUNNING;
    j->ranks[r].streams[0].fd = outp[0];
    j->ranks[r].streams[1].fd = errp[0];
    return 0;

close_rep:
    close(repp[0]);
    if (repp[1] >= 0)
        close(repp[1]);
close_err:
    close(errp[0]);
    close(errp[1]);
close_out:
    close(outp[0]);
    close(outp[1]);
    return ret;
}

static void emit_line(struct job *j, int r, struct stream *s, const char *a, size_t alen,
                      const char *b, size_t blen)
{
    struct outbuf *ob = &j->out[s->dest];
    char prefix[16];
    size_t plen = j->o->quiet ? 0 : (size_t)snprintf(prefix, sizeof prefix, "[%d] ", r);
    if (ob->broken)
        return;
    if (ob->len + plen + alen + blen + 1 > sizeof ob->data)
        outbuf_flush(j, s->dest);
    memcpy(ob->data + ob->len, prefix, plen);
    ob->len += plen;
    if (alen)
        memcpy(ob->data + ob->len, a, alen);
    ob->len += alen;
    if (blen)
        memcpy(ob->data + ob->len, b, blen);
    ob->len += blen;
    ob->data[ob->len++] = '\n';
}

/* Splits new data into lines; a line reaching GRUN_LINE_MAX is emitted as it stands. */
static bool stream_feed(struct job *j, int r, struct stream *s, const char *p, size_t n)
{
    while (n > 0) {
        /* A line of exactly GRUN_LINE_MAX bytes must not be followed by an empty one. */
        if (s->split) {
            s->split = false;
            if (*p == '\n') {
                p++;
                n--;
                continue;
            }
        }
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        size_t room = GRUN_LINE_MAX - s->len;
        if (take >= room) {
            emit_line(j, r, s, s->buf, s->len, p, room);
            s->len = 0;
            s->split = true;
            p += room;
            n -= room;
        } else if (nl) {
            emit_line(j, r, s, s->buf, s->len, p, take);
            s->len = 0;
            p += take + 1;
            n -= take + 1;
        } else {
            if (s->len + n > s->cap) {
                size_t cap = s->cap ? s->cap : 256;
                while (cap < s->len + n)
                    cap *= 2;
                char *nb = realloc(s->buf, cap);
                if (!nb)
                    return false;
                s->buf = nb;
                s->cap = cap;
            }
            memcpy(s->buf + s->len, p, n);
            s->len += n;
            n = 0;
        }
    }
    return true;
}

static void stream_close(struct job *j, int r, struct stream *s)
{
    if (s->len)
        emit_line(j, r, s, s->buf, s->len, NULL, 0);
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    close(s->fd);
    s->fd = -1;
}

/* Returns true if a further read may find more data right away. */
static bool stream_read(struct job *j, int r, struct stream *s)
{
    ssize_t n = read(s->fd, j->scratch, sizeof j->scratch);
    if (n > 0) {
        if (stream_feed(j, r, s, j->scratch, (size_t)n))
            return true;
        note(j, "out of memory buffering output of rank %d; dropping it", r);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return false;
    }
    stream_close(j, r, s);
    return false;
}

static void format_signal(int sig, bool core, char *buf, size_t cap)
{
    const char *name = strsignal(sig);
    snprintf(buf, cap, "killed by signal %d (%s)%s", sig, name ? name : "unknown",
             core ? " (core dumped)" : "");
}

/* "0 3 5-9": the runs keep the list readable at 1024 ranks. */
static const char *format_running(const struct job *j, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < j->o->nranks && n + 16 < cap;) {
        if (j->ranks[r].state != RANK_RUNNING) {
            r++;
            continue;
        }
        int e = r;
        while (e + 1 < j->o->nranks && j->ranks[e + 1].state == RANK_RUNNING)
            e++;
        if (e - r >= 2)
            n += (size_t)snprintf(buf + n, cap - n, "%s%d-%d", n ? " " : "", r, e);
        else
            for (int k = r; k <= e; k++)
                n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? " " : "", k);
        r = e + 1;
    }
    return buf;
}

static bool ranks_running(const struct job *j)
{
    for (int r = 0; r < j->o->nranks; r++)
        if (j->ranks[r].state == RANK_RUNNING)
            return true;
    return false;
}

static int rank_of_pid(const struct job *j, pid_t pid)
{
    for (int r = 0; r < j->o->nranks; r++)
        if (j->ranks[r].pid == pid && j->ranks[r].state == RANK_RUNNING)
            return r;
    return -1;
}

/*
 * Signals our unreaped children that are not running ranks: processes the ranks left behind,
 * handed to us because we are their subreaper. An unreaped child's pid cannot be reused, so
 * this cannot hit a stranger; a rank's group is signalled only while its leader is unreaped
 * for the same reason.
 */
static void signal_strays(struct job *j, int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        char path[64], buf[256], *end, *p;
        long pid = strtol(de->d_name, &end, 10), ppid;
        char state;
        if (*end || pid <= 0 || pid == j->self)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        /* comm may contain spaces and parentheses; the fields resume after the last ')'. */
        p = strrchr(buf, ')');
        if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2 || ppid != j->self)
            continue;
        if (rank_of_pid(j, (pid_t)pid) < 0)
            kill((pid_t)pid, sig);
    }
    closedir(d);
}

static void signal_all(struct job *j, int sig)
{
    for (int r = 0; r < j->o->nranks; r++)
        if (j->ranks[r].state == RANK_RUNNING && kill(-j->ranks[r].pid, sig) && errno == ESRCH)
            kill(j->ranks[r].pid, sig);
    signal_strays(j, sig);
}

static void begin_termination(struct job *j)
{
    j->phase = PHASE_TERMINATING;
    j->grace_deadline = now_ms() + sec_to_ms(j->o->grace_s);
    signal_all(j, SIGTERM);
}

/* grace_over: the grace period ran out, as opposed to being cut short on request. */
static void escalate(struct job *j, bool grace_over)
{
    char list[GRUN_NOTE_MAX - 256];
    uint64_t now = now_ms();
    if (grace_over) {
        if (ranks_running(j))
            note(j, "ranks still running %g s after SIGTERM: %s; sending SIGKILL", j->o->grace_s,
                 format_running(j, list, sizeof list));
        else
            note(j, "processes left by the ranks still running %g s after SIGTERM; sending SIGKILL",
                 j->o->grace_s);
    }
    j->phase = PHASE_KILLING;
    j->kill_deadline = now + GRUN_KILL_WAIT_MS;
    j->next_sweep = now + GRUN_SWEEP_MS;
    signal_all(j, SIGKILL);
}

static void drain_rank(struct job *j, int r)
{
    for (int i = 0; i < 2; i++) {
        struct stream *s = &j->ranks[r].streams[i];
        /* Bounded: a leftover process may keep the pipe busy forever. */
        for (int k = 0; k < 64 && s->fd >= 0 && stream_read(j, r, s); k++)
            ;
    }
}

static void rank_exited(struct job *j, int r, int wstatus)
{
    char what[128], list[GRUN_NOTE_MAX - 256];
    int code;

    j->ranks[r].state = RANK_EXITED;
    /* Show what the rank printed before it died ahead of the news of its death. */
    drain_rank(j, r);
    if (WIFEXITED(wstatus)) {
        code = WEXITSTATUS(wstatus);
        snprintf(what, sizeof what, "exited with status %d", code);
    } else {
        code = 128 + WTERMSIG(wstatus);
        format_signal(WTERMSIG(wstatus), WCOREDUMP(wstatus), what, sizeof what);
    }
    /* Once we are stopping the job, deaths are our doing and not worth a line each. */
    if (code == 0 || j->phase != PHASE_RUNNING)
        return;
    note(j, "rank %d (pid %d) %s", r, (int)j->ranks[r].pid, what);
    if (!j->fail_code)
        j->fail_code = code;
    if (j->o->keep_going)
        return;
    if (ranks_running(j))
        note(j, "stopping the other ranks: %s", format_running(j, list, sizeof list));
    begin_termination(j);
}

static void reap(struct job *j)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            int r = rank_of_pid(j, pid);
            if (r >= 0)
                rank_exited(j, r, st);
            /* Anything else is a leftover we adopted as subreaper: reaping it is all. */
        } else if (pid == 0) {
            j->children_left = true;
            return;
        } else if (errno != EINTR) {
            j->children_left = false;
            return;
        }
    }
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGINT:
        return "SIGINT";
    case SIGTERM:
        return "SIGTERM";
    case SIGHUP:
        return "SIGHUP";
    case SIGQUIT:
        return "SIGQUIT";
    default:
        return "a signal";
    }
}

static void got_signal(struct job *j, int sig)
{
    if (j->phase == PHASE_RUNNING) {
        note(j, "got %s; stopping all ranks", signal_name(sig));
        if (!j->abort_code)
            j->abort_code = 128 + sig;
        begin_termination(j);
    } else if (j->phase == PHASE_TERMINATING) {
        note(j, "got %s again; killing all ranks", signal_name(sig));
        if (!j->abort_code)
            j->abort_code = 128 + sig;
        escalate(j, false);
    }
}

static void handle_signals(struct job *j)
{
    struct signalfd_siginfo si;
    bool chld = false;
    while (read(j->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD)
            chld = true;
        else
            got_signal(j, (int)si.ssi_signo);
    }
    if (chld)
        reap(j);
}

#define GRUN_DONE (-2)

/*
 * Acts on the deadlines that have passed. Returns the poll timeout until the next one that
 * matters now (-1: none), or GRUN_DONE when the job is over. A deadline is armed only while
 * its condition holds, or poll would spin on one already past.
 */
static int advance(struct job *j, int open_streams)
{
    char list[GRUN_NOTE_MAX - 256];
    uint64_t now = now_ms(), next = UINT64_MAX;
    bool running = ranks_running(j);
#define GRUN_ARM(t) next = (t) < next ? (t) : next

    if (j->phase == PHASE_RUNNING && running && j->timeout_deadline) {
        if (now >= j->timeout_deadline) {
            note(j, "timeout after %g s; ranks still running: %s", j->o->timeout_s,
                 format_running(j, list, sizeof list));
            j->timed_out = true;
            begin_termination(j);
        } else {
            GRUN_ARM(j->timeout_deadline);
        }
    }
    if (j->phase == PHASE_RUNNING && !running && j->children_left) {
        if (!j->strays_deadline)
            j->strays_deadline = now + GRUN_SETTLE_MS;
        if (now >= j->strays_deadline) {
            note(j, "all ranks exited but processes they started are still running; stopping them");
            begin_termination(j);
        } else {
            GRUN_ARM(j->strays_deadline);
        }
    }
    if (j->phase == PHASE_TERMINATING && j->children_left) {
        if (now >= j->grace_deadline)
            escalate(j, true);
        else
            GRUN_ARM(j->grace_deadline);
    } else if (j->phase == PHASE_KILLING && j->children_left) {
        if (now >= j->kill_deadline) {
            note(j, "processes survived SIGKILL for %d s; giving up on them",
                 GRUN_KILL_WAIT_MS / 1000);
            return GRUN_DONE;
        }
        if (now >= j->next_sweep) {
            signal_all(j, SIGKILL);
            j->next_sweep = now + GRUN_SWEEP_MS;
        }
        GRUN_ARM(j->next_sweep);
        GRUN_ARM(j->kill_deadline);
    }
    if (!running && !j->children_left) {
        if (open_streams == 0)
            return GRUN_DONE;
        if (!j->drain_deadline)
            j->drain_deadline = now + GRUN_DRAIN_MS;
        if (now >= j->drain_deadline)
            return GRUN_DONE;
        GRUN_ARM(j->drain_deadline);
    }
#undef GRUN_ARM
    if (next == UINT64_MAX)
        return -1;
    return next <= now ? 0 : (int)(next - now > INT_MAX ? INT_MAX : next - now);
}

static void run_loop(struct job *j)
{
    for (;;) {
        int nfds = 1, open_streams = 0;
        j->pfds[0] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
        for (int r = 0; r < j->o->nranks; r++) {
            for (int i = 0; i < 2; i++) {
                struct stream *s = &j->ranks[r].streams[i];
                if (s->fd < 0)
                    continue;
                j->pfds[nfds] = (struct pollfd){.fd = s->fd, .events = POLLIN};
                j->pstreams[nfds - 1] = s;
                j->prank[nfds - 1] = r;
                nfds++;
                open_streams++;
            }
        }
        int timeout = advance(j, open_streams);
        if (timeout == GRUN_DONE)
            break;
        int ready = poll(j->pfds, (nfds_t)nfds, timeout);
        if (ready < 0 && errno != EINTR) {
            note(j, "poll: %s", strerror(errno));
            if (!j->abort_code)
                j->abort_code = GRUN_EXIT_INTERNAL;
            if (j->phase == PHASE_KILLING)
                break;
            escalate(j, false);
            continue;
        }
        /* Output first, so the lines a rank wrote before dying precede the report. */
        for (int i = 1; ready > 0 && i < nfds; i++)
            if (j->pfds[i].revents && j->pstreams[i - 1]->fd >= 0)
                stream_read(j, j->prank[i - 1], j->pstreams[i - 1]);
        if (ready > 0 && j->pfds[0].revents)
            handle_signals(j);
        outbuf_flush(j, 0);
        outbuf_flush(j, 1);
    }
    for (int r = 0; r < j->o->nranks; r++)
        for (int i = 0; i < 2; i++)
            if (j->ranks[r].streams[i].fd >= 0)
                stream_close(j, r, &j->ranks[r].streams[i]);
    outbuf_flush(j, 0);
    outbuf_flush(j, 1);
}

/* Pipes for 1024 ranks need more descriptors than the usual soft limit of 1024. */
static int raise_fd_limit(struct job *j)
{
    rlim_t need = 2 * (rlim_t)j->o->nranks + 32;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &j->orig_nofile))
        return 0;
    if (j->orig_nofile.rlim_cur == RLIM_INFINITY || j->orig_nofile.rlim_cur >= need)
        return 0;
    if (j->orig_nofile.rlim_max != RLIM_INFINITY && j->orig_nofile.rlim_max < need) {
        note(j, "%d ranks need %lu open files but the limit is %lu", j->o->nranks,
             (unsigned long)need, (unsigned long)j->orig_nofile.rlim_max);
        return -1;
    }
    rl = j->orig_nofile;
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl)) {
        note(j, "setrlimit: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Returns 0 or an exit status. */
static int setup_signals(struct job *j)
{
    /* SIGQUIT too: the quit key reaches only us, and dying of it would orphan grandchildren. */
    static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    sigset_t watch, block;
    struct sigaction dfl = {.sa_handler = SIG_DFL};

    sigemptyset(&watch);
    sigaddset(&watch, SIGCHLD);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) {
        struct sigaction old;
        /* Honour an inherited SIG_IGN (nohup, background jobs of a script): leave it alone. */
        if (sigaction(stop_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        sigaddset(&watch, stop_signals[i]);
    }
    block = watch;
    /* A closed stdout must give EPIPE, not kill us and orphan the ranks. */
    sigaddset(&block, SIGPIPE);
    /* An inherited SIG_IGN for SIGCHLD would make the kernel reap ranks behind our back. */
    if (sigaction(SIGCHLD, &dfl, &j->orig_chld) || sigprocmask(SIG_BLOCK, &block, &j->orig_mask)) {
        note(j, "cannot set up signals: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    j->sigfd = signalfd(-1, &watch, SFD_NONBLOCK | SFD_CLOEXEC);
    if (j->sigfd < 0) {
        note(j, "signalfd: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    return 0;
}

/* Returns 0 or an exit status. */
static int prepare(struct job *j)
{
    const struct opts *o = j->o;
    int err;

    if (o->root) {
        snprintf(j->root, sizeof j->root, "%s", o->root);
    } else if ((err = find_free_port(j->root, sizeof j->root)) != 0) {
        note(j, "cannot find a free port on 127.0.0.1: %s", strerror(err));
        return GRUN_EXIT_INTERNAL;
    }
    if (!o->key_from_env) {
        size_t pre = sizeof "GCOLL_JOB_KEY=" - 1;
        memcpy(j->kv_key, "GCOLL_JOB_KEY=", pre);
        if ((err = make_job_key(j->kv_key + pre)) != 0) {
            note(j, "getrandom: %s", strerror(err));
            return GRUN_EXIT_INTERNAL;
        }
    }
    snprintf(j->kv_root, sizeof j->kv_root, "GCOLL_ROOT=%s", j->root);
    snprintf(j->kv_size, sizeof j->kv_size, "GCOLL_SIZE=%d", o->nranks);
    snprintf(j->kv_local_size, sizeof j->kv_local_size, "GCOLL_LOCAL_SIZE=%d", o->nranks);

    j->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (j->devnull < 0) {
        note(j, "/dev/null: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    if (raise_fd_limit(j))
        return GRUN_EXIT_INTERNAL;
    /* Leftovers of exited ranks become our children, so we can find, stop and reap them. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    return setup_signals(j);
}

static int run_job(struct job *j)
{
    int st = prepare(j);
    if (st)
        return st;
    if (j->o->timeout_s > 0)
        j->timeout_deadline = now_ms() + sec_to_ms(j->o->timeout_s);
    for (int r = 0; r < j->o->nranks; r++) {
        if ((st = spawn_rank(j, r)) != 0) {
            j->abort_code = st;
            begin_termination(j);
            break;
        }
    }
    reap(j);
    run_loop(j);
    if (j->abort_code)
        return j->abort_code;
    if (j->timed_out)
        return GRUN_EXIT_TIMEOUT;
    return j->fail_code;
}

/* Without open 0-2, a pipe could land on fd 1 and dup2 onto itself would keep its CLOEXEC. */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd)
            _exit(GRUN_EXIT_INTERNAL);
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    struct job *j = NULL;
    int st;

    ensure_std_fds();
    st = parse_args(argc, argv, &o);
    if (st >= 0)
        goto free_opts;
    st = GRUN_EXIT_INTERNAL;
    j = calloc(1, sizeof *j);
    if (!j) {
        note(NULL, "out of memory");
        goto free_opts;
    }
    j->o = &o;
    j->self = getpid();
    j->sigfd = j->devnull = -1;
    j->out[0].fd = STDOUT_FILENO;
    j->out[1].fd = STDERR_FILENO;
    j->ranks = calloc((size_t)o.nranks, sizeof *j->ranks);
    j->pfds = calloc(2 * (size_t)o.nranks + 1, sizeof *j->pfds);
    j->pstreams = calloc(2 * (size_t)o.nranks, sizeof *j->pstreams);
    j->prank = calloc(2 * (size_t)o.nranks, sizeof *j->prank);
    if (!j->ranks || !j->pfds || !j->pstreams || !j->prank) {
        note(NULL, "out of memory");
        goto free_job;
    }
    for (int r = 0; r < o.nranks; r++) {
        j->ranks[r].streams[0] = (struct stream){.fd = -1, .dest = 0};
        j->ranks[r].streams[1] = (struct stream){.fd = -1, .dest = 1};
    }
    st = run_job(j);

free_job:
    explicit_bzero(j->kv_key, sizeof j->kv_key);
    if (j->sigfd >= 0)
        close(j->sigfd);
    if (j->devnull >= 0)
        close(j->devnull);
    free(j->ranks);
    free(j->pfds);
    free(j->pstreams);
    free(j->prank);
    free(j);
free_opts:
    free(o.xenv);
    free(o.renv);
    return st;
}
