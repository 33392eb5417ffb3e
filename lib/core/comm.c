/* comm.c: communicator life cycle (environment, bootstrap, transport), the per-communicator
 * progress thread that runs queued operations, requests, abort and failure propagation. */
#include "core/comm.h"

#include <errno.h>
#include <sched.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/bootstrap.h"
#include "core/dispatch.h"
#include "base/launch.h"
#include "base/topo.h"
#include "base/util.h"
#include "collectives/guard.h"

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

gcoll_status_t gcoll_comm_args_failed(gcoll_comm_t *comm, const char *what, const char *fmt, ...)
{
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
    const char *detail = comm->op_error[0] ? comm->op_error : gcoll_channel_last_error(&comm->chan);
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
        comm->chan.ops->abort(comm->chan.tp, st, msg);
    }
}

static int queue_empty(gcoll_comm_t *comm)
{
    pthread_mutex_lock(&comm->lock);
    int empty = comm->qhead == NULL;
    pthread_mutex_unlock(&comm->lock);
    return empty;
}

/* A blocking operation that failed before it sent or consumed anything (comm->chan.op_local),
 * nothing queued behind it: an error of this call only, as a bad argument. The sequence
 * number goes back so that the caller's next call pairs with the peers' calls still
 * waiting for this one. */
static void local_fail(gcoll_comm_t *comm, const char *what, gcoll_status_t st)
{
    char msg[1000];
    gcoll_channel_undo(&comm->chan);
    snprintf(msg, sizeof(msg), "%s: %.900s", what,
             comm->op_error[0] ? comm->op_error : gcoll_status_string(st));
    pthread_mutex_lock(&comm->lock);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", msg);
    pthread_mutex_unlock(&comm->lock);
    GCOLL_WARN("%s", msg);
}

/* ---------------------------------------------------------------------------------- */
/* Operation queue and progress thread                                                  */

/* After an operation: wakes whoever can use it, the threads in gcoll_wait and the progress
 * thread if work is queued. Not the idle progress thread after every inline operation:
 * that was a futex wake and a context switch on another core per small allreduce. */
static void wake_locked(gcoll_comm_t *comm)
{
    if (comm->waiters || comm->qhead)
        pthread_cond_broadcast(&comm->cond);
}

/* Runs one operation; the caller holds the busy flag, and releases it. */
static gcoll_status_t exec_op(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_status_t st;
    if (comm->broken != GCOLL_OK || comm->abort_requested) {
        st = GCOLL_ERR_ABORTED;
    } else {
        comm->op_error[0] = '\0';
        uint64_t t0 = gcoll_ticks();
        gcoll_channel_begin(&comm->chan);
        if (req->noseq) /* point-to-point takes no place among the collectives */
            gcoll_channel_undo(&comm->chan);
        st = req->run(comm, req);
        if (st >= 0 && comm->chan.ops->flush)
            comm->chan.ops->flush(comm->chan.tp, comm->cfg.timeout_ms);
        gcoll_channel_end(&comm->chan, t0, st >= 0);
        if (st < 0 && comm->chan.op_local && req->blocking && queue_empty(comm))
            local_fail(comm, req->name, st);
        else if (st < 0)
            comm_fail(comm, req->name, st);
    }
    return st;
}

/* Runs one operation and completes it; the caller holds the busy flag. */
static void run_op(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_status_t st = exec_op(comm, req);
    pthread_mutex_lock(&comm->lock);
    req->status = st;
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    comm->busy = 0;
    wake_locked(comm);
    pthread_mutex_unlock(&comm->lock);
}

/* GCOLL_PROGRESS_CPU: a CPU number, none, or auto (lib/base/topo.h): a free core near the NIC
 * the transport names (ops->nic; TCP's: GCOLL_TCP_IFNAME, else the route to the root) apart from
 * the compute cores, and only when there are two cores per local rank, as pinning on an
 * oversubscribed machine would only take a core away from compute. */
static void place_progress_thread(gcoll_comm_t *comm, const char *root)
{
    const char *want = comm->cfg.progress_cpu ? comm->cfg.progress_cpu : "auto";
    char nic[IF_NAMESIZE + 1] = "", why[1536];
    if (strcmp(want, "auto") == 0 && comm->chan.ops->nic &&
        comm->chan.ops->nic(&comm->cfg, root, nic, sizeof(nic)) != 0)
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

/* Takes the queue's first request to run it; the caller holds the lock and the
 * communicator is not busy. */
static gcoll_request_t *take_head_locked(gcoll_comm_t *comm)
{
    gcoll_request_t *req = comm->qhead;
    comm->qhead = req->next;
    if (!comm->qhead)
        comm->qtail = NULL;
    comm->busy = 1;
    return req;
}

static void *progress_main(void *arg)
{
    gcoll_comm_t *comm = arg;
    pthread_mutex_lock(&comm->lock);
    int woke = 0;
    for (;;) {
        while (!comm->stop && (comm->qhead == NULL || comm->busy)) {
            pthread_cond_wait(&comm->cond, &comm->lock);
            woke = 1;
        }
        if (comm->qhead == NULL || comm->busy) /* stop requested and nothing to run */
            break;
        if (woke && !comm->stop && comm->cfg.spin_us > 0) {
            /* Woken from idle by a call: a caller that waits right after it (a blocking
             * torch call is a call, then a wait) runs it in its own thread (gcoll_wait), so
             * leave it that while (GCOLL_SPIN_US), yielding the CPU, rather than take it
             * and make the caller sleep on it: with one rank per CPU, this thread and the
             * caller share one, and the hand-off doubled a 4 B all_reduce's cost. */
            gcoll_request_t *head = comm->qhead;
            uint64_t end = gcoll_time_ns() + (uint64_t)comm->cfg.spin_us * 1000u;
            woke = 0;
            pthread_mutex_unlock(&comm->lock);
            while (gcoll_time_ns() < end &&
                   __atomic_load_n(&comm->qhead, __ATOMIC_ACQUIRE) == head &&
                   !__atomic_load_n(&comm->busy, __ATOMIC_ACQUIRE) &&
                   !__atomic_load_n(&comm->stop, __ATOMIC_ACQUIRE))
                sched_yield();
            pthread_mutex_lock(&comm->lock);
            continue;
        }
        woke = 0;
        gcoll_request_t *req = take_head_locked(comm);
        pthread_mutex_unlock(&comm->lock);
        run_op(comm, req);
        pthread_mutex_lock(&comm->lock);
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

void gcoll_request_complete(gcoll_request_t *req, gcoll_status_t st)
{
    gcoll_comm_t *comm = req->comm;
    if (req->blocking) {
        gcoll_request_free(req);
        return;
    }
    pthread_mutex_lock(&comm->lock);
    req->status = st;
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    if (comm->waiters)
        pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
}

int gcoll_comm_in_group(gcoll_comm_t *comm)
{
    return gcoll_comm_group_mine(comm);
}

gcoll_status_t gcoll_comm_submit(gcoll_comm_t *comm, gcoll_request_t *req, gcoll_request_t **req_p)
{
    req->blocking = req_p == NULL;
    if (gcoll_comm_group_mine(comm)) {
        /* inside a group: kept for gcoll_group_end, which runs the group's calls together
         * (a request on the caller's stack moves to the heap: the call returns now); the
         * group's list is this thread's alone */
        if (req->stacked) {
            gcoll_request_t *heap = gcoll_request_new(comm, req->name, req->run, &req->a);
            if (!heap) {
                gcoll_request_free(req);
                return GCOLL_ERR_NOMEM;
            }
            heap->blocking = req->blocking;
            heap->noseq = req->noseq;
            heap->stacked = 0;
            req = heap;
        }
        __atomic_store_n(&req->grouped, 1, __ATOMIC_RELAXED);
        req->next = NULL;
        if (comm->gtail)
            comm->gtail->next = req;
        else
            comm->ghead = req;
        comm->gtail = req;
        if (req_p)
            *req_p = req;
        return GCOLL_OK;
    }
    pthread_mutex_lock(&comm->lock);
    if (req_p == NULL && comm->qhead == NULL && !comm->busy) {
        /* Blocking call on an idle communicator: run here and save a thread hand-off. */
        comm->busy = 1;
        pthread_mutex_unlock(&comm->lock);
        gcoll_status_t st = exec_op(comm, req);
        /* Nobody else sees this request, so only the busy flag is given back, without the
         * lock (a lock and unlock less per small call): the flag is cleared before the
         * queue is read, and whoever queued meanwhile did so before it read the flag (under
         * the lock), so one of the two sees the other. */
        __atomic_store_n(&comm->busy, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&comm->qhead, __ATOMIC_SEQ_CST) ||
            __atomic_load_n(&comm->waiters, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&comm->lock);
            wake_locked(comm);
            pthread_mutex_unlock(&comm->lock);
        }
        gcoll_request_free(req);
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
    if (__atomic_load_n(&req->grouped, __ATOMIC_RELAXED)) { /* would wait for ever: the group
                                                             * has not run */
        pthread_mutex_unlock(&comm->lock);
        GCOLL_WARN("gcoll_wait: %s belongs to a group still open: call "
                   "gcoll_group_end first",
                   req->name);
        return GCOLL_ERR_INVALID;
    }
    if (!req->done && comm->qhead == req && !comm->busy) {
        /* Not started yet and the communicator idle: run it here, as a blocking call on an
         * idle communicator runs, rather than wait for the progress thread to wake (a torch
         * all_reduce of 4 B on one rank: 21.6 -> 16.8 us through the backend) */
        take_head_locked(comm);
        pthread_mutex_unlock(&comm->lock);
        run_op(comm, req);
        pthread_mutex_lock(&comm->lock);
    }
    if (!req->done && comm->cfg.spin_us > 0) {
        /* Another thread runs it: poll for its end a while (GCOLL_SPIN_US), yielding the
         * CPU, before sleeping. A small operation ends within microseconds, sooner than a
         * futex wake-up reaches a sleeping thread (the torch backend's 4 B all_reduce took
         * about 8 or about 20 us, by which thread had taken it). */
        uint64_t end = gcoll_time_ns() + (uint64_t)comm->cfg.spin_us * 1000u;
        pthread_mutex_unlock(&comm->lock);
        while (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && gcoll_time_ns() < end)
            sched_yield();
        pthread_mutex_lock(&comm->lock);
    }
    comm->waiters++;
    while (!req->done)
        pthread_cond_wait(&comm->cond, &comm->lock);
    comm->waiters--;
    gcoll_status_t st = req->status;
    if (st != GCOLL_OK) /* failed on the progress thread: the caller's thread learns why */
        gcoll_set_last_error("%s",
                             comm->last_error[0] ? comm->last_error : gcoll_status_string(st));
    pthread_mutex_unlock(&comm->lock);
    gcoll_request_free(req);
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
 * its CPUs, else every chunk of a step at once. Measured (docs/results/dense-allreduce.md): 4 ranks
 * on 2 cores over UCX, depth 1 1.1-1.3x faster at 1-64 MiB; over TCP no difference; 2 ranks over
 * UCX at 64 MiB depth 1 16% slower. The ranks on the host: GCOLL_LOCAL_SIZE (gcoll-run), else Open
 * MPI's, else torchrun's (gcoll_launch_local). */
static void resolve_ring_depth(gcoll_comm_t *comm)
{
    if (comm->cfg.coll.ring_depth >= 0)
        return;
    long local = comm->cfg.local_size, cpus = sysconf(_SC_NPROCESSORS_ONLN);
    comm->cfg.coll.ring_depth = local > 0 && cpus > 0 && local > cpus ? 1 : 0;
    GCOLL_INFO(GCOLL_SUBSYS_INIT, "ring depth %ld: %ld local rank(s) on %ld CPU(s)",
               comm->cfg.coll.ring_depth, local, cpus);
}

static const gcoll_transport_ops_t *choose_transport(const gcoll_config_t *cfg, int size, char *err,
                                                     size_t errlen)
{
    const char *want = gcoll_transport_names[cfg->transport];
    if (cfg->transport == GCOLL_TRANSPORT_AUTO) {
        char desc[256];
        /* Every rank on this host: shared memory and single copy move each byte once, where
         * loopback TCP copies it into the kernel and out again (as NCCL and Open MPI keep a
         * node's traffic off the network; measured in docs/results/torch-backend.md). */
        char host[128] = "";
        int one_host = size > 1 && gcoll_launch_one_host(host, sizeof(host)), local;
        const gcoll_transport_ops_t *ops =
            gcoll_transport_auto(desc, sizeof(desc), one_host, &local);
        if (*desc && local)
            GCOLL_INFO(GCOLL_SUBSYS_INIT,
                       "GCOLL_TRANSPORT=auto: %s, every rank on this host (%s), through "
                       "memory (%s)",
                       ops->name, host, desc);
        else if (*desc)
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
    while (comm->ghead) { /* a group never ended: its calls never ran */
        gcoll_request_t *r = comm->ghead;
        comm->ghead = r->next;
        if (r->a.release)
            r->a.release(r->a.ext);
        free(r);
    }
    free(comm->p2p_count);
    for (int i = 0; i < GCOLL_REQ_CACHE; i++)
        free(comm->req_cache[i]);
    free(comm->scratch.p);
    if (comm->chan.tp)
        comm->chan.ops->destroy(comm->chan.tp);
    gcoll_guard_free(&comm->chan); /* the transport's receives pointed there */
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
        GCOLL_INFO(GCOLL_SUBSYS_INIT,
                   "rendezvous at %s, from Slurm's node list and job id "
                   "(GCOLL_ROOT overrides)",
                   root);
    } else if ((!root || !*root) && comm->size > 1 &&
               gcoll_launch_mpirun_root(slurm, sizeof(slurm)) == 0) {
        root = slurm;
        GCOLL_INFO(GCOLL_SUBSYS_INIT,
                   "rendezvous at %s: every rank of this mpirun job is on this host "
                   "(GCOLL_ROOT overrides)",
                   root);
    }
    uint64_t deadline = gcoll_time_ms() + (uint64_t)comm->cfg.timeout_ms;
    gcoll_bootstrap_t *bs = NULL;
    void **blobs = NULL;
    size_t *lens = NULL;
    char ip[64] = "127.0.0.1";
    gcoll_status_t st;
    if (comm->size > 1) {
        if (!root || !*root) {
            snprintf(err, errlen,
                     "GCOLL_ROOT is not set: every rank needs the rendezvous "
                     "address host:port (gcoll-run sets it; with mpirun across hosts pass "
                     "-x GCOLL_ROOT; under srun, and under mpirun on one host, it has a "
                     "default)");
            return GCOLL_ERR_INVALID;
        }
        GCOLL_CHECK_GOTO(gcoll_bootstrap_open(comm->rank, comm->size, root, &comm->key, deadline,
                                              &bs, err, errlen),
                         st, out);
        snprintf(ip, sizeof(ip), "%s", gcoll_bootstrap_local_ip(bs));
    }
    if (comm->cfg.tcp_ifname && *comm->cfg.tcp_ifname)
        GCOLL_CHECK_GOTO(gcoll_launch_ifname_ip(comm->cfg.tcp_ifname, ip, sizeof(ip), err, errlen),
                         st, out);
    snprintf(comm->local_ip, sizeof(comm->local_ip), "%s", ip); /* for gcoll_comm_split */
    gcoll_transport_params_t tp = {.rank = comm->rank,
                                   .size = comm->size,
                                   .cfg = &comm->cfg,
                                   .local_ip = ip,
                                   .key = comm->key,
                                   .wake_fd = comm->wake_fd};
    st = comm->chan.ops->create(&tp, &comm->chan.tp);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "cannot create the %s transport on %s", comm->chan.ops->name, ip);
        goto out;
    }
    uint8_t blob[4096];
    size_t blen = sizeof(blob);
    GCOLL_CHECK_GOTO(comm->chan.ops->address(comm->chan.tp, blob, &blen), st, out);
    if (comm->size > 1) {
        char match[2048];
        gcoll_config_match_string(&comm->cfg, match, sizeof(match));
        GCOLL_CHECK_GOTO(
            gcoll_bootstrap_exchange(bs, match, blob, blen, &blobs, &lens, deadline, err, errlen),
            st, out);
    } else {
        const void *one[1] = {blob};
        size_t onelen[1] = {blen};
        st = comm->chan.ops->connect(comm->chan.tp, one, onelen, deadline);
        goto out;
    }
    st = comm->chan.ops->connect(comm->chan.tp, (const void *const *)blobs, lens, deadline);
    if (st != GCOLL_OK)
        snprintf(err, errlen, "%s", comm->chan.ops->last_error(comm->chan.tp));
out:
    free(blobs);
    free(lens);
    gcoll_bootstrap_close(bs);
    return st;
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
    gcoll_launch_local(&comm->cfg.local_rank, &comm->cfg.local_size);
    resolve_ring_depth(comm);
    comm->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    gcoll_channel_setup(&comm->chan, comm->cfg.timeout_ms, (uint64_t)comm->cfg.spin_us * 1000u,
                        &comm->abort_requested, comm->op_error, sizeof(comm->op_error));
    long ncpus = sysconf(_SC_NPROCESSORS_ONLN);
    comm->chan.spin_large = comm->cfg.local_size > 0 && comm->cfg.local_size <= ncpus;
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

void gcoll_comm_free(gcoll_comm_t *comm)
{
    comm_free(comm);
}

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
    if (!(comm->chan.ops = choose_transport(&comm->cfg, comm->size, err, sizeof(err))))
        goto err_free;
    const char *root = root_addr ? root_addr : comm->cfg.root;
    uint64_t t0 = gcoll_time_ms();
    GCOLL_CHECK_GOTO(comm_connect(comm, root, err, sizeof(err)), st, err_free);
    GCOLL_CHECK_GOTO(gcoll_comm_start(comm, root, err, sizeof(err)), st, err_free);
    if (comm->cfg.probe && comm->size > 1 &&
        (st = gcoll_coll_dispatch.probe(comm, &comm->probe_bw)) != GCOLL_OK) {
        snprintf(err, sizeof(err), "the bandwidth probe (GCOLL_PROBE=1) failed: %.900s",
                 gcoll_comm_last_error(comm));
        goto err_free;
    }
    GCOLL_INFO(GCOLL_SUBSYS_INIT, "communicator ready: rank %d of %d over %s in %llu ms",
               comm->rank, comm->size, comm->chan.ops->name,
               (unsigned long long)(gcoll_time_ms() - t0));
    *comm_p = comm;
    return GCOLL_OK;
err_free:
    /* with a reason, the status's name only: "GCOLL_ERR_MISMATCH: ranks disagree on ...",
     * not "...: ranks disagree: ranks disagree on ..." */
    if (*err)
        GCOLL_WARN("gcoll_comm_init failed: %.*s: %s", (int)strcspn(gcoll_status_string(st), ":"),
                   gcoll_status_string(st), err);
    else
        GCOLL_WARN("gcoll_comm_init failed: %s", gcoll_status_string(st));
    comm_free(comm);
    return st;
}

gcoll_status_t gcoll_comm_init(gcoll_comm_t **comm_p)
{
    return gcoll_comm_init_rank(-1, -1, NULL, comm_p);
}

gcoll_status_t gcoll_comm_destroy(gcoll_comm_t *comm)
{
    if (!comm)
        return GCOLL_ERR_INVALID;
    if (gcoll_comm_in_group(comm)) {
        GCOLL_WARN("gcoll_comm_destroy: called inside an open group (call gcoll_group_end "
                   "first)");
        return GCOLL_ERR_INVALID;
    }
    stop_thread(comm); /* runs what is queued first */
    gcoll_hier_release(comm);
    if (comm->size > 1 && comm->chan.tp && comm->broken == GCOLL_OK && !comm->abort_requested) {
        gcoll_args_t a = {0};
        gcoll_request_t *req =
            gcoll_request_new(comm, "gcoll_comm_destroy", gcoll_coll_dispatch.close, &a);
        if (req) {
            comm->busy = 1;
            run_op(comm, req);
            gcoll_request_free(req);
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
    gcoll_hier_abort(comm);
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

int gcoll_comm_rank(const gcoll_comm_t *comm)
{
    return comm ? comm->rank : -1;
}
int gcoll_comm_size(const gcoll_comm_t *comm)
{
    return comm ? comm->size : -1;
}

const char *gcoll_comm_last_error(const gcoll_comm_t *comm)
{
    return comm ? comm->last_error : gcoll_last_error();
}

const char *gcoll_comm_transport(const gcoll_comm_t *comm)
{
    return comm && comm->chan.ops ? comm->chan.ops->name : "";
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
    *counters_p = comm->chan.counters;
    counters_p->ns_total = gcoll_ticks_to_ns(comm->chan.ticks_total);
    pthread_mutex_unlock((pthread_mutex_t *)&comm->lock);
    return GCOLL_OK;
}
