/* split.c: gcoll_comm_split and gcoll_comm_dup. A child communicator is built over its
 * parent instead of a rendezvous: every rank creates the child's transport instance, the
 * parent (whose connections are authenticated by the job key) allgathers the address
 * blobs, and each child connects to its members' blobs with the same key. The child has
 * its own transport, queue, progress thread, sequence and failure state, so its
 * collectives and failures are independent of the parent's and of its siblings'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/ops.h"
#include "base/log.h"
#include "base/util.h"

#define BLOB_MAX 4096

typedef struct {
    int64_t color, key;
    int rank; /* in the parent */
} member_t;

static int member_cmp(const void *a, const void *b)
{
    const member_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank - y->rank;
}

/* This rank's part of the child: allocation, identity, key and a transport instance
 * whose address blob goes into blob (zeroed beyond it). */
static gcoll_status_t child_create(gcoll_comm_t *parent, int size, int rank, gcoll_comm_t **child_p,
                                   uint8_t *blob, size_t *blen_p, char *err, size_t errlen)
{
    gcoll_comm_t *c = NULL;
    gcoll_status_t st = gcoll_comm_alloc(&c, err, errlen);
    *child_p = c;
    if (st != GCOLL_OK)
        return st;
    c->rank = rank;
    c->size = size;
    c->chan.ops = parent->chan.ops;
    snprintf(c->local_ip, sizeof(c->local_ip), "%s", parent->local_ip);
    GCOLL_CHECK(gcoll_comm_set_key(c, parent->keybuf));
    gcoll_transport_params_t tp = {.rank = rank,
                                   .size = size,
                                   .cfg = &c->cfg,
                                   .local_ip = c->local_ip,
                                   .key = c->key,
                                   .wake_fd = c->wake_fd};
    st = c->chan.ops->create(&tp, &c->chan.tp);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "cannot create the %s transport on %s", c->chan.ops->name,
                 c->local_ip);
        return st;
    }
    size_t len = BLOB_MAX;
    st = c->chan.ops->address(c->chan.tp, blob, &len);
    if (st != GCOLL_OK) {
        snprintf(err, errlen, "%s", c->chan.ops->last_error(c->chan.tp));
        return st;
    }
    *blen_p = len; /* sent padded with zeros to whole 4-byte words */
    return GCOLL_OK;
}

/* The members of this rank's color in the child's rank order (key, then parent rank), from
 * every rank's (color, key) pair; returns this rank's place among them (-1 without a color). */
static int split_members(const int64_t *pairs, int P, int color, int rank, member_t *m, int *n_p)
{
    int n = 0, newrank = -1;
    for (int r = 0; r < P && color >= 0; r++)
        if (pairs[2 * r] == color)
            m[n++] = (member_t){pairs[2 * r], pairs[2 * r + 1], r};
    qsort(m, (size_t)n, sizeof(*m), member_cmp);
    for (int i = 0; i < n; i++)
        if (m[i].rank == rank)
            newrank = i;
    *n_p = n;
    return newrank;
}

/* The allgatherv layout of the blobs (4-byte words) from their lengths; a length of -1 (or
 * out of range) is a rank that could not make its part: lst, else GCOLL_ERR_PEER. */
static gcoll_status_t split_layout(const int64_t *lens, int P, gcoll_status_t lst, size_t *counts,
                                   size_t *displs, size_t *total_p, char *err, size_t errlen)
{
    size_t total = 0;
    for (int r = 0; r < P; r++) {
        if (lens[r] < 0 || lens[r] > BLOB_MAX) {
            if (!*err)
                snprintf(err, errlen,
                         "rank %d could not create its part of the new "
                         "communicator",
                         r);
            return lst != GCOLL_OK ? lst : GCOLL_ERR_PEER;
        }
        counts[r] = ((size_t)lens[r] + 3) / 4;
        displs[r] = total;
        total += counts[r];
    }
    *total_p = total;
    return GCOLL_OK;
}

/* Connects the child's transport to its members' blobs (in all, at the parent ranks'
 * displacements). */
static gcoll_status_t split_connect(gcoll_comm_t *child, const member_t *m, int n,
                                    const uint8_t *all, const size_t *displs, const int64_t *lens,
                                    char *err, size_t errlen)
{
    const void **blobs = calloc((size_t)n, sizeof(*blobs));
    size_t *blens = calloc((size_t)n, sizeof(*blens));
    if (!blobs || !blens) {
        free(blobs);
        free(blens);
        return GCOLL_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        blobs[i] = all + 4 * displs[m[i].rank];
        blens[i] = (size_t)lens[m[i].rank];
    }
    uint64_t deadline = gcoll_time_ms() + (uint64_t)child->cfg.timeout_ms;
    gcoll_status_t st = child->chan.ops->connect(child->chan.tp, blobs, blens, deadline);
    free(blobs);
    free(blens);
    if (st != GCOLL_OK)
        snprintf(err, errlen, "%s", child->chan.ops->last_error(child->chan.tp));
    return st;
}

gcoll_status_t gcoll_comm_split(gcoll_comm_t *comm, int color, int key, gcoll_comm_t **newcomm_p)
{
    if (!comm || !newcomm_p)
        return GCOLL_ERR_INVALID;
    if (gcoll_comm_in_group(comm)) {
        GCOLL_WARN("gcoll_comm_split: called inside an open group (call gcoll_group_end first)");
        return GCOLL_ERR_INVALID;
    }
    const int P = comm->size;
    char err[1024] = "";
    gcoll_status_t st, lst = GCOLL_OK;
    member_t *m = calloc((size_t)P, sizeof(*m));
    int64_t *pairs = calloc(2 * (size_t)P, sizeof(*pairs));
    int64_t *lens = calloc((size_t)P, sizeof(*lens));
    size_t *counts = calloc((size_t)P, sizeof(*counts)),
           *displs = calloc((size_t)P, sizeof(*displs));
    uint8_t *blob = calloc(1, BLOB_MAX + 4), *all = NULL;
    gcoll_comm_t *child = NULL;
    if (!m || !pairs || !lens || !counts || !displs || !blob) {
        st = GCOLL_ERR_NOMEM; /* before any message: the peers time out in the allgather */
        goto out;
    }
    int64_t mine[2] = {color < 0 ? -1 : color, key};
    if ((st = gcoll_op_iallgather(comm, "gcoll_comm_split", mine, pairs, 2, GCOLL_INT64, NULL)) !=
        GCOLL_OK)
        goto out;
    int n = 0, newrank = split_members(pairs, P, color, comm->rank, m, &n);
    size_t blen = 0;
    if (color >= 0)
        lst = child_create(comm, n, newrank, &child, blob, &blen, err, sizeof(err));
    /* Every rank learns whether every other could make its part: one that could not
     * announces -1, and then all give up together instead of waiting in connect. */
    int64_t l = lst == GCOLL_OK ? (int64_t)blen : -1;
    if ((st = gcoll_op_iallgather(comm, "gcoll_comm_split", &l, lens, 1, GCOLL_INT64, NULL)) !=
        GCOLL_OK)
        goto out;
    size_t total = 0;
    if ((st = split_layout(lens, P, lst, counts, displs, &total, err, sizeof(err))) != GCOLL_OK)
        goto out;
    if (!(all = malloc(total * 4 + 4))) {
        st = GCOLL_ERR_NOMEM;
        goto out;
    }
    st = gcoll_op_iallgatherv(comm, "gcoll_comm_split", GCOLL_KIND_ALLGATHERV, blob, (blen + 3) / 4,
                              all, counts, displs, GCOLL_INT32, NULL);
    if (st != GCOLL_OK || color < 0)
        goto out;
    if ((st = split_connect(child, m, n, all, displs, lens, err, sizeof(err))) != GCOLL_OK)
        goto out;
    st = gcoll_comm_start(child, NULL, err, sizeof(err));
    if (st == GCOLL_OK)
        GCOLL_INFO(GCOLL_SUBSYS_INIT,
                   "split: color %d key %d: rank %d of %d (rank %d of %d "
                   "in the parent)",
                   color, key, newrank, n, comm->rank, P);
out:
    if (st != GCOLL_OK) {
        GCOLL_WARN("gcoll_comm_split failed: %s%s%s", gcoll_status_string(st), *err ? ": " : "",
                   *err ? err : gcoll_comm_last_error(comm));
        if (child)
            gcoll_comm_free(child);
        child = NULL;
    } else {
        *newcomm_p = child; /* NULL for GCOLL_SPLIT_NOCOLOR */
    }
    free(m);
    free(pairs);
    free(lens);
    free(counts);
    free(displs);
    free(blob);
    free(all);
    return st;
}

gcoll_status_t gcoll_comm_dup(gcoll_comm_t *comm, gcoll_comm_t **newcomm_p)
{
    if (!comm)
        return GCOLL_ERR_INVALID;
    return gcoll_comm_split(comm, 0, comm->rank, newcomm_p);
}
