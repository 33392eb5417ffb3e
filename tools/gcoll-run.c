/* gcoll-run.c: starts N local ranks of a program, tags their output, stops them together. */
#include "run/run.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
    "Usage: gcoll-run -n N [options] [--] prog [args...]\n"
    "\n"
    "Start N local ranks of prog for a gcoll job, copy their output tagged with the rank,\n"
    "and stop all of them as soon as one fails.\n"
    "\n"
    "Options:\n"
    "  -n, --nranks N          number of ranks, 1 to 1024 (required; -np N as in mpirun)\n"
    "  -x VAR=VALUE            set VAR for every rank (repeatable)\n"
    "      --rank-env R:VAR=VALUE\n"
    "                          set VAR for rank R only (repeatable), e.g. to inject a fault\n"
    "      --root HOST:PORT    rendezvous address (default 127.0.0.1 and a free port)\n"
    "      --key-from-env      pass on GCOLL_JOB_KEY from the environment instead of\n"
    "                          generating a fresh key\n"
    "      --timeout SEC       stop the job after SEC seconds and exit with status 124\n"
    "      --grace SEC         wait SEC seconds between SIGTERM and SIGKILL (default 3)\n"
    "      --keep-going        do not stop the other ranks when one fails; report each failure\n"
    "      --bind WHAT         auto or core (default): bind rank R to the (R mod n)-th of\n"
    "                          the n CPUs gcoll-run may use; none: do not bind\n"
    "  -q, --quiet             do not prefix output lines with \"[rank] \"\n"
    "  -h, --help              show this help and exit\n"
    "  -V, --version           show the version and exit\n"
    "\n"
    "Environment of each rank: gcoll-run's own, plus\n"
    "  GCOLL_RANK, GCOLL_LOCAL_RANK   the rank, 0 to N-1\n"
    "  GCOLL_SIZE, GCOLL_LOCAL_SIZE   N\n"
    "  GCOLL_ROOT                     HOST:PORT where rank 0 listens for the others\n"
    "  GCOLL_JOB_KEY                  32 random bytes in hex, the same for every rank\n"
    "  RANK, LOCAL_RANK               the rank (torch.distributed's env://, as torchrun)\n"
    "  WORLD_SIZE, LOCAL_WORLD_SIZE   N\n"
    "  MASTER_ADDR, MASTER_PORT       GCOLL_ROOT's host and another free port there\n"
    "then -x and then --rank-env, each of which may override what came before.\n"
    "\n"
    "Each rank runs in its own process group with stdin from /dev/null. Every line it\n"
    "writes to stdout or stderr is copied to gcoll-run's stdout or stderr, prefixed with\n"
    "\"[rank] \"; lines longer than 64 KiB are split and a last line without a newline gets one.\n"
    "\n"
    "When a rank exits with a non-zero status or is killed by a signal, gcoll-run reports it,\n"
    "sends SIGTERM to the other ranks and SIGKILL to those still running after the grace\n"
    "period. A rank that exits with status 0 while others still run 3 s later is reported\n"
    "with them (they may be waiting for it); they are left running.\n"
    "SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to gcoll-run stop the job the same way; a\n"
    "second one skips the grace period. Processes that ranks leave behind are stopped too.\n"
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

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    grun_note(NULL, "%s\nTry 'gcoll-run --help' for more information.", msg);
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

enum {
    OPT_RANK_ENV = 256,
    OPT_ROOT,
    OPT_KEY_FROM_ENV,
    OPT_TIMEOUT,
    OPT_GRACE,
    OPT_KEEP_GOING,
    OPT_BIND
};

/* Returns -1 to go on, or the exit status to end with (0 after --help or --version). Over
 * 100 lines: one case per option, kept together so the option table reads in one place. */
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
        {"bind", required_argument, NULL, OPT_BIND},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    long v;
    int c;

    o->grace_s = 3.0;
    opterr = 0;
    /* "-np N" as mpirun users type it is -n N; only among gcoll-run's own options (they
     * end at "--" or at prog: a word after a word that is no option). */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (argv[i][0] != '-' && argv[i - 1][0] != '-')
            break;
        if (strcmp(argv[i], "-np") == 0)
            argv[i] = "-n";
    }
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
        case OPT_BIND:
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "core") != 0 &&
                strcmp(optarg, "none") != 0)
                return usage_error("--bind expects auto, core or none, got '%s'", optarg);
            o->no_bind = strcmp(optarg, "none") == 0;
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
    bool running = grun_ranks_running(j);
#define GRUN_ARM(t) next = (t) < next ? (t) : next

    if (j->phase == PHASE_RUNNING && running && j->timeout_deadline) {
        if (now >= j->timeout_deadline) {
            grun_note(j, "timeout after %g s; ranks still running: %s", j->o->timeout_s,
                      grun_format_running(j, list, sizeof list));
            j->timed_out = true;
            grun_begin_termination(j);
        } else {
            GRUN_ARM(j->timeout_deadline);
        }
    }
    if (j->phase == PHASE_RUNNING && running && j->early_rank >= 0 && j->early_deadline) {
        if (now >= j->early_deadline) {
            grun_note(j, "rank %d (pid %d) exited with status 0 %d s ago; still running: %s",
                      j->early_rank, (int)j->ranks[j->early_rank].pid, GRUN_EARLY_MS / 1000,
                      grun_format_running(j, list, sizeof list));
            j->early_deadline = 0;
        } else {
            GRUN_ARM(j->early_deadline);
        }
    }
    if (j->phase == PHASE_RUNNING && !running && j->children_left) {
        if (!j->strays_deadline)
            j->strays_deadline = now + GRUN_SETTLE_MS;
        if (now >= j->strays_deadline) {
            grun_note(
                j, "all ranks exited but processes they started are still running; stopping them");
            grun_begin_termination(j);
        } else {
            GRUN_ARM(j->strays_deadline);
        }
    }
    if (j->phase == PHASE_TERMINATING && j->children_left) {
        if (now >= j->grace_deadline)
            grun_escalate(j, true);
        else
            GRUN_ARM(j->grace_deadline);
    } else if (j->phase == PHASE_KILLING && j->children_left) {
        if (now >= j->kill_deadline) {
            grun_note(j, "processes survived SIGKILL for %d s; giving up on them",
                      GRUN_KILL_WAIT_MS / 1000);
            return GRUN_DONE;
        }
        if (now >= j->next_sweep) {
            grun_signal_all(j, SIGKILL);
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
            grun_note(j, "poll: %s", strerror(errno));
            if (!j->abort_code)
                j->abort_code = GRUN_EXIT_INTERNAL;
            if (j->phase == PHASE_KILLING)
                break;
            grun_escalate(j, false);
            continue;
        }
        /* Output first, so the lines a rank wrote before dying precede the report. */
        for (int i = 1; ready > 0 && i < nfds; i++)
            if (j->pfds[i].revents && j->pstreams[i - 1]->fd >= 0)
                grun_stream_read(j, j->prank[i - 1], j->pstreams[i - 1]);
        if (ready > 0 && j->pfds[0].revents)
            grun_handle_signals(j);
        grun_outbuf_flush(j, 0);
        grun_outbuf_flush(j, 1);
    }
    for (int r = 0; r < j->o->nranks; r++)
        for (int i = 0; i < 2; i++)
            if (j->ranks[r].streams[i].fd >= 0)
                grun_stream_close(j, r, &j->ranks[r].streams[i]);
    grun_outbuf_flush(j, 0);
    grun_outbuf_flush(j, 1);
}

static int run_job(struct job *j)
{
    int st = grun_prepare(j);
    if (st)
        return st;
    if (j->o->timeout_s > 0)
        j->timeout_deadline = now_ms() + sec_to_ms(j->o->timeout_s);
    for (int r = 0; r < j->o->nranks; r++) {
        if ((st = grun_spawn_rank(j, r)) != 0) {
            j->abort_code = st;
            grun_begin_termination(j);
            break;
        }
    }
    grun_reap(j);
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
        grun_note(NULL, "out of memory");
        goto free_opts;
    }
    j->o = &o;
    j->self = getpid();
    j->sigfd = j->devnull = -1;
    j->early_rank = -1;
    j->out[0].fd = STDOUT_FILENO;
    j->out[1].fd = STDERR_FILENO;
    j->ranks = calloc((size_t)o.nranks, sizeof *j->ranks);
    j->pfds = calloc(2 * (size_t)o.nranks + 1, sizeof *j->pfds);
    j->pstreams = calloc(2 * (size_t)o.nranks, sizeof *j->pstreams);
    j->prank = calloc(2 * (size_t)o.nranks, sizeof *j->prank);
    if (!j->ranks || !j->pfds || !j->pstreams || !j->prank) {
        grun_note(NULL, "out of memory");
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
    free(j->cpus);
    free(j);
free_opts:
    free(o.xenv);
    free(o.renv);
    return st;
}
