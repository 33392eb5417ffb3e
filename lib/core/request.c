/* request.c: a queued operation's request: its memory (a few freed ones kept per
 * communicator for reuse) and its fields. */
#include <stdlib.h>

#include "core/comm.h"

/* Memory for a request on the heap: one of the freed ones kept for reuse (a group's send,
 * receive and the group itself are three), else a fresh one; NULL on ENOMEM. */
static gcoll_request_t *request_alloc(gcoll_comm_t *comm)
{
    gcoll_request_t *req = NULL;
    /* a look before the exchange: a locked instruction on an empty slot cost as much as a
     * full one (a group of a send and a receive took six exchanges per call) */
    for (int i = 0; i < GCOLL_REQ_CACHE && !req; i++)
        if (__atomic_load_n(&comm->req_cache[i], __ATOMIC_RELAXED))
            req = __atomic_exchange_n(&comm->req_cache[i], NULL, __ATOMIC_ACQUIRE);
    return req ? req : malloc(sizeof(*req));
}

gcoll_request_t *gcoll_request_new(gcoll_comm_t *comm, const char *name, gcoll_run_fn_t run,
                                   const gcoll_args_t *args)
{
    gcoll_request_t *req = request_alloc(comm);
    if (!req)
        return NULL;
    gcoll_request_init(req, comm, name, run, args);
    req->stacked = 0;
    return req;
}

/* The caller has just written *src field by field (4-byte stores for the ints): read it
 * the same way. A struct copy read it in 16-byte pieces, and a load that spans several
 * stores still in flight waits for them all (a stalled store forward: 5% of a blocking
 * 8-byte sendrecv over shared memory). The barriers keep the compiler from merging the
 * reads again. */
static void copy_args(gcoll_args_t *dst, const gcoll_args_t *src)
{
    dst->sendbuf = src->sendbuf;
    dst->recvbuf = src->recvbuf;
    dst->count = src->count;
    __asm__ volatile("" ::: "memory");
    dst->dtype = src->dtype;
    __asm__ volatile("" ::: "memory");
    dst->op = src->op;
    __asm__ volatile("" ::: "memory");
    dst->root = src->root;
    __asm__ volatile("" ::: "memory");
    dst->kind = src->kind;
    __asm__ volatile("" ::: "memory");
    dst->ext = src->ext;
    dst->release = src->release;
}

void gcoll_request_init(gcoll_request_t *req, gcoll_comm_t *comm, const char *name,
                        gcoll_run_fn_t run, const gcoll_args_t *args)
{
    /* field by field: a compound literal cleared the whole request first (rep stos,
     * a few percent of a blocking 8-byte reduce over shared memory) */
    req->comm = comm;
    req->run = run;
    req->name = name;
    copy_args(&req->a, args);
    req->status = GCOLL_INPROGRESS;
    req->done = 0;
    req->blocking = 0;
    req->noseq = 0;
    req->grouped = 0;
    req->stacked = 1;
    req->next = NULL;
}

void gcoll_request_free(gcoll_request_t *req)
{
    if (req->a.release)
        req->a.release(req->a.ext);
    if (req->stacked)
        return;
    for (int i = 0; i < GCOLL_REQ_CACHE; i++) {
        gcoll_request_t *none = NULL;
        if (!__atomic_load_n(&req->comm->req_cache[i], __ATOMIC_RELAXED) &&
            __atomic_compare_exchange_n(&req->comm->req_cache[i], &none, req, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return;
    }
    free(req);
}
