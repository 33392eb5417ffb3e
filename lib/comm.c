/* comm.c: communicator life cycle (environment, bootstrap, transport), the per-communicator
 * progress thread that runs queued operations, requests, abort and failure propagation. */
#include "comm.h"

#include <errno.h>
#include <sched.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bootstrap.h"
#include "launch.h"
#include "topo.h"
#include "util.h"

/* The key used when GCOLL_JOB_KEY is unset: connections still run the handshake, which
 * keeps strangers speaking other protocols out, but it is not a secret. */
static const char DEFAULT_KEY[] = "gcoll-default-job-key";

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                               */

void gcoll_comm_set_error(gcoll_comm_t *comm, const char *fmt, ...)
{
    if (comm->op_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(comm->op_error, sizeof(comm->op_error), fmt, ap);
    va_end(ap);
}

gcoll_status_t gcoll_comm_check_args(gcoll_comm_t *comm, const char *what, int ok,
                                     const char *fmt, ...)
{
    if (ok)
        return GCOLL_OK;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    GCOLL_WARN("%s: %s", what, msg);
    if (comm) {
        pthread_mutex_lock(&comm->lock);
        snprintf(comm->last_error, sizeof(comm->last_error), "%s: %s", what, msg);
        pthread_mutex_unlock(&comm->lock);
    }
    return GCOLL_ERR_INVALID;
}

/* The communicator is broken from here on; peers are told so they fail fast too. Runs
 * on the thread that owns the transport. */
static void comm_fail(gcoll_comm_t *comm, const char *what, gcoll_status_t st)
{
    char msg[1200];
    const char *detail = comm->op_error[0] ? comm->op_error : comm->tops->last_error(comm->tp);
    snprintf(msg, sizeof(msg), "%s failed on rank %d: %s%s%s", what, comm->rank,
             gcoll_status_string(st), *detail ? ": " : "", detail);
    pthread_mutex_lock(&comm->lock);
    int first = comm->broken == GCOLL_OK;
    if (first) {
        comm->broken = st;
        snprintf(comm->last_error, sizeof(comm->last_error), "%.1000s", msg);
    }
    pthread_mutex_unlock(&comm->lock);
    if (first) {
        GCOLL_WARN("%s", msg);
        comm->tops->abort(comm->tp, st, msg);
    }
}

static int queue_empty(gcoll_comm_t *comm)
{
    pthread_mutex_lock(&comm->lock);
    int empty = comm->qhead == NULL;
    pthread_mutex_unlock(&comm->lock);
    return empty;
}

/* A blocking operation that failed before it sent or consumed anything (comm->op_local),
 * nothing queued behind it: an error of this call only, as a bad argument. The sequence
 * number goes back so that the caller's next call pairs with the peers' calls still
 * waiting for this one. */
static void local_fail(gcoll_comm_t *comm, const char *what, gcoll_status_t st)
{
    char msg[1000];
    comm->seq--;
    snprintf(msg, sizeof(msg), "%s: %.900s", what,
             comm->op_error[0] ? comm->op_error : gcoll_status_string(st));
    pthread_mutex_lock(&comm->lock);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", msg);
    pthread_mutex_unlock(&comm->lock);
    GCOLL_WARN("%s", msg);
}

/* ---------------------------------------------------------------------------------- */
/* Transport helpers for collectives                                                    */

uint32_t gcoll_call_sig(int kind, size_t count, int dtype, int op, int root)
{
    /* word by word (a multiply and a shift each), not FNV's byte-serial multiplies over
     * 40 bytes: this runs on every call (4% of an 8-byte allreduce over UCX) */
    uint64_t v[5] = {(uint64_t)kind, (uint64_t)count, (uint64_t)dtype, (uint64_t)op,
                     (uint64_t)(int64_t)root};
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 5; i++) {
        h = (h ^ v[i]) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    uint32_t s = (uint32_t)(h ^ (h >> 32));
    return s ? s : 1;
}

gcoll_status_t gcoll_net_isend(gcoll_comm_t *comm, gcoll_treq_t *r, int peer, uint32_t sub,
                               uint32_t sig, const void *buf, size_t len)
{
    *r = (gcoll_treq_t){.peer = peer, .tag = gcoll_tag(comm, sub), .sig = sig,
                        .buf = (void *)buf, .len = len};
    comm->counters.bytes_sent += len;
    return comm->tops->isend(comm->tp, r);
}

gcoll_status_t gcoll_net_irecv(gcoll_comm_t *comm, gcoll_treq_t *r, int peer, uint32_t sub,
                               uint32_t sig, void *buf, size_t len, unsigned flags)
{
    *r = (gcoll_treq_t){.peer = peer, .tag = gcoll_tag(comm, sub), .sig = sig, .buf = buf,
                        .len = len, .flags = flags};
    if (!(flags & GCOLL_TREQ_ANYLEN))
        comm->counters.bytes_received += len;
    return comm->tops->irecv(comm->tp, r);
}

/* A receive of any length counts what arrived, once, when its completion is seen. */
static void count_anylen(gcoll_comm_t *comm, gcoll_treq_t *r)
{
    if ((r->flags & (GCOLL_TREQ_ANYLEN | GCOLL_TREQ_COUNTED)) == GCOLL_TREQ_ANYLEN &&
        r->status >= 0) {
        comm->counters.bytes_received += r->nbytes;
        r->flags |= GCOLL_TREQ_COUNTED;
    }
}

/* A wait polls the transport for up to GCOLL_SPIN_US (counted from the last completion or
 * wake-up) before it sleeps in it, yielding the CPU between polls after the first
 * SPIN_HOT_NS. A sleeping rank pays a wake-up on every message, most of a small
 * allreduce: 2 ranks over loopback TCP, 8 bytes, 20-50 us sleeping against 4.5 us polling
 * (docs/benchmarks.md). The yield is what makes polling pay on shared cores too (4 ranks
 * on 2 cores: 43 -> 23-35 us): a peer sharing the core runs at once instead of when the
 * poller's time slice ends (Open MPI's yield-when-idle); polling without it made small
 * allreduces slower there. Polling hot first, for about a shared-memory message's time,
 * answers those without a system call (UCX, 8 bytes: 1.3 -> 0.95 us). */
#define SPIN_HOT_NS 500u
/* While polling hot, the clock is read every few rounds only: a clock read in this VM
 * costs about a shared-memory poll (16% of an 8-byte allreduce's profile on 2 ranks
 * before). The rounds without one count as wire time all the same (the next read, or the
 * completion, adds the whole interval). */
#define HOT_CLOCK_EVERY 4u

/* How long a wait polls before it starts yielding: at once when the awaited peer last ran
 * on this CPU (it needs the CPU to answer), up to SPIN_ELSEWHERE_NS when it runs on another
 * (yielding would only hand this CPU to a rank whose own peer may not be running either,
 * and ranks sharing cores then settle into phases where no partner ever runs at the same
 * time: every message a context switch; 4 ranks on 2 cores, 8-byte allreduce over the UCX
 * mailbox: 7.7-8.8 us against 4.1-4.3 with this), SPIN_HOT_NS when the transport cannot
 * tell. The bound keeps a rank whose peer waits for a third rank from holding a CPU that
 * third rank needs for long. */
#define SPIN_ELSEWHERE_NS 8000u

int gcoll_net_peer_shares_cpu(const gcoll_comm_t *comm, int peer)
{
    return comm->tops->peer_shares_cpu ? comm->tops->peer_shares_cpu(comm->tp, peer) : -1;
}

static uint64_t hot_ns(gcoll_comm_t *comm, const gcoll_treq_t *waiting)
{
    if (!waiting)
        return SPIN_HOT_NS;
    switch (gcoll_net_peer_shares_cpu(comm, waiting->peer)) {
    case 1: return 0;
    case 0: return SPIN_ELSEWHERE_NS;
    default: return SPIN_HOT_NS;
    }
}

gcoll_status_t gcoll_net_poll(gcoll_comm_t *comm, const gcoll_treq_t *waiting)
{
    if (comm->abort_requested) {
        gcoll_comm_set_error(comm, "gcoll_comm_abort was called");
        return GCOLL_ERR_ABORTED;
    }
    if (comm->hot_skip) { /* polling hot: the clock every HOT_CLOCK_EVERY-th round */
        comm->hot_skip--;
        comm->hot_unclocked = 1;
        return comm->tops->progress(comm->tp, 0);
    }
    uint64_t t0 = gcoll_time_ns(); /* one clock read for the deadline and the polling */
    if (comm->deadline_stale) { /* a completion since the last round (gcoll_net_done) */
        comm->deadline_ms = t0 / 1000000u + (uint64_t)comm->cfg.timeout_ms;
        comm->deadline_stale = 0;
    }
    if (t0 / 1000000u >= comm->deadline_ms) {
        if (waiting)
            gcoll_comm_set_error(comm, "no progress for %lld ms (GCOLL_TIMEOUT_MS) while "
                                 "waiting to %s rank %d",
                                 (long long)comm->cfg.timeout_ms,
                                 waiting->done ? "hear from" : "exchange data with",
                                 waiting->peer);
        else
            gcoll_comm_set_error(comm, "no progress for %lld ms (GCOLL_TIMEOUT_MS)",
                                 (long long)comm->cfg.timeout_ms);
        return GCOLL_ERR_TIMEOUT;
    }
    gcoll_status_t st;
    if (!comm->spin_from_ns)
        comm->spin_from_ns = t0;
    else /* polling: the rounds of one wait follow each other, so one read per round (what
          * the caller does between two rounds counts as wire time; the last round, which
          * saw the completion, does not) */
        comm->counters.ns_wire += t0 - comm->poll_prev_ns;
    comm->poll_prev_ns = t0;
    comm->hot_unclocked = 0;
    uint64_t spun = t0 - comm->spin_from_ns;
    if (spun < comm->spin_ns) {
        st = comm->tops->progress(comm->tp, 0);
        /* not when this round completed what we wait for: the caller goes on (a yield
         * here handed the CPU away with the answer in hand: a context switch per round) */
        if (spun >= hot_ns(comm, waiting) && !(waiting && waiting->done))
            sched_yield();
        else
            comm->hot_skip = HOT_CLOCK_EVERY - 1;
    } else {
        st = comm->tops->progress(comm->tp, gcoll_ms_left(comm->deadline_ms, 100));
        comm->spin_from_ns = 0; /* woken: poll again before the next sleep */
        comm->counters.ns_wire += gcoll_time_ns() - t0;
    }
    return st;
}

gcoll_status_t gcoll_net_done(gcoll_comm_t *comm, gcoll_treq_t *r, int *done_p)
{
    *done_p = r->done;
    if (!r->done)
        return GCOLL_OK;
    count_anylen(comm, r);
    if (comm->hot_unclocked) { /* rounds since the last clock read count as wire time */
        comm->counters.ns_wire += gcoll_time_ns() - comm->poll_prev_ns;
        comm->hot_unclocked = 0;
    }
    comm->deadline_stale = 1;
    comm->spin_from_ns = 0;
    comm->hot_skip = 0;
    return r->status < 0 ? r->status : GCOLL_OK;
}

gcoll_status_t gcoll_net_waitall(gcoll_comm_t *comm, gcoll_treq_t *reqs, int n)
{
    int first = 0, done; /* requests before first are done */
    for (;;) {
        for (; first < n; first++) {
            GCOLL_CHECK(gcoll_net_done(comm, &reqs[first], &done));
            if (!done)
                break;
        }
        if (first == n)
            return GCOLL_OK;
        GCOLL_CHECK(gcoll_net_poll(comm, &reqs[first]));
    }
}

void gcoll_net_cancel(gcoll_comm_t *comm, gcoll_treq_t *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (!reqs[i].done && reqs[i].status == GCOLL_INPROGRESS)
            comm->tops->cancel(comm->tp, &reqs[i]);
}

/* ---------------------------------------------------------------------------------- */
/* Operation queue and progress thread                                                  */

gcoll_request_t *gcoll_request_new(gcoll_comm_t *comm, const char *name, gcoll_run_fn_t run,
                                   const gcoll_args_t *args)
{
    /* one request kept for reuse: most calls are blocking and free theirs at once */
    gcoll_request_t *req = __atomic_exchange_n(&comm->req_cache, NULL, __ATOMIC_ACQUIRE);
    if (req)
        memset(req, 0, sizeof(*req));
    else if (!(req = calloc(1, sizeof(*req))))
        return NULL;
    req->comm = comm;
    req->name = name;
    req->run = run;
    req->a = *args;
    req->status = GCOLL_INPROGRESS;
    return req;
}

static void request_free(gcoll_request_t *req)
{
    if (req->a.release)
        req->a.release(req->a.ext);
    gcoll_request_t *none = NULL;
    if (!__atomic_compare_exchange_n(&req->comm->req_cache, &none, req, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        free(req);
}

/* After an operation: wakes whoever can use it, the threads in gcoll_wait and the progress
 * thread if work is queued. Not the idle progress thread after every inline operation:
 * that was a futex wake and a context switch on another core per small allreduce. */
static void wake_locked(gcoll_comm_t *comm)
{
    if (comm->waiters || comm->qhead)
        pthread_cond_broadcast(&comm->cond);
}

/* Runs one operation; the caller holds the busy flag. */
static void run_op(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_status_t st;
    if (comm->broken != GCOLL_OK || comm->abort_requested) {
        st = GCOLL_ERR_ABORTED;
    } else {
        comm->seq++;
        comm->op_error[0] = '\0';
        uint64_t t0 = gcoll_time_ns();
        comm->deadline_ms = t0 / 1000000ull + (uint64_t)comm->cfg.timeout_ms;
        comm->deadline_stale = 0;
        comm->spin_from_ns = 0; /* an operation that failed mid-wait left it set */
        comm->hot_skip = 0;
        comm->op_local = 0;
        st = req->run(comm, req);
        comm->counters.ns_total += gcoll_time_ns() - t0;
        if (st < 0 && comm->op_local && req->blocking && queue_empty(comm))
            local_fail(comm, req->name, st);
        else if (st < 0)
            comm_fail(comm, req->name, st);
        else
            comm->counters.ops++;
    }
    pthread_mutex_lock(&comm->lock);
    req->status = st;
    req->done = 1;
    comm->busy = 0;
    wake_locked(comm);
    pthread_mutex_unlock(&comm->lock);
}

/* GCOLL_PROGRESS_CPU: a CPU number, none, or auto (lib/topo.h): a free core near the NIC
 * the transport names (ops->nic; TCP's: GCOLL_TCP_IFNAME, else the route to the root) apart from the
 * compute cores, and only when there are two cores per local rank, as pinning on an
 * oversubscribed machine would only take a core away from compute. */
static void place_progress_thread(gcoll_comm_t *comm, const char *root)
{
    const char *want = comm->cfg.progress_cpu ? comm->cfg.progress_cpu : "auto";
    char nic[IF_NAMESIZE + 1] = "", why[1536];
    if (strcmp(want, "auto") == 0 && comm->tops->nic &&
        comm->tops->nic(&comm->cfg, root, nic, sizeof(nic)) != 0)
        nic[0] = '\0';
    int cpu = gcoll_topo_progress_cpu(want, *nic ? nic : NULL, comm->cfg.local_rank,
                                      comm->cfg.local_size, why, sizeof(why));
    if (cpu < 0) {
        GCOLL_INFO(GCOLL_SUBSYS_INIT, "progress thread not pinned: %s", why);
        return;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    int rc = pthread_setaffinity_np(comm->thread, sizeof(one), &one);
    if (rc == 0)
        GCOLL_INFO(GCOLL_SUBSYS_INIT, "progress thread pinned to CPU %d: %s", cpu, why);
    else
        GCOLL_WARN("cannot pin the progress thread to CPU %d: %s", cpu, strerror(rc));
}

static void *progress_main(void *arg)
{
    gcoll_comm_t *comm = arg;
    pthread_mutex_lock(&comm->lock);
    for (;;) {
        while (!comm->stop && (comm->qhead == NULL || comm->busy))
            pthread_cond_wait(&comm->cond, &comm->lock);
        if (comm->qhead == NULL || comm->busy) /* stop requested and nothing to run */
            break;
        gcoll_request_t *req = comm->qhead;
        comm->qhead = req->next;
        if (!comm->qhead)
            comm->qtail = NULL;
        comm->busy = 1;
        pthread_mutex_unlock(&comm->lock);
        run_op(comm, req);
        pthread_mutex_lock(&comm->lock);
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

gcoll_status_t gcoll_comm_submit(gcoll_comm_t *comm, gcoll_request_t *req,
                                 gcoll_request_t **req_p)
{
    req->blocking = req_p == NULL;
    pthread_mutex_lock(&comm->lock);
    if (req_p == NULL && comm->qhead == NULL && !comm->busy) {
        /* Blocking call on an idle communicator: run here and save a thread hand-off. */
        comm->busy = 1;
        pthread_mutex_unlock(&comm->lock);
        run_op(comm, req);
        gcoll_status_t st = req->status;
        request_free(req);
        return st;
    }
    req->next = NULL;
    if (comm->qtail)
        comm->qtail->next = req;
    else
        comm->qhead = req;
    comm->qtail = req;
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
    if (req_p) {
        *req_p = req;
        return GCOLL_OK;
    }
    return gcoll_wait(req);
}

gcoll_status_t gcoll_wait(gcoll_request_t *req)
{
    if (!req)
        return GCOLL_ERR_INVALID;
    gcoll_comm_t *comm = req->comm;
    pthread_mutex_lock(&comm->lock);
    comm->waiters++;
    while (!req->done)
        pthread_cond_wait(&comm->cond, &comm->lock);
    comm->waiters--;
    gcoll_status_t st = req->status;
    pthread_mutex_unlock(&comm->lock);
    request_free(req);
    return st;
}

gcoll_status_t gcoll_test(gcoll_request_t *req, int *done_p)
{
    if (!req || !done_p)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock(&req->comm->lock);
    *done_p = req->done;
    pthread_mutex_unlock(&req->comm->lock);
    return GCOLL_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Life cycle                                                                           */

/* GCOLL_RING_DEPTH=-1: one chunk in flight per neighbour when the host's ranks outnumber
 * its CPUs, else every chunk of a step at once. Measured (docs/benchmarks.md): 4 ranks on 2
 * cores over UCX, depth 1 1.1-1.3x faster at 1-64 MiB; over TCP no difference; 2 ranks
 * over UCX at 64 MiB depth 1 16% slower. The ranks on the host: GCOLL_LOCAL_SIZE (gcoll-run),
 * else Open MPI's. */
static void resolve_ring_depth(gcoll_comm_t *comm)
{
    if (comm->cfg.ring_depth >= 0)
        return;
    long local = comm->cfg.local_size, cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (local <= 0 && v && gcoll_parse_long(v, 1, 1 << 20, &local) != 0)
        local = -1;
    comm->cfg.ring_depth = local > 0 && cpus > 0 && local > cpus ? 1 : 0;
    GCOLL_INFO(GCOLL_SUBSYS_INIT, "ring depth %ld: %ld local rank(s) on %ld CPU(s)",
               comm->cfg.ring_depth, local, cpus);
}

static const gcoll_transport_ops_t *choose_transport(const gcoll_config_t *cfg, char *err,
                                                     size_t errlen)
{
    const char *want = gcoll_transport_names[cfg->transport];
    if (cfg->transport == GCOLL_TRANSPORT_AUTO) {
        char desc[256];
        const gcoll_transport_ops_t *ops = gcoll_transport_auto(desc, sizeof(desc));
        if (*desc)
            GCOLL_INFO(GCOLL_SUBSYS_INIT, "GCOLL_TRANSPORT=auto: %s, which offers RDMA here (%s)",
                       ops->name, desc);
        return ops;
    }
    const gcoll_transport_ops_t *ops = gcoll_transport_find(want);
    if (!ops) {
        snprintf(err, errlen, "GCOLL_TRANSPORT=%s, but this build has only: %s", want,
                 gcoll_transports_built());
        return NULL;
    }
    char why[256] = "";
    if (ops->probe(why, sizeof(why)) != GCOLL_OK) {
        snprintf(err, errlen, "GCOLL_TRANSPORT=%s cannot run here: %s", want, why);
        return NULL;
    }
    return ops;
}

void *gcoll_comm_scratch(gcoll_comm_t *comm, size_t len)
{
    if (len > comm->scratch_len) {
        free(comm->scratch);
        comm->scratch = malloc(len);
        comm->scratch_len = comm->scratch ? len : 0;
    }
    return comm->scratch;
}

static void stop_thread(gcoll_comm_t *comm)
{
    if (!comm->thread_started)
        return;
    pthread_mutex_lock(&comm->lock);
    comm->stop = 1;
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
    pthread_join(comm->thread, NULL);
    comm->thread_started = 0;
}

/* Stops the progress thread if it runs (init failing after starting it: the probe), then
 * frees everything. */
static void comm_free(gcoll_comm_t *comm)
{
    stop_thread(comm);
    free(comm->req_cache);
    free(comm->scratch);
    if (comm->tp)
        comm->tops->destroy(comm->tp);
    if (comm->wake_fd >= 0)
        close(comm->wake_fd);
    gcoll_config_free(&comm->cfg);
    free(comm->keybuf);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->cond);
    free(comm);
}

static gcoll_status_t comm_connect(gcoll_comm_t *comm, const char *root, char *err, size_t errlen)
{
    char slurm[300];
    if ((!root || !*root) && comm->size > 1 && gcoll_launch_slurm_root(slurm, sizeof(slurm)) == 0) {
        root = slurm;
        GCOLL_INFO(GCOLL_SUBSYS_INIT, "rendezvous at %s, from Slurm's node list and job id "
                   "(GCOLL_ROOT overrides)", root);
    }
    uint64_t deadline = gcoll_time_ms() + (uint64_t)comm->cfg.timeout_ms;
    gcoll_bootstrap_t *bs = NULL;
    void **blobs = NULL;
    size_t *lens = NULL;
    char ip[64] = "127.0.0.1";
    gcoll_status_t st;
    if (comm->size > 1) {
        if (!root || !*root) {
            snprintf(err, errlen, "GCOLL_ROOT is not set: every rank needs the rendezvous "
                     "address host:port (gcoll-run sets it; with mpirun pass -x GCOLL_ROOT; "
                     "under srun it defaults to the step's first node)");
            return GCOLL_ERR_INVALID;
        }
        GCOLL_CHECK_GOTO(gcoll_bootstrap_open(comm->rank, comm->size, root, &comm->key, deadline,
                                              &bs, err, errlen), st, out);
        snprintf(ip, sizeof(ip), "%s", gcoll_bootstrap_local_ip(bs));
    }
    if (comm->cfg.tcp_ifname && *comm->cfg.tcp_ifname)
        GCOLL_CHECK_GOTO(gcoll_launch_ifname_ip(comm->cfg.tcp_ifname, ip, sizeof(ip), err, errlen), st, out);
    snprintf(comm->local_ip, sizeof(comm->local_ip), "%s", ip); /* for gcoll_comm_split */
    gcoll_transport_params_t tp = {.rank = comm->rank, .size = comm->size, .cfg = &comm->cfg,
                                   .local_ip = ip, .key = comm->key, .wake_fd = comm->wake_fd};
    st = comm->tops->create(&tp, &comm->tp);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "cannot create the %s transport on %s", comm->tops->name, ip);
        goto out;
    }
    uint8_t blob[4096];
    size_t blen = sizeof(blob);
    GCOLL_CHECK_GOTO(comm->tops->address(comm->tp, blob, &blen), st, out);
    if (comm->size > 1) {
        char match[2048];
        gcoll_config_match_string(&comm->cfg, match, sizeof(match));
        GCOLL_CHECK_GOTO(gcoll_bootstrap_exchange(bs, match, blob, blen, &blobs, &lens, deadline,
                                                  err, errlen), st, out);
    } else {
        const void *one[1] = {blob};
        size_t onelen[1] = {blen};
        st = comm->tops->connect(comm->tp, one, onelen, deadline);
        goto out;
    }
    st = comm->tops->connect(comm->tp, (const void *const *)blobs, lens, deadline);
    if (st != GCOLL_OK)
        snprintf(err, errlen, "%s", comm->tops->last_error(comm->tp));
out:
    free(blobs);
    free(lens);
    gcoll_bootstrap_close(bs);
    return st;
}

/* GCOLL_PROBE=1: two ring allgathers of PROBE_BYTES per rank, the first warming the
 * connections (TCP's slow start, UCX's wire-up), the second timed; every rank takes the
 * slowest rank's time, so the ring's slowest link governs and every rank holds the same
 * estimate (adaptation starts from it instead of from its first step). */
#define PROBE_BYTES (1u << 20)
static gcoll_status_t probe(gcoll_comm_t *comm)
{
    size_t n = PROBE_BYTES / sizeof(float);
    float *buf = calloc((size_t)comm->size * n, sizeof(float));
    if (!buf)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    double secs = 0;
    for (int round = 0; round < 2 && st == GCOLL_OK; round++) {
        uint64_t t0 = gcoll_time_ns();
        st = gcoll_allgather(comm, buf + (size_t)comm->rank * n, buf, n, GCOLL_FLOAT32);
        secs = (double)(gcoll_time_ns() - t0) * 1e-9;
    }
    if (st == GCOLL_OK)
        st = gcoll_allreduce(comm, &secs, &secs, 1, GCOLL_FLOAT64, GCOLL_MAX);
    free(buf);
    if (st != GCOLL_OK)
        return st;
    double bytes = (double)(comm->size - 1) * PROBE_BYTES; /* what a rank sends */
    comm->probe_bw = secs > 0 ? bytes / secs : 0;
    GCOLL_INFO(GCOLL_SUBSYS_ADAPT, "probe: %.1f MB/s per rank (the slowest rank sent %.0f "
               "bytes in %.2f ms)", comm->probe_bw / 1e6, bytes, secs * 1e3);
    return GCOLL_OK;
}

gcoll_status_t gcoll_comm_alloc(gcoll_comm_t **comm_p, char *err, size_t errlen)
{
    gcoll_comm_t *comm = calloc(1, sizeof(*comm));
    if (!comm)
        return GCOLL_ERR_NOMEM;
    comm->wake_fd = -1;
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    snprintf(comm->local_ip, sizeof(comm->local_ip), "127.0.0.1");
    *comm_p = comm;
    gcoll_status_t st = gcoll_config_load(&comm->cfg, err, errlen);
    if (st != GCOLL_OK)
        return st;
    resolve_ring_depth(comm);
    comm->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    comm->spin_ns = (uint64_t)comm->cfg.spin_us * 1000u;
    comm->algo_memo = -1;
    return GCOLL_OK;
}

gcoll_status_t gcoll_comm_set_key(gcoll_comm_t *comm, const char *key)
{
    free(comm->keybuf);
    comm->keybuf = strdup(key);
    if (!comm->keybuf)
        return GCOLL_ERR_NOMEM;
    comm->key = (gcoll_key_t){.key = (const uint8_t *)comm->keybuf, .keylen = strlen(key)};
    return GCOLL_OK;
}

gcoll_status_t gcoll_comm_start(gcoll_comm_t *comm, const char *root, char *err, size_t errlen)
{
    if (pthread_create(&comm->thread, NULL, progress_main, comm) != 0) {
        snprintf(err, errlen, "cannot start the progress thread");
        return GCOLL_ERR_INTERNAL;
    }
    comm->thread_started = 1;
    place_progress_thread(comm, root);
    return GCOLL_OK;
}

void gcoll_comm_free(gcoll_comm_t *comm) { comm_free(comm); }

gcoll_status_t gcoll_comm_init_rank(int size, int rank, const char *root_addr,
                                    gcoll_comm_t **comm_p)
{
    char err[1024] = "";
    if (!comm_p)
        return GCOLL_ERR_INVALID;
    gcoll_comm_t *comm = NULL;
    gcoll_status_t st = gcoll_comm_alloc(&comm, err, sizeof(err));
    if (!comm)
        return st;
    if (st != GCOLL_OK)
        goto err_free;
    GCOLL_CHECK_GOTO(gcoll_launch_identity(&size, &rank, err, sizeof(err)), st, err_free);
    comm->rank = rank;
    comm->size = size;
    gcoll_log_set_rank(comm->rank);
    if (!comm->cfg.job_key && comm->size > 1)
        GCOLL_INFO(GCOLL_SUBSYS_INIT, "GCOLL_JOB_KEY is not set: connections are not "
                                      "authenticated by a secret");
    GCOLL_CHECK_GOTO(gcoll_comm_set_key(comm, comm->cfg.job_key ? comm->cfg.job_key : DEFAULT_KEY),
                     st, err_free);
    st = GCOLL_ERR_INVALID;
    if (!(comm->tops = choose_transport(&comm->cfg, err, sizeof(err))))
        goto err_free;
    const char *root = root_addr ? root_addr : comm->cfg.root;
    uint64_t t0 = gcoll_time_ms();
    GCOLL_CHECK_GOTO(comm_connect(comm, root, err, sizeof(err)), st, err_free);
    GCOLL_CHECK_GOTO(gcoll_comm_start(comm, root, err, sizeof(err)), st, err_free);
    if (comm->cfg.probe && comm->size > 1 && (st = probe(comm)) != GCOLL_OK) {
        snprintf(err, sizeof(err), "the bandwidth probe (GCOLL_PROBE=1) failed: %s",
                 gcoll_comm_last_error(comm));
        goto err_free;
    }
    GCOLL_INFO(GCOLL_SUBSYS_INIT, "communicator ready: rank %d of %d over %s in %llu ms",
               comm->rank, comm->size, comm->tops->name,
               (unsigned long long)(gcoll_time_ms() - t0));
    *comm_p = comm;
    return GCOLL_OK;
err_free:
    GCOLL_WARN("gcoll_comm_init failed: %s%s%s", gcoll_status_string(st), *err ? ": " : "", err);
    comm_free(comm);
    return st;
}

gcoll_status_t gcoll_comm_init(gcoll_comm_t **comm_p)
{
    return gcoll_comm_init_rank(-1, -1, NULL, comm_p);
}

/* The closing handshake of gcoll_comm_destroy, run as the communicator's last operation:
 * an empty message to every peer and one from every peer. A rank leaves only once every
 * peer has entered destroy, that is, completed every operation that involves this rank;
 * the messages still in flight when it closes precede its close on the wire, and every
 * transport delivers them before it reports the close (MPI_Finalize and ncclCommFinalize
 * are collective for the same reason). All to all rather than a dissemination barrier: a
 * rank that passed a barrier knows the others entered it, not that they received its last
 * round; here each one waits for nothing but its peers' own arrival. */
#define GCOLL_KIND_CLOSE 0x434c4f53 /* "CLOS": not a collective kind (coll.h) */
static gcoll_status_t run_close(gcoll_comm_t *comm, gcoll_request_t *req)
{
    (void)req;
    const int P = comm->size;
    uint32_t sig = gcoll_call_sig(GCOLL_KIND_CLOSE, 0, 0, 0, 0);
    gcoll_treq_t *r = calloc(2 * (size_t)P, sizeof(*r));
    if (!r)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    /* receives first: a peer's message finds its receive posted */
    for (int k = 1; k < P && st == GCOLL_OK; k++, n++)
        st = gcoll_net_irecv(comm, &r[n], (comm->rank + P - k) % P, 0, sig, NULL, 0, 0);
    for (int k = 1; k < P && st == GCOLL_OK; k++, n++)
        st = gcoll_net_isend(comm, &r[n], (comm->rank + k) % P, 0, sig, NULL, 0);
    if (st == GCOLL_OK)
        st = gcoll_net_waitall(comm, r, n);
    if (st != GCOLL_OK) {
        if (!comm->op_error[0])
            gcoll_comm_set_error(comm, "the closing handshake failed: %s",
                                 comm->tops->last_error(comm->tp));
        gcoll_net_cancel(comm, r, n);
    }
    free(r);
    return st;
}

gcoll_status_t gcoll_comm_destroy(gcoll_comm_t *comm)
{
    if (!comm)
        return GCOLL_ERR_INVALID;
    stop_thread(comm); /* runs what is queued first */
    if (comm->size > 1 && comm->tp && comm->broken == GCOLL_OK && !comm->abort_requested) {
        gcoll_args_t a = {0};
        gcoll_request_t *req = gcoll_request_new(comm, "gcoll_comm_destroy", run_close, &a);
        if (req) {
            comm->busy = 1;
            run_op(comm, req);
            request_free(req);
        } else {
            GCOLL_WARN("gcoll_comm_destroy: no memory for the closing handshake");
        }
    }
    gcoll_status_t st = comm->broken;
    comm_free(comm);
    return st == GCOLL_ERR_ABORTED ? GCOLL_OK : st;
}

gcoll_status_t gcoll_comm_abort(gcoll_comm_t *comm)
{
    if (!comm)
        return GCOLL_ERR_INVALID;
    comm->abort_requested = 1;
    uint64_t one = 1;
    if (write(comm->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        GCOLL_WARN("gcoll_comm_abort: cannot wake the progress thread: %s", strerror(errno));
    pthread_mutex_lock(&comm->lock);
    /* A running operation notices the flag and tells the peers itself. */
    int idle = !comm->busy;
    if (idle)
        comm->busy = 1;
    pthread_mutex_unlock(&comm->lock);
    if (idle) {
        snprintf(comm->op_error, sizeof(comm->op_error), "gcoll_comm_abort was called");
        comm_fail(comm, "communicator", GCOLL_ERR_ABORTED);
        pthread_mutex_lock(&comm->lock);
        comm->busy = 0;
        wake_locked(comm);
        pthread_mutex_unlock(&comm->lock);
    }
    return GCOLL_OK;
}

int gcoll_comm_rank(const gcoll_comm_t *comm) { return comm ? comm->rank : -1; }
int gcoll_comm_size(const gcoll_comm_t *comm) { return comm ? comm->size : -1; }

const char *gcoll_comm_last_error(const gcoll_comm_t *comm)
{
    return comm ? comm->last_error : "no communicator";
}

const char *gcoll_comm_transport(const gcoll_comm_t *comm)
{
    return comm && comm->tops ? comm->tops->name : "";
}

gcoll_status_t gcoll_comm_probe_bandwidth(const gcoll_comm_t *comm, double *bytes_per_s)
{
    if (!comm || !bytes_per_s)
        return GCOLL_ERR_INVALID;
    *bytes_per_s = comm->probe_bw;
    return GCOLL_OK;
}

gcoll_status_t gcoll_comm_counters(const gcoll_comm_t *comm, gcoll_counters_t *counters_p)
{
    if (!comm || !counters_p)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock((pthread_mutex_t *)&comm->lock);
    *counters_p = comm->counters;
    pthread_mutex_unlock((pthread_mutex_t *)&comm->lock);
    return GCOLL_OK;
}
