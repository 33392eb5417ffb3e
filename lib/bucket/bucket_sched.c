/* bucket_sched.c: when and in which order the bucketer's buckets run on the progress
 * thread -- in launch order, or by priority with the ranks agreeing on what is ready --,
 * the codec worker that encodes launched buckets while another is on the wire, and the
 * wait for one tensor's result. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bucket/bucketer_int.h"
#include "base/log.h"
#include "collectives/coll.h"
#include "base/util.h"
#include "core/ops.h"

/* Bucket k reduced (or failed) this step: wakes gcoll_bucketer_wait_tensor. */
static void bucket_done(bucket_t *k, gcoll_status_t st)
{
    gcoll_bucketer_t *b = k->b;
    /* the run order, the same on every rank (tests/integration/test-overlap.sh compares) */
    GCOLL_DEBUG(GCOLL_SUBSYS_COLL, "bucketer: step %ld ran bucket %d (%s)", b->step,
                (int)(k - b->bk), gcoll_status_string(st));
    pthread_mutex_lock(&b->lock);
    k->st = st;
    k->ran = 1;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* On the progress thread, buckets in launch order (GCOLL_BUCKET_PRIORITY=0). */
static gcoll_status_t run_bucket(gcoll_comm_t *comm, gcoll_request_t *req)
{
    bucket_t *k = req->a.ext;
    gcoll_status_t st = gcoll_bk_run_one(comm, k);
    bucket_done(k, st);
    return st;
}

/* Priorities (ByteScheduler, Peng et al. SOSP'19, with Horovod's negotiation of what is
 * ready): each launched bucket queues a token; a token runs the highest-priority bucket
 * that every rank has launched and none has run -- the one latest in backward order, the
 * first layers the next forward pass needs first. The ranks agree on the candidates with a
 * tiny MIN allreduce of launched flags (recursive doubling: log2 P latencies), so all run the same
 * bucket even when their ready() timings differ; the last bucket of a step needs no agreement. */
#define NEGOTIATE_SUB 0xe0000000u /* tags apart from the bucket's and the mid-step check's */
static gcoll_status_t run_token(gcoll_comm_t *comm, gcoll_request_t *req)
{
    gcoll_bucketer_t *b = req->a.ext;
    int32_t *f = b->neg;
    uint64_t give_up = gcoll_time_ms() + (uint64_t)comm->cfg.timeout_ms;
    for (unsigned round = 0;; round++) {
        int left = 0, only = -1, pick = -1;
        pthread_mutex_lock(&b->lock);
        for (int j = 0; j < b->nb; j++) {
            f[j] = b->bk[j].launched && !b->bk[j].ran;
            if (!b->bk[j].ran) {
                left++;
                only = j;
            }
        }
        pthread_mutex_unlock(&b->lock);
        if (left == 1) {
            pick = only;
        } else {
            uint32_t sig =
                gcoll_call_sig(GCOLL_KIND_ALLREDUCE, (size_t)b->nb, GCOLL_INT32, GCOLL_MIN, 0);
            GCOLL_CHECK(gcoll_small_allreduce_at(comm, f, (size_t)b->nb, GCOLL_INT32, GCOLL_MIN,
                                                 sig, NEGOTIATE_SUB + ((round & 0xfffu) << 16)));
            for (int j = b->nb - 1; j >= 0 && pick < 0; j--)
                if (f[j])
                    pick = j;
        }
        if (pick >= 0) {
            gcoll_status_t st = gcoll_bk_run_one(comm, &b->bk[pick]);
            bucket_done(&b->bk[pick], st);
            return st;
        }
        /* nothing launched on every rank yet: wait for a launch here (briefly: another
         * rank's launch is seen only through the next round) */
        if (gcoll_time_ms() > give_up) {
            gcoll_comm_set_error(comm, "gcoll_bucketer: no bucket launched on every rank within "
                                       "GCOLL_TIMEOUT_MS (a tensor not marked ready?)");
            return GCOLL_ERR_TIMEOUT;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&b->lock);
        pthread_cond_timedwait(&b->cond, &b->lock, &ts);
        pthread_mutex_unlock(&b->lock);
    }
}

/* A timespec ms from now, for the timed waits. */
static struct timespec in_ms(long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The codec worker (GCOLL_BUCKET_PIPELINE). A bucket's encode -- gather, selection or
 * quantization, error-feedback update -- depends on no other rank, so it can run as soon
 * as the bucket is complete, on its own thread, while the progress thread has an earlier
 * bucket on the wire (where it mostly sleeps in the transport's poll): when the agreed
 * order reaches the bucket, its message is ready. A thread rather than slices of encode
 * between the progress thread's polls: the encodes are single calls of the codec (a
 * selection over the whole bucket), and the progress thread keeps its latency to the wire.
 * The worker takes a bucket only while the progress thread has another on the wire, and
 * then the launched one the progress thread runs first (by priority the latest in backward
 * order, else the earliest); otherwise the progress thread encodes the bucket itself in its
 * turn: with the link idle a hand-over between threads would only add a wake-up (on cores
 * the backward pass keeps busy, measured slower). Each bucket's encode reads only
 * its own tensors and state, so the results are those of the unpipelined run whatever
 * thread encodes and in which order. */
static bucket_t *next_encode(gcoll_bucketer_t *b)
{
    for (int i = 0; b->on_wire && i < b->nb; i++) {
        bucket_t *k = &b->bk[b->priority ? b->nb - 1 - i : i];
        if (k->pre_ok && k->launched && !k->ran && k->enc == ENC_NONE)
            return k;
    }
    return NULL;
}

/* Encodes bucket k, taken by this thread (called and returning with b->lock held; the
 * encode itself runs without it), and wakes whoever waits for it. */
static void encode_claimed(gcoll_bucketer_t *b, bucket_t *k)
{
    k->enc = ENC_BUSY;
    pthread_mutex_unlock(&b->lock);
    gcoll_bk_encode(k);
    pthread_mutex_lock(&b->lock);
    k->enc = ENC_DONE;
    pthread_cond_broadcast(&b->cond);
}

static void *codec_worker(void *arg)
{
    gcoll_bucketer_t *b = arg;
    pthread_mutex_lock(&b->lock);
    while (!b->worker_stop) {
        bucket_t *k = next_encode(b);
        if (!k) {
            struct timespec ts = in_ms(1000); /* woken by a launch or the stop */
            pthread_cond_timedwait(&b->wcond, &b->lock, &ts);
            continue;
        }
        encode_claimed(b, k);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

gcoll_status_t gcoll_bk_worker_start(gcoll_bucketer_t *b)
{
    if (b->worker_on)
        return GCOLL_OK;
    b->worker_stop = 0;
    int rc = pthread_create(&b->worker, NULL, codec_worker, b);
    if (rc != 0) { /* the progress thread encodes each bucket in its turn instead */
        GCOLL_WARN("gcoll_bucketer: cannot start the codec worker (%s); buckets are encoded "
                   "in their turn",
                   strerror(rc));
        b->pipeline = 0;
        return GCOLL_OK;
    }
    b->worker_on = 1;
    return GCOLL_OK;
}

void gcoll_bk_worker_stop(gcoll_bucketer_t *b)
{
    pthread_mutex_lock(&b->lock);
    int on = b->worker_on;
    b->worker_stop = 1;
    b->worker_on = 0;
    pthread_cond_broadcast(&b->wcond);
    pthread_mutex_unlock(&b->lock);
    if (on) /* it sleeps in 1 s waits or runs one encode: a bounded join */
        pthread_join(b->worker, NULL);
}

void gcoll_bk_on_wire(gcoll_bucketer_t *b, int on)
{
    pthread_mutex_lock(&b->lock);
    b->on_wire = on;
    if (on && b->worker_on)
        pthread_cond_signal(&b->wcond);
    pthread_mutex_unlock(&b->lock);
}

gcoll_status_t gcoll_bk_encodes_idle(gcoll_bucketer_t *b)
{
    uint64_t give_up = gcoll_time_ms() + (uint64_t)b->comm->cfg.timeout_ms;
    for (;;) {
        int busy = -1;
        for (int j = 0; j < b->nb && busy < 0; j++)
            if (b->bk[j].enc == ENC_BUSY)
                busy = j;
        if (busy < 0)
            return GCOLL_OK;
        if (gcoll_time_ms() > give_up) {
            gcoll_comm_set_error(b->comm,
                                 "gcoll_bucketer: the encode of %s did not end "
                                 "within GCOLL_TIMEOUT_MS",
                                 b->bk[busy].label);
            return GCOLL_ERR_TIMEOUT;
        }
        struct timespec ts = in_ms(100);
        pthread_cond_timedwait(&b->cond, &b->lock, &ts);
    }
}

gcoll_status_t gcoll_bk_encoded(gcoll_comm_t *comm, bucket_t *k)
{
    gcoll_bucketer_t *b = k->b;
    gcoll_status_t st = GCOLL_OK;
    pthread_mutex_lock(&b->lock);
    if (k->enc == ENC_NONE) { /* not taken yet: encode here rather than wait */
        encode_claimed(b, k);
        pthread_mutex_unlock(&b->lock);
        return GCOLL_OK;
    }
    uint64_t give_up = gcoll_time_ms() + (uint64_t)comm->cfg.timeout_ms;
    while (k->enc != ENC_DONE) {
        if (comm->abort_requested) {
            gcoll_comm_set_error(comm, "gcoll_comm_abort was called");
            st = GCOLL_ERR_ABORTED;
            break;
        }
        if (gcoll_time_ms() > give_up) {
            gcoll_comm_set_error(comm,
                                 "gcoll_bucketer: the encode of %s did not end within "
                                 "GCOLL_TIMEOUT_MS",
                                 k->label);
            st = GCOLL_ERR_TIMEOUT;
            break;
        }
        struct timespec ts = in_ms(100);
        pthread_cond_timedwait(&b->cond, &b->lock, &ts);
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

static gcoll_status_t submit(gcoll_bucketer_t *b, const char *label, gcoll_run_fn_t fn,
                             size_t count, gcoll_dtype_t dtype, void *ext, gcoll_request_t **req_p)
{
    gcoll_args_t a = {.count = count, .dtype = dtype, .op = b->cfg.op, .ext = ext};
    gcoll_request_t *req = gcoll_request_new(b->comm, label, fn, &a);
    if (!req)
        return GCOLL_ERR_NOMEM;
    return gcoll_comm_submit(b->comm, req, req_p);
}

/* Queues complete buckets. In launch order, each once its predecessors are queued (the same
 * order everywhere); with priorities, each as soon as it is complete, as a token. */
/* Bucket k complete here: the codec worker may take it. */
static gcoll_status_t to_worker(gcoll_bucketer_t *b, const bucket_t *k)
{
    if (!k->pre_ok || !b->pipeline)
        return GCOLL_OK;
    GCOLL_CHECK(gcoll_bk_worker_start(b));
    pthread_cond_signal(&b->wcond);
    return GCOLL_OK;
}

gcoll_status_t gcoll_bk_launch(gcoll_bucketer_t *b, const tensor_t *t)
{
    if (b->priority) {
        for (int j = t->bucket; j < t->bucket + t->nseg; j++) {
            bucket_t *k = &b->bk[j];
            if (k->nready != k->n || k->launched)
                continue;
            k->launched = 1;
            k->t_launch = (double)gcoll_time_ns() * 1e-9;
            GCOLL_CHECK(to_worker(b, k));
            GCOLL_CHECK(submit(b, "gcoll_bucketer bucket (by priority)", run_token, 0, GCOLL_INT32,
                               b, &b->tok[b->ntok]));
            b->ntok++;
            pthread_cond_broadcast(&b->cond);
        }
        return GCOLL_OK;
    }
    while (b->next_launch < b->nb && b->bk[b->next_launch].nready == b->bk[b->next_launch].n) {
        bucket_t *k = &b->bk[b->next_launch];
        k->t_launch = (double)gcoll_time_ns() * 1e-9;
        k->launched = 1;
        GCOLL_CHECK(to_worker(b, k));
        GCOLL_CHECK(submit(b, k->label, run_bucket, k->count, k->dtype, k, &k->req));
        b->next_launch++;
    }
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_bucketer_wait_tensor(gcoll_bucketer_t *b, int id)
{
    if (!b)
        return GCOLL_ERR_INVALID;
    pthread_mutex_lock(&b->lock);
    gcoll_status_t st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor",
                                              b->finalized && id >= 0 && id < b->nt,
                                              "no tensor %d (%d registered, %s)", id, b->nt,
                                              b->finalized ? "step started" : "no ready() yet");
    if (st == GCOLL_OK && !gcoll_bk_communicating(b)) { /* nothing travels this step */
        pthread_mutex_unlock(&b->lock);
        return GCOLL_OK;
    }
    if (st == GCOLL_OK)
        st = gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor", b->t[id].ready,
                                   "tensor '%s' is not marked ready this step", b->t[id].name);
    uint64_t give_up = gcoll_time_ms() + (uint64_t)b->comm->cfg.timeout_ms;
    int j0 = st == GCOLL_OK ? b->t[id].bucket : 0, j1 = st == GCOLL_OK ? j0 + b->t[id].nseg : 0;
    for (int j = j0; st == GCOLL_OK && j < j1; j++) {
        while (!b->bk[j].ran && st == GCOLL_OK) {
            if (gcoll_time_ms() > give_up) {
                st =
                    gcoll_comm_check_args(b->comm, "gcoll_bucketer_wait_tensor", 0,
                                          "%s not reduced within GCOLL_TIMEOUT_MS", b->bk[j].label);
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&b->cond, &b->lock, &ts);
        }
        if (st == GCOLL_OK)
            st = b->bk[j].st;
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}
