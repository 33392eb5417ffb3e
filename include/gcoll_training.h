/* gcoll_training.h: local SGD with compressed deltas and the bounded-staleness parameter
 * server, part of gcoll's public API. Included by gcoll.h (include that): it uses gcoll.h's
 * types. Kept apart so that neither header grows past a reader's page count. */
#ifndef GCOLL_TRAINING_H
#define GCOLL_TRAINING_H

#ifndef GCOLL_H
#error "include gcoll.h, which includes gcoll_training.h"
#endif

/* ------------------------------------------------------------------------ */
/* Local SGD with compressed deltas (Qsparse-local-SGD, Basu et al. 2019)   */

/* Every rank takes local optimizer steps on its own data; every H-th step the model delta
 * since the last synchronisation, d = w_local - w_synced, goes through a compressed
 * allreduce with a per-tensor error-feedback residual e kept on this rank, and every rank
 * applies the same average: w_synced += avg(C(d + e)), w_local = w_synced. With H = 1 and
 * "none" it is synchronous data-parallel SGD. Full description: docs/local-sgd.md. */
typedef struct gcoll_localsgd gcoll_localsgd_t;

/* What happens to the optimizer's momentum buffers (registered with add_tensor) at a
 * synchronisation. With H = 1 all three equal synchronous SGD with momentum. */
typedef enum {
    GCOLL_LSGD_MOMENTUM_LOCAL = 0,  /* each rank keeps its own buffer (default; no traffic) */
    GCOLL_LSGD_MOMENTUM_RESET = 1,  /* buffers zeroed (restart from the averaged model) */
    GCOLL_LSGD_MOMENTUM_AVERAGE = 2 /* buffers averaged with a dense allreduce (fp32 bytes) */
} gcoll_lsgd_momentum_t;

typedef struct {
    int local_steps;        /* H: synchronise every H-th step (>= 1) */
    int warmup_steps;       /* the first warmup_steps steps synchronise every step, as
                             * PyTorch's PostLocalSGD; 0: H from the start */
    const char *compressor; /* codec spec of the delta (NULL: "none"); ef=0 turns the
                             * residual off */
    gcoll_lsgd_momentum_t momentum;
} gcoll_localsgd_config_t;

/* Creates the object on comm (which it uses for its syncs; the comm must outlive it).
 * GCOLL_ERR_INVALID for local_steps < 1, warmup_steps < 0, a bad momentum or codec spec
 * (the message is in gcoll_comm_last_error). Not collective; does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_create(gcoll_comm_t *comm,
                                                  const gcoll_localsgd_config_t *cfg,
                                                  gcoll_localsgd_t **ls_p);
/* Registers a parameter tensor of count floats (and its momentum buffer, or NULL), in
 * the same order on every rank, before the first step. Its current value becomes the
 * synced model: it must be the same on every rank (broadcast it first). id_p (may be
 * NULL) receives its index. GCOLL_ERR_INVALID after the first step or for NULL param. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_add_tensor(gcoll_localsgd_t *ls, float *param,
                                                      float *momentum, size_t count, int *id_p);
/* Call after each local optimizer step. Every H-th call (every call during warm-up)
 * synchronises as above and blocks until the params hold the new synced model; *synced_p
 * (may be NULL) receives 1 then, else 0. Collective at those calls: every rank must call
 * step the same number of times. Finishes a pending istep synchronisation first. Returns
 * the collective's error (the communicator is then broken). */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_step(gcoll_localsgd_t *ls, int *synced_p);
/* Nonblocking form: at a synchronising call it snapshots the deltas, queues the compressed
 * allreduces on the progress thread and returns (*started_p = 1). The caller may keep
 * stepping the params meanwhile; gcoll_localsgd_wait (or the next step/istep/sync) applies
 * the result, keeping the local progress made since the snapshot on top of the new synced
 * model: w_local += avg - d. Does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_istep(gcoll_localsgd_t *ls, int *started_p);
/* Completes a pending istep synchronisation (GCOLL_OK at once when none). Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_wait(gcoll_localsgd_t *ls);
/* Synchronises now, off the schedule (before an evaluation or a checkpoint), when any
 * step was taken since the last sync; the schedule restarts from here. Collective. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_sync(gcoll_localsgd_t *ls);

typedef struct {
    uint64_t steps; /* step/istep calls so far */
    uint64_t syncs; /* synchronisations (scheduled and forced) */
    int period;     /* H in force for the next step (1 during warm-up) */
    int since_sync; /* steps since the last synchronisation */
    int ntensors;
} gcoll_localsgd_info_t;
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_info(const gcoll_localsgd_t *ls,
                                                gcoll_localsgd_info_t *info_p);
/* Checkpointing (state_dict): copies tensor id's synced model and residual (zeros when the
 * codec keeps none) into synced and residual (count floats each; either may be NULL). */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_get_tensor(const gcoll_localsgd_t *ls, int id,
                                                      float *synced, float *residual);
/* Restores what get_tensor returned (NULL leaves that part as it is), and with
 * gcoll_localsgd_set_counters the step and sync counts; no sync may be pending.
 * GCOLL_ERR_INVALID for a bad id, NaN/Inf, or a codec without residual given one. */
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_set_tensor(gcoll_localsgd_t *ls, int id,
                                                      const float *synced, const float *residual);
GCOLL_EXPORT gcoll_status_t gcoll_localsgd_set_counters(gcoll_localsgd_t *ls, uint64_t steps,
                                                        uint64_t syncs, int since_sync);
/* Waits for a pending sync (its error is lost), then frees. NULL is a no-op. */
GCOLL_EXPORT void gcoll_localsgd_destroy(gcoll_localsgd_t *ls);

/* ------------------------------------------------------------------------ */
/* Bounded-staleness asynchronous training: an in-job sharded parameter server */

/* Every rank is a worker and owns a shard of every registered tensor (the balanced split
 * gcoll_shard_range gives). Its server part runs as one long operation on the
 * communicator's progress thread, from gcoll_ps_start to gcoll_ps_finish. A worker pulls
 * the model, computes, and pushes its update compressed (residual per shard kept on the
 * worker) to each shard's owner. SSP's clock bound (Ho et al. 2013): a worker at clock c
 * (c updates pushed) reads only once every shard has all updates of clocks < c - S, so it
 * computes at most S clocks ahead of the slowest worker; S = 0 is synchronous SGD. Each
 * clock's updates are applied when all have arrived, each weighted lr f(tau) / P with
 * tau = c - (the shard's clock when the worker read it), f(tau) = 1/(1+tau) by default
 * (Zhang et al. 2016). Full description: docs/local-sgd.md. */
typedef struct gcoll_ps gcoll_ps_t;

typedef enum {
    GCOLL_PS_WEIGHT_INVERSE = 0, /* f(tau) = 1/(1+tau) */
    GCOLL_PS_WEIGHT_NONE = 1     /* f(tau) = 1 */
} gcoll_ps_weight_t;

typedef struct {
    int staleness;          /* S >= 0 (at most 1000) */
    float lr;               /* the server's step size */
    const char *compressor; /* codec of the pushes (NULL: "none") */
    gcoll_ps_weight_t weighting;
    /* codec of the pull answers (NULL or "none": the dense fp32 shard). Otherwise the
     * owner keeps a copy of the model each worker holds and sends the compressed change,
     * keeping what it did not send for the next answer (error feedback on the owner);
     * top-k, quantizers, fp16 (not random-k or DGC). */
    const char *pull_compressor;
    /* > 0: DC-ASGD's delay compensation (Zheng et al. 2017), applied by the owner when an
     * update g arrives: g += dc_lambda g*g*(w_now - w_read), w_read the model the worker
     * holds. 0: off. */
    float dc_lambda;
    /* 1: pull installs the model asked for at the previous pull and at once asks the owners
     * for the next clock's, so the answers travel and the owners serve them while the
     * worker computes (Ho et al. 2013's prefetch). The next model then lacks this worker's
     * last update, one clock of staleness more; the bound S still holds. 0: pull asks and
     * waits. */
    int prefetch;
} gcoll_ps_config_t;

/* Creates the server over comm. GCOLL_ERR_INVALID for a bad config (message in
 * gcoll_comm_last_error). Not collective. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_create(gcoll_comm_t *comm, const gcoll_ps_config_t *cfg,
                                            gcoll_ps_t **ps_p);
/* Registers a tensor (same order and counts on every rank) before start; its current
 * value, which must be the same on every rank, initializes the shards. pull writes the
 * model into param; finish leaves the final model there on every rank. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_add_tensor(gcoll_ps_t *ps, float *param, size_t count,
                                                int *id_p);
/* Queues the server operation. Collective (ordered as the collectives are); after it, no
 * other call may be issued on comm until gcoll_ps_finish returns. Does not block. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_start(gcoll_ps_t *ps);
/* Reads the model into the params for this worker's next clock: blocks until every
 * shard's owner answers, which SSP's bound may delay (with prefetch: the answers to the
 * previous pull's request, usually already there). Errors: the server operation's
 * (GCOLL_ERR_PEER, GCOLL_ERR_TIMEOUT, ...), also raised on every other rank. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_pull(gcoll_ps_t *ps);
/* Pushes this worker's update for its clock (grads[i]: count floats of tensor i, e.g. the
 * gradient or the momentum buffer) and advances the clock. Encodes on the caller's thread
 * and returns; the sends run on the progress thread. GCOLL_ERR_INVALID for NaN/Inf or a
 * push without a pull before it. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_push(gcoll_ps_t *ps, const float *const *grads);
/* Ends this worker's part and waits until every worker has finished and every update is
 * applied (all workers must push the same number of clocks), then gathers the final
 * model into the params. Collective. Blocks. */
GCOLL_EXPORT gcoll_status_t gcoll_ps_finish(gcoll_ps_t *ps);

typedef struct {
    uint64_t clock;        /* this worker's pushes */
    uint64_t max_gap;      /* after finish: the most clocks any worker was ahead of the
                            * slowest shard it read (<= S); before: this worker's */
    uint64_t applied;      /* updates applied (after finish: over all shards and ranks) */
    double mean_staleness; /* mean tau of the applied updates */
    uint64_t hist[9];      /* updates applied with tau = 0..7, and >= 8 */
    double wait_s;         /* time this worker waited in pull */
} gcoll_ps_stats_t;
GCOLL_EXPORT gcoll_status_t gcoll_ps_stats(const gcoll_ps_t *ps, gcoll_ps_stats_t *stats_p);
/* Frees. A server still running is aborted (the communicator is then broken). */
GCOLL_EXPORT void gcoll_ps_destroy(gcoll_ps_t *ps);

#endif /* GCOLL_TRAINING_H */
