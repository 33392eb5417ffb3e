/* procs.c: gcoll-run's ranks as processes: spawning, signals, reaping, termination. */
#include "run.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* What the child writes to the report pipe when it cannot exec; nothing when it can. */
struct child_report {
    int stage;
    int err;
};

enum { STAGE_EXEC, STAGE_SETPGID, STAGE_PDEATHSIG, STAGE_DUP2, STAGE_RLIMIT, STAGE_BIND };
static const char *const stage_names[] = {"exec", "setpgid",   "prctl",
                                          "dup2", "setrlimit", "sched_setaffinity"};

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
    const char **ov = malloc((12 + o->nxenv + o->nrenv) * sizeof *ov);
    char **envp = malloc((nenv + 12 + o->nxenv + o->nrenv + 1) * sizeof *envp);
    if (!ov || !envp) {
        free(ov);
        free(envp);
        return NULL;
    }
    snprintf(j->kv_rank, sizeof j->kv_rank, "GCOLL_RANK=%d", r);
    snprintf(j->kv_local_rank, sizeof j->kv_local_rank, "GCOLL_LOCAL_RANK=%d", r);
    snprintf(j->kv_trank, sizeof j->kv_trank, "RANK=%d", r);
    snprintf(j->kv_tlocal_rank, sizeof j->kv_tlocal_rank, "LOCAL_RANK=%d", r);
    /* In precedence order: later entries override earlier ones with the same name (-x
     * MASTER_PORT=... beats the one chosen here). */
    ov[nov++] = j->kv_rank;
    ov[nov++] = j->kv_size;
    ov[nov++] = j->kv_root;
    if (!o->key_from_env) /* otherwise the inherited GCOLL_JOB_KEY passes through */
        ov[nov++] = j->kv_key;
    ov[nov++] = j->kv_local_rank;
    ov[nov++] = j->kv_local_size;
    ov[nov++] = j->kv_trank;
    ov[nov++] = j->kv_tsize;
    ov[nov++] = j->kv_tlocal_rank;
    ov[nov++] = j->kv_tlocal_size;
    ov[nov++] = j->kv_maddr;
    ov[nov++] = j->kv_mport;
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
child_exec(const struct job *j, char **envp, int cpu, int out_fd, int err_fd, int report_fd)
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
    if (cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        rep.stage = STAGE_BIND;
        if (sched_setaffinity(0, sizeof one, &one))
            goto fail;
    }
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
int grun_spawn_rank(struct job *j, int r)
{
    int outp[2], errp[2], repp[2];
    struct child_report rep;
    int ret = GRUN_EXIT_INTERNAL;
    ssize_t n;

    if (pipe2(outp, O_CLOEXEC)) {
        grun_note(j, "pipe: %s", strerror(errno));
        return ret;
    }
    if (pipe2(errp, O_CLOEXEC)) {
        grun_note(j, "pipe: %s", strerror(errno));
        goto close_out;
    }
    /* CLOEXEC: EOF on the read end means exec succeeded, a report means it did not. */
    if (pipe2(repp, O_CLOEXEC)) {
        grun_note(j, "pipe: %s", strerror(errno));
        goto close_err;
    }
    char **envp = build_env(j, r);
    if (!envp) {
        grun_note(j, "out of memory");
        goto close_rep;
    }
    pid_t pid = fork();
    if (pid == 0)
        child_exec(j, envp, j->ncpus ? j->cpus[r % j->ncpus] : -1, outp[1], errp[1], repp[1]);
    free(envp);
    if (pid < 0) {
        grun_note(j, "cannot start rank %d: fork: %s", r, strerror(errno));
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
            grun_note(j, "cannot execute '%s': %s", j->o->prog_argv[0], strerror(rep.err));
            ret = GRUN_EXIT_NOEXEC;
        } else {
            grun_note(j, "cannot start rank %d: %s: %s", r, stage_names[rep.stage],
                      strerror(rep.err));
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

static void format_signal(int sig, bool core, char *buf, size_t cap)
{
    const char *name = strsignal(sig);
    snprintf(buf, cap, "killed by signal %d (%s)%s", sig, name ? name : "unknown",
             core ? " (core dumped)" : "");
}

/* "0 3 5-9": the runs keep the list readable at 1024 ranks. */
const char *grun_format_running(const struct job *j, char *buf, size_t cap)
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

bool grun_ranks_running(const struct job *j)
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

void grun_signal_all(struct job *j, int sig)
{
    for (int r = 0; r < j->o->nranks; r++)
        if (j->ranks[r].state == RANK_RUNNING && kill(-j->ranks[r].pid, sig) && errno == ESRCH)
            kill(j->ranks[r].pid, sig);
    signal_strays(j, sig);
}

void grun_begin_termination(struct job *j)
{
    j->phase = PHASE_TERMINATING;
    j->grace_deadline = now_ms() + sec_to_ms(j->o->grace_s);
    grun_signal_all(j, SIGTERM);
}

/* grace_over: the grace period ran out, as opposed to being cut short on request. */
void grun_escalate(struct job *j, bool grace_over)
{
    char list[GRUN_NOTE_MAX - 256];
    uint64_t now = now_ms();
    if (grace_over) {
        if (grun_ranks_running(j))
            grun_note(j, "ranks still running %g s after SIGTERM: %s; sending SIGKILL",
                      j->o->grace_s, grun_format_running(j, list, sizeof list));
        else
            grun_note(
                j, "processes left by the ranks still running %g s after SIGTERM; sending SIGKILL",
                j->o->grace_s);
    }
    j->phase = PHASE_KILLING;
    j->kill_deadline = now + GRUN_KILL_WAIT_MS;
    j->next_sweep = now + GRUN_SWEEP_MS;
    grun_signal_all(j, SIGKILL);
}

static void drain_rank(struct job *j, int r)
{
    for (int i = 0; i < 2; i++) {
        struct stream *s = &j->ranks[r].streams[i];
        /* Bounded: a leftover process may keep the pipe busy forever. */
        for (int k = 0; k < 64 && s->fd >= 0 && grun_stream_read(j, r, s); k++)
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
    if (j->phase != PHASE_RUNNING)
        return;
    if (code == 0) {
        /* Normal unless the others go on long after it: advance() reports it then. */
        if (j->early_rank < 0 && grun_ranks_running(j)) {
            j->early_rank = r;
            j->early_deadline = now_ms() + GRUN_EARLY_MS;
        }
        return;
    }
    if (!j->fail_code)
        j->fail_code = code;
    /* One line: who, how, and what becomes of the others. */
    if (!grun_ranks_running(j))
        grun_note(j, "rank %d (pid %d) %s", r, (int)j->ranks[r].pid, what);
    else
        grun_note(j, "rank %d (pid %d) %s; %s: %s", r, (int)j->ranks[r].pid, what,
                  j->o->keep_going ? "still running (--keep-going)" : "stopping the other ranks",
                  grun_format_running(j, list, sizeof list));
    if (!j->o->keep_going)
        grun_begin_termination(j);
}

void grun_reap(struct job *j)
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
        grun_note(j, "got %s; stopping all ranks", signal_name(sig));
        if (!j->abort_code)
            j->abort_code = 128 + sig;
        grun_begin_termination(j);
    } else if (j->phase == PHASE_TERMINATING) {
        grun_note(j, "got %s again; killing all ranks", signal_name(sig));
        if (!j->abort_code)
            j->abort_code = 128 + sig;
        grun_escalate(j, false);
    }
}

void grun_handle_signals(struct job *j)
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
        grun_reap(j);
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
        grun_note(j, "%d ranks need %lu open files but the limit is %lu", j->o->nranks,
                  (unsigned long)need, (unsigned long)j->orig_nofile.rlim_max);
        return -1;
    }
    rl = j->orig_nofile;
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl)) {
        grun_note(j, "setrlimit: %s", strerror(errno));
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
        grun_note(j, "cannot set up signals: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    j->sigfd = signalfd(-1, &watch, SFD_NONBLOCK | SFD_CLOEXEC);
    if (j->sigfd < 0) {
        grun_note(j, "signalfd: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    return 0;
}

/* --bind: rank R on the (R mod n)-th of the n CPUs gcoll-run may use. With no more ranks
 * than CPUs that is a CPU each, as Open MPI's mpirun binds to cores: unbound ranks that
 * sleep and wake are sometimes woken onto the CPU of the peer that woke them and stay
 * there, two ranks sharing a core while the other idles (2 ranks, 8-byte allreduce: 8-9 us
 * in one run of four against 4.5 us bound). With more ranks than CPUs (where mpirun does
 * not bind) it puts ring neighbours on different CPUs, so that each hop can overlap with
 * its neighbour's: 4 ranks on 2 CPUs, 4 MiB allreduce 1.34-1.41 GB/s against 1.06-1.18
 * unbound and 1.12-1.16 with neighbours paired on a CPU; equal or better at 8 B-64 MiB. */
static int choose_cpus(struct job *j)
{
    const struct opts *o = j->o;
    cpu_set_t set;
    if (o->no_bind || sched_getaffinity(0, sizeof set, &set))
        return 0;
    int n = CPU_COUNT(&set);
    j->cpus = malloc((size_t)n * sizeof *j->cpus);
    if (!j->cpus) {
        grun_note(j, "out of memory");
        return -1;
    }
    for (int c = 0; c < CPU_SETSIZE && j->ncpus < n; c++)
        if (CPU_ISSET(c, &set))
            j->cpus[j->ncpus++] = c;
    return 0;
}

/* torch.distributed's env:// variables: its TCPStore listens on MASTER_ADDR:MASTER_PORT,
 * the root's host and a free port other than the root's. Returns 0 or an exit status. */
static int torch_env(struct job *j)
{
    const struct opts *o = j->o;
    char host[GRUN_ROOT_MAX], port[GRUN_ROOT_MAX];
    const char *colon = strrchr(j->root, ':');
    size_t hl = colon ? (size_t)(colon - j->root) : strlen(j->root);
    snprintf(host, sizeof host, "%.*s", (int)hl, j->root);
    int err = 0;
    for (int tries = 0; tries < 8; tries++) {
        if ((err = find_free_port(port, sizeof port)) != 0)
            break;
        if (strcmp(port, j->root) != 0)
            break;
    }
    if (err) {
        grun_note(j, "cannot find a free port on 127.0.0.1 for MASTER_PORT: %s", strerror(err));
        return GRUN_EXIT_INTERNAL;
    }
    snprintf(j->kv_tsize, sizeof j->kv_tsize, "WORLD_SIZE=%d", o->nranks);
    snprintf(j->kv_tlocal_size, sizeof j->kv_tlocal_size, "LOCAL_WORLD_SIZE=%d", o->nranks);
    snprintf(j->kv_maddr, sizeof j->kv_maddr, "MASTER_ADDR=%s", hl ? host : "127.0.0.1");
    snprintf(j->kv_mport, sizeof j->kv_mport, "MASTER_PORT=%s", strrchr(port, ':') + 1);
    return 0;
}

/* Returns 0 or an exit status. */
int grun_prepare(struct job *j)
{
    const struct opts *o = j->o;
    int err;

    if (o->root) {
        snprintf(j->root, sizeof j->root, "%s", o->root);
    } else if ((err = find_free_port(j->root, sizeof j->root)) != 0) {
        grun_note(j, "cannot find a free port on 127.0.0.1: %s", strerror(err));
        return GRUN_EXIT_INTERNAL;
    }
    if (!o->key_from_env) {
        size_t pre = sizeof "GCOLL_JOB_KEY=" - 1;
        memcpy(j->kv_key, "GCOLL_JOB_KEY=", pre);
        if ((err = make_job_key(j->kv_key + pre)) != 0) {
            grun_note(j, "getrandom: %s", strerror(err));
            return GRUN_EXIT_INTERNAL;
        }
    }
    snprintf(j->kv_root, sizeof j->kv_root, "GCOLL_ROOT=%s", j->root);
    snprintf(j->kv_size, sizeof j->kv_size, "GCOLL_SIZE=%d", o->nranks);
    snprintf(j->kv_local_size, sizeof j->kv_local_size, "GCOLL_LOCAL_SIZE=%d", o->nranks);
    if ((err = torch_env(j)) != 0)
        return err;

    if (choose_cpus(j))
        return GRUN_EXIT_INTERNAL;
    j->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (j->devnull < 0) {
        grun_note(j, "/dev/null: %s", strerror(errno));
        return GRUN_EXIT_INTERNAL;
    }
    if (raise_fd_limit(j))
        return GRUN_EXIT_INTERNAL;
    /* Leftovers of exited ranks become our children, so we can find, stop and reap them. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
    return setup_signals(j);
}
