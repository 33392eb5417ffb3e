/* bootstrap.h: rendezvous at GCOLL_ROOT: every rank sends rank 0 its transport address
 * and settings, rank 0 checks that all agree and returns the full address table. */
#ifndef GCOLL_BOOTSTRAP_H
#define GCOLL_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "base/auth.h"
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

/* The rendezvous messages' wire forms (little-endian), parsed without sockets so that
 * they can be fuzzed (tests/fuzz). A parse returns 1 when the message is complete in the
 * first *need bytes of buf, 0 when it needs *need bytes (always more than len) to go on,
 * -1 when it is malformed (*why says how). Parsed views point into buf.
 *   hello: magic "GCB1", rank u32, size u32, settings hash u64, version char[16],
 *          match string (u16 length + bytes), address blob (u32 length + bytes)
 *   reply: magic "GCB2", status i32, message (u16 length + bytes), entries u32, then
 *          that many address blobs (u32 length + bytes each); no entries unless status 0 */
#define GCOLL_BS_MAX_FIELD 4096
typedef struct {
    uint32_t rank, size;
    uint64_t hash;
    char version[16];  /* NUL-terminated */
    const char *match; /* not NUL-terminated */
    size_t mlen;
    const uint8_t *blob;
    size_t blen;
} gcoll_bs_hello_t;
int gcoll_bs_hello_parse(const uint8_t *buf, size_t len, gcoll_bs_hello_t *h, size_t *need,
                         const char **why);
/* Writes h to buf (NULL: only counts) and returns its length. */
size_t gcoll_bs_hello_encode(const gcoll_bs_hello_t *h, uint8_t *buf);

typedef struct {
    int32_t status;
    const char *msg; /* not NUL-terminated */
    size_t mlen;
    uint32_t n;           /* address blobs in the table */
    const uint8_t *table; /* n times (u32 length + blob) */
    size_t tlen;
} gcoll_bs_reply_t;
/* max_n: the most entries accepted (the job's size). */
int gcoll_bs_reply_parse(const uint8_t *buf, size_t len, uint32_t max_n, gcoll_bs_reply_t *r,
                         size_t *need, const char **why);

/* Splits "host:port" / "[v6]:port" into host and port. 0 on success. */

#endif /* GCOLL_BOOTSTRAP_H */
