/* gather.c: allgather(v), reduce-scatter and alltoall(v): entry points and their plans on
 * the ring engine (allgather, reduce-scatter) or pairwise exchange (alltoall). */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "reduce.h"
#include "util.h"

static int dtype_ok(gcoll_dtype_t d) { return d >= GCOLL_FLOAT32 && d <= GCOLL_INT64; }

/* Arrays of per-rank counts and displacements, copied so nonblocking callers may reuse
 * theirs at once. */
typedef struct {
    size_t *rcounts, *rdispls, *scounts, *sdispls;
    size_t storage[];
} vargs_t;

static vargs_t *vargs_new(int P, const size_t *rc, const size_t *rd, const size_t *sc,
                          const size_t *sd)
{
    vargs_t *v = calloc(1, sizeof(*v) + 4 * (size_t)P * sizeof(size_t));
    if (!v)
        return NULL;
    const size_t *src[4] = {rc, rd, sc, sd};
    size_t **dst[4] = {&v->rcounts, &v->rdispls, &v->scounts, &v->sdispls};
    for (int k = 0; k < 4; k++) {
        if (!src[k])
            continue;
        *dst[k] = v->storage + (size_t)k * P;
        memcpy(*dst[k], src[k], (size_t)P * sizeof(size_t));
    }
    return v;
}

static gcoll_status_t submit(gcoll_comm_t *comm, const char *what, gcoll_run_fn_t run,
                             gcoll_args_t *a, gcoll_request_t **req_p)
{
    gcoll_request_t *req = gcoll_request_new(comm, what, run, a);
    if (!req) {
        if (a->release)
            a->release(a->ext);
        return GCOLL_ERR_NOMEM;
    }
    return gcoll_comm_submit(comm, req, req_p);
}

/* Checks shared by every entry point here. */
static gcoll_status_t check_base(gcoll_comm_t *comm, const char *what, gcoll_dtype_t dtype)
{
    if (!comm) {
        GCOLL_WARN("%s: NULL communicator", what);
        return GCOLL_ERR_INVALID;
    }
    return gcoll_comm_check_args(comm, what, dtype_ok(dtype), "unknown dtype %d", (int)dtype);
}

/* Bytes of count elements, or an error if that overflows. */
static gcoll_status_t check_bytes(gcoll_comm_t *comm, const char *what, size_t count,
                                  size_t esz, size_t mult)
{
    size_t b;
    int ok = gcoll_mul_size(count, esz, &b) == 0 && gcoll_mul_size(b, mult, &b) == 0 &&
             b < ((size_t)1 << 62);
    return gcoll_comm_check_args(comm, what, ok, "count %zu is too large", count);
}

/* Signature over the call kind, dtype and a per-rank count table every rank shares. */
static uint32_t table_sig(int kind, const size_t *counts, int P, gcoll_dtype_t dtype)
{
    uint64_t h = counts ? gcoll_hash64(counts, (size_t)P * sizeof(size_t), 0) : 0;
    return gcoll_call_sig(kind, (size_t)h, dtype, 0, 0);
}

/* ---- allgather(v) ---------------------------------------------------------------- */

static gcoll_status_t run_allgatherv(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const vargs_t *v = a->ext;
    const int P = comm->size, r = comm->rank;
    const size_t esz = gcoll_dtype_size(a->dtype);
    uint8_t *recv = a->recvbuf;
    if (a->sendbuf != recv + v->rdispls[r] * esz && v->rcounts[r])
        memmove(recv + v->rdispls[r] * esz, a->sendbuf, v->rcounts[r] * esz);
    gcoll_span_t *seg = calloc((size_t)P, sizeof(*seg));
    if (!seg)
        return GCOLL_ERR_NOMEM;
    size_t total = 0;
    for (int i = 0; i < P; i++) {
        seg[i] = (gcoll_span_t){v->rdispls[i] * esz, v->rcounts[i] * esz};
        total += seg[i].len;
    }
    gcoll_ring_plan_t plan = {.buf = recv, .seg = seg, .esz = esz, .dtype = a->dtype,
                              .ag_steps = (size_t)P - 1, .ag_shift = 0,
                              .sig = table_sig(a->kind, v->rcounts, P, a->dtype)};
    gcoll_status_t st = gcoll_ring_run(comm, &plan);
    free(seg);
    comm->chan.counters.bytes_raw += total;
    return st;
}

static gcoll_status_t allgatherv(gcoll_comm_t *comm, const char *what, int kind,
                                 const void *sendbuf, size_t sendcount, void *recvbuf,
                                 const size_t *recvcounts, const size_t *displs,
                                 gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_base(comm, what, dtype));
    const int P = comm->size;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, recvcounts && displs,
                                      "NULL recvcounts or displs"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, recvcounts[comm->rank] == sendcount,
                                      "sendcount %zu differs from recvcounts[%d] = %zu",
                                      sendcount, comm->rank, recvcounts[comm->rank]));
    size_t total = 0, esz = gcoll_dtype_size(dtype);
    for (int i = 0; i < P; i++) {
        GCOLL_CHECK(check_bytes(comm, what, recvcounts[i] + displs[i], esz, 1));
        total += recvcounts[i];
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, (sendcount == 0 || sendbuf) &&
                                                      (total == 0 || recvbuf),
                                      "NULL buffer with a non-zero count"));
    /* Blocks must not overlap, or the ring would overwrite data it still forwards. */
    for (int i = 0; i < P; i++)
        for (int j = i + 1; j < P; j++)
            GCOLL_CHECK(gcoll_comm_check_args(
                comm, what, !recvcounts[i] || !recvcounts[j] ||
                                displs[i] + recvcounts[i] <= displs[j] ||
                                displs[j] + recvcounts[j] <= displs[i],
                "blocks of ranks %d and %d overlap", i, j));
    vargs_t *v = vargs_new(P, recvcounts, displs, NULL, NULL);
    if (!v)
        return GCOLL_ERR_NOMEM;
    gcoll_args_t a = {.sendbuf = sendbuf, .recvbuf = recvbuf, .count = sendcount,
                      .dtype = dtype, .kind = kind, .ext = v, .release = free};
    return submit(comm, what, run_allgatherv, &a, req_p);
}

gcoll_status_t gcoll_iallgatherv(gcoll_comm_t *comm, const void *sendbuf, size_t sendcount,
                                 void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                 gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    return allgatherv(comm, "gcoll_allgatherv", GCOLL_KIND_ALLGATHERV, sendbuf, sendcount,
                      recvbuf, recvcounts, displs, dtype, req_p);
}

gcoll_status_t gcoll_allgatherv(gcoll_comm_t *comm, const void *sendbuf, size_t sendcount,
                                void *recvbuf, const size_t *recvcounts, const size_t *displs,
                                gcoll_dtype_t dtype)
{
    return gcoll_iallgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype, NULL);
}

gcoll_status_t gcoll_iallgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t sendcount, gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    const char *what = "gcoll_allgather";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(check_bytes(comm, what, sendcount, gcoll_dtype_size(dtype), (size_t)comm->size));
    size_t *tab = malloc(2 * (size_t)comm->size * sizeof(size_t));
    if (!tab)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < comm->size; i++) {
        tab[i] = sendcount;
        tab[comm->size + i] = (size_t)i * sendcount;
    }
    gcoll_status_t st = allgatherv(comm, what, GCOLL_KIND_ALLGATHER, sendbuf, sendcount, recvbuf,
                                   tab, tab + comm->size, dtype, req_p);
    free(tab);
    return st;
}

gcoll_status_t gcoll_allgather(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t sendcount, gcoll_dtype_t dtype)
{
    return gcoll_iallgather(comm, sendbuf, recvbuf, sendcount, dtype, NULL);
}

/* ---- reduce-scatter ---------------------------------------------------------------- */

/* Staged in slices of GCOLL_RING_SLICE: block i's slice is segment i of a work buffer,
 * the ring leaves segment r fully reduced here (rs_shift = -1), and it is copied out. */
static gcoll_status_t run_reduce_scatter(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const size_t P = (size_t)comm->size, r = (size_t)comm->rank, n = a->count;
    const size_t esz = gcoll_dtype_size(a->dtype);
    const uint8_t *send = a->sendbuf;
    uint8_t *recv = a->recvbuf;
    if (n == 0)
        return GCOLL_OK;
    if (P == 1) {
        if (send != recv)
            memmove(recv, send, n * esz);
        return GCOLL_OK;
    }
    size_t sl = GCOLL_MIN(n, GCOLL_MAX(comm->cfg.coll.ring_slice / esz / P, (size_t)1));
    uint8_t *work = malloc(2 * P * sl * esz), *tmp = work ? work + P * sl * esz : NULL;
    gcoll_span_t *seg = calloc(P, sizeof(*seg));
    gcoll_status_t st = GCOLL_ERR_NOMEM;
    if (!work || !seg)
        goto out;
    gcoll_ring_plan_t plan = {.buf = work, .tmp = tmp, .seg = seg, .esz = esz,
                              .dtype = a->dtype, .op = a->op, .rs_steps = P - 1, .rs_shift = -1,
                              .sig = gcoll_call_sig(GCOLL_KIND_REDUCE_SCATTER, n, a->dtype,
                                                    a->op, 0)};
    for (size_t off = 0; off < n; off += sl) {
        size_t len = GCOLL_MIN(sl, n - off);
        for (size_t i = 0; i < P; i++) {
            seg[i] = (gcoll_span_t){i * len * esz, len * esz};
            memcpy(work + seg[i].off, send + (i * n + off) * esz, len * esz);
        }
        GCOLL_CHECK_GOTO(gcoll_ring_run(comm, &plan), st, out);
        memcpy(recv + off * esz, work + seg[r].off, len * esz);
        plan.sub0 += (uint32_t)((P - 1) * GCOLL_MAX(GCOLL_DIV_UP(len, GCOLL_MAX(
                                    comm->cfg.coll.ring_chunk / esz, (size_t)1)), (size_t)1));
    }
    gcoll_reduce_finish(recv, n, a->dtype, a->op, comm->size);
    comm->chan.counters.bytes_raw += P * n * esz;
    st = GCOLL_OK;
out:
    free(seg);
    free(work);
    return st;
}

gcoll_status_t gcoll_ireduce_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, gcoll_dtype_t dtype, gcoll_op_t op,
                                     gcoll_request_t **req_p)
{
    const char *what = "gcoll_reduce_scatter";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, op >= GCOLL_SUM && op <= GCOLL_PROD,
                                      "unknown op %d", (int)op));
    GCOLL_CHECK(check_bytes(comm, what, recvcount, gcoll_dtype_size(dtype), (size_t)comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, recvcount == 0 || (sendbuf && recvbuf),
                                      "NULL buffer with count %zu", recvcount));
    gcoll_args_t a = {.sendbuf = sendbuf, .recvbuf = recvbuf, .count = recvcount, .dtype = dtype,
                      .op = op};
    return submit(comm, what, run_reduce_scatter, &a, req_p);
}

gcoll_status_t gcoll_reduce_scatter(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, gcoll_dtype_t dtype, gcoll_op_t op)
{
    return gcoll_ireduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op, NULL);
}

/* ---- alltoall(v) ------------------------------------------------------------------- */

gcoll_status_t gcoll_alltoall_run(gcoll_comm_t *comm, const uint8_t *sendbuf,
                                  const gcoll_span_t *sspan, uint8_t *recvbuf,
                                  const gcoll_span_t *rspan, uint32_t sig)
{
    const int P = comm->size, r = comm->rank;
    gcoll_treq_t *req = calloc(2 * (size_t)P, sizeof(*req));
    if (!req)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    /* Staggered partners so that every link is busy, not every rank hitting rank 0. */
    for (int k = 1; k < P; k++) {
        int from = (r - k + P) % P;
        GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &req[n++], from, 0, sig, recvbuf + rspan[from].off,
                                         rspan[from].len, 0), st, out);
    }
    for (int k = 1; k < P; k++) {
        int to = (r + k) % P;
        GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &req[n++], to, 0, sig, sendbuf + sspan[to].off,
                                         sspan[to].len), st, out);
    }
    if (rspan[r].len != sspan[r].len) {
        gcoll_comm_set_error(comm, "rank %d sends itself %zu bytes but expects %zu", r,
                             sspan[r].len, rspan[r].len);
        st = GCOLL_ERR_INVALID;
        goto out;
    }
    memmove(recvbuf + rspan[r].off, sendbuf + sspan[r].off, sspan[r].len);
    st = gcoll_net_waitall(comm, req, n);
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, req, n);
    free(req);
    return st;
}

static gcoll_status_t run_alltoallv(gcoll_comm_t *comm, gcoll_request_t *req)
{
    const gcoll_args_t *a = &req->a;
    const vargs_t *v = a->ext;
    const int P = comm->size;
    const size_t esz = gcoll_dtype_size(a->dtype);
    gcoll_span_t *sp = calloc(2 * (size_t)P, sizeof(*sp)), *rp = sp + P;
    if (!sp)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < P; i++) {
        sp[i] = (gcoll_span_t){v->sdispls[i] * esz, v->scounts[i] * esz};
        rp[i] = (gcoll_span_t){v->rdispls[i] * esz, v->rcounts[i] * esz};
        comm->chan.counters.bytes_raw += sp[i].len;
    }
    gcoll_status_t st = gcoll_alltoall_run(comm, a->sendbuf, sp, a->recvbuf, rp,
                                           gcoll_call_sig(a->kind, 0, a->dtype, 0, 0));
    free(sp);
    return st;
}

static gcoll_status_t alltoallv(gcoll_comm_t *comm, const char *what, int kind,
                                const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, gcoll_dtype_t dtype,
                                gcoll_request_t **req_p)
{
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendcounts && sdispls && recvcounts && rdispls,
                                      "NULL count or displacement array"));
    size_t esz = gcoll_dtype_size(dtype), stot = 0, rtot = 0;
    for (int i = 0; i < comm->size; i++) {
        GCOLL_CHECK(check_bytes(comm, what, sendcounts[i] + sdispls[i], esz, 1));
        GCOLL_CHECK(check_bytes(comm, what, recvcounts[i] + rdispls[i], esz, 1));
        stot += sendcounts[i];
        rtot += recvcounts[i];
    }
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, (stot == 0 || sendbuf) && (rtot == 0 || recvbuf),
                                      "NULL buffer with a non-zero count"));
    GCOLL_CHECK(gcoll_comm_check_args(
        comm, what, sendcounts[comm->rank] == recvcounts[comm->rank],
        "sendcounts[%d] = %zu but recvcounts[%d] = %zu", comm->rank, sendcounts[comm->rank],
        comm->rank, recvcounts[comm->rank]));
    vargs_t *v = vargs_new(comm->size, recvcounts, rdispls, sendcounts, sdispls);
    if (!v)
        return GCOLL_ERR_NOMEM;
    gcoll_args_t a = {.sendbuf = sendbuf, .recvbuf = recvbuf, .dtype = dtype, .kind = kind,
                      .ext = v, .release = free};
    return submit(comm, what, run_alltoallv, &a, req_p);
}

gcoll_status_t gcoll_ialltoallv(gcoll_comm_t *comm, const void *sendbuf,
                                const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                const size_t *recvcounts, const size_t *rdispls,
                                gcoll_dtype_t dtype, gcoll_request_t **req_p)
{
    return alltoallv(comm, "gcoll_alltoallv", GCOLL_KIND_ALLTOALLV, sendbuf, sendcounts, sdispls,
                     recvbuf, recvcounts, rdispls, dtype, req_p);
}

gcoll_status_t gcoll_alltoallv(gcoll_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, gcoll_dtype_t dtype)
{
    return gcoll_ialltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                            dtype, NULL);
}

gcoll_status_t gcoll_ialltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t count_per_rank, gcoll_dtype_t dtype,
                               gcoll_request_t **req_p)
{
    const char *what = "gcoll_alltoall";
    GCOLL_CHECK(check_base(comm, what, dtype));
    GCOLL_CHECK(check_bytes(comm, what, count_per_rank, gcoll_dtype_size(dtype),
                            (size_t)comm->size));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, sendbuf != recvbuf || count_per_rank == 0,
                                      "in-place alltoall is not supported"));
    size_t *tab = malloc(2 * (size_t)comm->size * sizeof(size_t));
    if (!tab)
        return GCOLL_ERR_NOMEM;
    for (int i = 0; i < comm->size; i++) {
        tab[i] = count_per_rank;
        tab[comm->size + i] = (size_t)i * count_per_rank;
    }
    /* a rank passing another count sends messages of another length: a mismatch */
    gcoll_status_t st = alltoallv(comm, what, GCOLL_KIND_ALLTOALL, sendbuf, tab, tab + comm->size,
                                  recvbuf, tab, tab + comm->size, dtype, req_p);
    free(tab);
    return st;
}

gcoll_status_t gcoll_alltoall(gcoll_comm_t *comm, const void *sendbuf, void *recvbuf,
                              size_t count_per_rank, gcoll_dtype_t dtype)
{
    return gcoll_ialltoall(comm, sendbuf, recvbuf, count_per_rank, dtype, NULL);
}

/* Every rank sends sbuf[j] (slen[j] bytes) to rank j and receives at most rcap[j] bytes
 * from it into rbuf[j]; rlen[j] receives the length. Used where lengths are not known in
 * advance; the receive side checks them against the cap. */
gcoll_status_t gcoll_exchange_anylen(gcoll_comm_t *comm, uint32_t sub, uint32_t sig,
                                     uint8_t *const *sbuf, const size_t *slen,
                                     uint8_t *const *rbuf, const size_t *rcap, size_t *rlen)
{
    const int P = comm->size, r = comm->rank;
    gcoll_treq_t *req = calloc(2 * (size_t)P, sizeof(*req));
    if (!req)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    int n = 0;
    for (int k = 1; k < P; k++) {
        int from = (r - k + P) % P;
        if (rbuf[from])
            GCOLL_CHECK_GOTO(gcoll_net_irecv(comm, &req[n++], from, sub, sig, rbuf[from],
                                             rcap[from], GCOLL_TREQ_ANYLEN), st, out);
    }
    for (int k = 1; k < P; k++) {
        int to = (r + k) % P;
        if (sbuf[to])
            GCOLL_CHECK_GOTO(gcoll_net_isend(comm, &req[n++], to, sub, sig, sbuf[to], slen[to]),
                             st, out);
    }
    GCOLL_CHECK_GOTO(gcoll_net_waitall(comm, req, n), st, out);
    for (int i = 0; i < n; i++)
        if (req[i].flags & GCOLL_TREQ_ANYLEN)
            rlen[req[i].peer] = req[i].nbytes;
out:
    if (st != GCOLL_OK)
        gcoll_net_cancel(comm, req, n);
    free(req);
    return st;
}
