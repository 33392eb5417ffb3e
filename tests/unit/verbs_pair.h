/* verbs_pair.h: helpers shared by the verbs unit tests: two transports over the fake device. */
#ifndef VERBS_PAIR_H
#define VERBS_PAIR_H

#include <stddef.h>
#include <stdint.h>

#include "transports/verbs/verbs.h"

#define OPS gcoll_verbs_ops

typedef struct {
    gcoll_config_t cfg;
    gcoll_transport_t *t[2];
    int wake[2];
} pair_t;

typedef void (*tweak_fn)(gcoll_config_t *cfg);

typedef struct {
    gcoll_transport_t *t;
    const void *blobs[2];
    size_t lens[2];
    gcoll_status_t st;
} conn_arg_t;

/* Loads the configuration from the environment (a test failure if it does not load). */
void load_cfg(gcoll_config_t *cfg);
/* Creates rank `rank` of `size` with p's configuration and wake fd. */
gcoll_transport_t *make(pair_t *p, int rank, int size);
/* Connects a->t to its peers, storing the status in a->st (a thread's main). */
void *connect_main(void *arg);
/* Two ranks in one process, connected over loopback TCP and the fake device. */
pair_t *pair_open(tweak_fn tweak);
/* Destroys both transports and checks that every verbs object is gone. */
void pair_close(pair_t *p);
/* cmocka setup and teardown: install and remove the fake device. */
int setup(void **state);
int teardown(void **state);
/* Drives both sides until every request is done (5 s: a test failure). */
void drive(pair_t *p, gcoll_treq_t **reqs, int n);
/* Progresses both sides `rounds` times without waiting. */
void idle(pair_t *p, int rounds);
/* A request of signature 7. */
gcoll_treq_t req(int peer, uint64_t tag, void *buf, size_t len);
/* Sends len bytes from rank 0 to rank 1, receive posted first or not, and checks them. */
void check_transfer(pair_t *p, size_t len, int recv_first);

#endif /* VERBS_PAIR_H */
