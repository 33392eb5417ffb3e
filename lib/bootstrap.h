/* bootstrap.h: rendezvous at GCOLL_ROOT: every rank sends rank 0 its transport address
 * and settings, rank 0 checks that all agree and returns the full address table. */
#ifndef GCOLL_BOOTSTRAP_H
#define GCOLL_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "gcoll.h"

typedef struct gcoll_bootstrap gcoll_bootstrap_t;

/* Rank 0 listens at root ("host:port", "[v6]:port"); other ranks connect (retrying until
 * the deadline while nobody listens) and authenticate with the job key. */
gcoll_status_t gcoll_bootstrap_open(int rank, int size, const char *root, const gcoll_key_t *key,
                                    uint64_t deadline_ms, gcoll_bootstrap_t **bs_p, char *err,
                                    size_t errlen);

/* IP address of this host on the interface that routes to the root. */
const char *gcoll_bootstrap_local_ip(const gcoll_bootstrap_t *bs);

/* Exchanges address blobs and must-match settings. On success *blobs_p holds size blobs
 * (lens in *lens_p), all in one allocation to free() with the pointer array. */
gcoll_status_t gcoll_bootstrap_exchange(gcoll_bootstrap_t *bs, const char *match, const void *blob,
                                        size_t len, void ***blobs_p, size_t **lens_p,
                                        uint64_t deadline_ms, char *err, size_t errlen);

void gcoll_bootstrap_close(gcoll_bootstrap_t *bs);

/* Splits "host:port" / "[v6]:port" into host and port. 0 on success. */
int gcoll_split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen);

#endif /* GCOLL_BOOTSTRAP_H */
