/* ps_int.h: the parameter server's state, shared by its server part (lib/training/ps.c, on
 * the progress thread) and its worker part (lib/training/ps_worker.c, the caller's thread).
 * Internal. */
#ifndef GCOLL_PS_INT_H
#define GCOLL_PS_INT_H

#include <pthread.h>

#include "core/comm.h"
#include "training/ps_wire.h"
#include "training/ssp.h"

typedef struct {
    float *param;
    size_t count;
    size_t *off, *len;         /* per owner */
    size_t soff;               /* this rank's slice within its shard */
    float *stage;              /* with prefetch: where answers land until the next pull */
    float *own;                /* with prefetch: the last push as its owner decodes it */
    gcoll_tensor_state_t **st; /* per owner: the worker's residual of that slice */
} ps_tensor_t;

typedef struct ps_msg {
    struct ps_msg *next;
    int peer, kind;
    uint8_t *buf;
    size_t len, cap;
    gcoll_treq_t req;
} ps_msg_t;

struct gcoll_ps {
    gcoll_comm_t *comm;
    gcoll_ps_config_t cfg;
    gcoll_compressor_t *comp;  /* pushes */
    gcoll_compressor_t *pcomp; /* pulls; NULL: dense fp32 */
    ps_tensor_t *t;
    int n, cap, P, rank;
    size_t shard_n;
    int started;
    /* worker side: the caller's thread; kread is written by the server thread during a
     * pull, while the worker waits */
    uint64_t clock, max_gap;
    int pulled;
    uint64_t *kread;
    uint64_t *kuse;   /* per owner: the shard clock of the model in the params */
    int prefetched;   /* a prefetch request is out: pull waits for its answers */
    float *stage;     /* with prefetch: every tensor's staging copy, concatenated */
    float *own;       /* with prefetch: every tensor's last push, decoded, concatenated */
    float *own_scale; /* per owner: the step its owner applies that push with */
    double wait_s;
    /* mailbox, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    ps_msg_t *q_head, *q_tail;
    int server_asleep; /* the server waits in the transport: a new message must wake it */
    int pull_left;
    gcoll_status_t err;
    gcoll_request_t *req;
    /* server side: the progress thread only */
    gcoll_ssp_shard_t sh;
    uint64_t *pull_want, *done_clock;
    int ndone;
    float *tmp;     /* decoded push */
    float *scratch; /* w - view of a compressed pull answer */
    /* recycled messages, under pool_lock */
    pthread_mutex_t pool_lock;
    ps_msg_t *pool;
    int pool_n;
    size_t pool_bytes, model_bytes;
    /* after finish */
    gcoll_ps_stats_t fin;
    int finished;
};

/* A message of cap bytes (recycled when one fits), and its return to the pool. Any thread. */
ps_msg_t *gcoll_ps_msg_new(gcoll_ps_t *ps, int peer, int kind, size_t cap);
void gcoll_ps_msg_free(gcoll_ps_t *ps, ps_msg_t *m);
/* Appends first..last to the mailbox and wakes the server if it sleeps. Under ps->lock. */
void gcoll_ps_enqueue(gcoll_ps_t *ps, ps_msg_t *first, ps_msg_t *last);
/* Owner o's slice counts of every tensor, into cnt[0..n). */
void gcoll_ps_counts(const gcoll_ps_t *ps, int o, size_t *cnt);
/* Size of owner o's largest pull answer. */
size_t gcoll_ps_reply_cap(const gcoll_ps_t *ps, int o);
/* As a worker: owner o's answer lands in the params. */
gcoll_status_t gcoll_ps_take_reply(gcoll_ps_t *ps, int o, const uint8_t *b, size_t len);
gcoll_status_t gcoll_ps_invalid(gcoll_comm_t *comm, const char *what, const char *msg);

#endif
