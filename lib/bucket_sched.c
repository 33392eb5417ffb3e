/* bucket_sched.c: when and in which order the bucketer's buckets run on the progress
 * thread -- in launch order, or by priority with the ranks agreeing on what is ready --
 * and the wait for one tensor's result. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bucketer_int.h"
#include "log.h"
#include "coll.h"
#include "util.h"

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
 * tiny MIN allreduce of launched flags, so all run the same bucket even when their ready()
 * timings differ; the last bucket of a step needs no agreement. */
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
            GCOLL_CHECK(gcoll_ring_allreduce_at(comm, f, (size_t)b->nb, GCOLL_INT32, GCOLL_MIN, sig,
                                                NEGOTIATE_SUB + ((round & 0xfffu) << 16)));
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
gcoll_status_t gcoll_bk_launch(gcoll_bucketer_t *b, const tensor_t *t)
{
    if (b->priority) {
        for (int j = t->bucket; j < t->bucket + t->nseg; j++) {
            bucket_t *k = &b->bk[j];
            if (k->nready != k->n || k->launched)
                continue;
            k->launched = 1;
            k->t_launch = (double)gcoll_time_ns() * 1e-9;
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
