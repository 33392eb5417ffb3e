/* bench.c: the benchmark engine: size sweep, warm-up, timed iterations out of place and in
 * place, the correctness check, and the algbw/busbw arithmetic of nccl-tests
 * (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md). */
#include "bench.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const coll_names[BENCH_NCOLL] = {
    "allreduce",  "allgather", "reduce_scatter", "alltoall", "broadcast", "barrier",
    "compressed", "sendrecv",  "reduce",         "gather",   "scatter"};

int bench_parse_coll(const char *s, bench_coll_t *c)
{
    for (int i = 0; i < BENCH_NCOLL; i++)
        if (strcasecmp(s, coll_names[i]) == 0) {
            *c = (bench_coll_t)i;
            return 0;
        }
    return -1;
}

const char *bench_coll_name(bench_coll_t c)
{
    return (unsigned)c < BENCH_NCOLL ? coll_names[c] : "?";
}

int bench_parse_dtype(const char *s, gcoll_dtype_t *d)
{
    static const struct {
        const char *n;
        gcoll_dtype_t d;
    } alias[] = {{"float", GCOLL_FLOAT32},
                 {"half", GCOLL_FLOAT16},
                 {"double", GCOLL_FLOAT64},
                 {"int", GCOLL_INT32}};
    for (int i = 0; i < BENCH_NDTYPES; i++)
        if (strcasecmp(s, gcoll_dtype_name((gcoll_dtype_t)i)) == 0) {
            *d = (gcoll_dtype_t)i;
            return 0;
        }
    for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++)
        if (strcasecmp(s, alias[i].n) == 0) {
            *d = alias[i].d;
            return 0;
        }
    return -1;
}

int bench_parse_op(const char *s, gcoll_op_t *o)
{
    for (int i = 0; i < BENCH_NOPS; i++)
        if (strcasecmp(s, gcoll_op_name((gcoll_op_t)i)) == 0) {
            *o = (gcoll_op_t)i;
            return 0;
        }
    return -1;
}

int bench_coll_reduces(bench_coll_t c)
{
    return c == BENCH_ALLREDUCE || c == BENCH_REDUCE_SCATTER || c == BENCH_REDUCE;
}

int bench_coll_rooted(bench_coll_t c)
{
    return c == BENCH_BROADCAST || c == BENCH_REDUCE || c == BENCH_GATHER || c == BENCH_SCATTER;
}

int bench_coll_has_ip(bench_coll_t c)
{
    /* gcoll_alltoall refuses in place; a barrier has no buffer; a send and a receive of one
     * buffer at once would race */
    return c != BENCH_ALLTOALL && c != BENCH_BARRIER && c != BENCH_COMPRESSED &&
           c != BENCH_SENDRECV;
}

int bench_coll_has_oop(bench_coll_t c)
{
    return c != BENCH_BROADCAST; /* gcoll_broadcast has one buffer */
}

const char *bench_op_refused(gcoll_dtype_t d, gcoll_op_t op)
{
    int is_float = d == GCOLL_FLOAT32 || d == GCOLL_FLOAT16 || d == GCOLL_BFLOAT16 ||
                   d == GCOLL_FLOAT64 || d == GCOLL_FLOAT8_E4M3 || d == GCOLL_FLOAT8_E5M2;
    if (is_float && (op == GCOLL_BAND || op == GCOLL_BOR || op == GCOLL_BXOR))
        return "bitwise ops take the integer types and bool only";
    if (d == GCOLL_BOOL && op == GCOLL_AVG)
        return "bool has no average";
    return NULL;
}

double bench_bus_factor(bench_coll_t c, int n)
{
    switch (c) {
    case BENCH_ALLREDUCE:
    case BENCH_COMPRESSED:
        return 2.0 * (n - 1) / n;
    case BENCH_ALLGATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLTOALL:
        return (double)(n - 1) / n;
    case BENCH_GATHER:
    case BENCH_SCATTER:
        return (double)(n - 1) / n;
    case BENCH_BROADCAST:
    case BENCH_SENDRECV:
    case BENCH_REDUCE:
        return 1.0;
    default:
        return 0.0; /* a barrier moves no data */
    }
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

gcoll_status_t bench_combine_time(gcoll_comm_t *comm, int average, double *t)
{
    switch (average) {
    case BENCH_AVG_RANK0:
        return gcoll_broadcast(comm, t, 1, GCOLL_FLOAT64, 0);
    case BENCH_AVG_MIN:
        return gcoll_allreduce(comm, t, t, 1, GCOLL_FLOAT64, GCOLL_MIN);
    case BENCH_AVG_MAX:
        return gcoll_allreduce(comm, t, t, 1, GCOLL_FLOAT64, GCOLL_MAX);
    default:
        return gcoll_allreduce(comm, t, t, 1, GCOLL_FLOAT64, GCOLL_AVG);
    }
}

/* Elements of one rank's input and of its output, and the nccl-tests "size". */
static void shape(const bench_opts_t *o, size_t bytes, int n, size_t *in, size_t *out,
                  size_t *count, size_t *size)
{
    size_t esz = gcoll_dtype_size(o->dtype), c = bytes / esz;
    switch (o->coll) {
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
        *count = c / (size_t)n;
        *in = *count;
        *out = *count * (size_t)n;
        break;
    case BENCH_REDUCE_SCATTER:
    case BENCH_SCATTER:
        *count = c / (size_t)n;
        *in = *count * (size_t)n;
        *out = *count;
        break;
    case BENCH_ALLTOALL:
        *count = c / (size_t)n;
        *in = *out = *count * (size_t)n;
        break;
    case BENCH_BARRIER:
        *in = *out = *count = 0;
        break;
    default:
        *in = *out = *count = c;
        break;
    }
    /* per rank for allreduce, broadcast, sendrecv, reduce; the total of the others */
    int total = o->coll == BENCH_ALLGATHER || o->coll == BENCH_REDUCE_SCATTER ||
                o->coll == BENCH_ALLTOALL || o->coll == BENCH_GATHER || o->coll == BENCH_SCATTER;
    *size = *count * esz * (total ? (size_t)n : 1);
}

typedef struct {
    gcoll_comm_t *comm;
    const bench_opts_t *o;
    uint8_t *in, *out; /* out holds max(input, output) elements: in place uses it alone */
    size_t count, esz;
    int rank, n;
} ctx_t;

/* nccl-tests' sendrecv: to rank+1, from rank-1, both at once. A blocking send then a
 * blocking receive would wait for each other (gcoll's calls run in the order issued), so
 * the pair is a group (gcoll_group_start/end, as ncclGroupStart/End); the nonblocking
 * pair (req) goes into the group loop() opens around all the iterations. */
static gcoll_status_t sendrecv(const ctx_t *c, gcoll_request_t **req)
{
    const int next = (c->rank + 1) % c->n, prev = (c->rank + c->n - 1) % c->n;
    const bench_opts_t *o = c->o;
    if (req) {
        gcoll_status_t st = gcoll_isend(c->comm, c->in, c->count, o->dtype, next, &req[0]);
        return st == GCOLL_OK ? gcoll_irecv(c->comm, c->out, c->count, o->dtype, prev, &req[1])
                              : st;
    }
    gcoll_status_t st = gcoll_group_start(c->comm);
    if (st != GCOLL_OK)
        return st;
    gcoll_status_t s1 = gcoll_send(c->comm, c->in, c->count, o->dtype, next);
    gcoll_status_t s2 = s1 == GCOLL_OK ? gcoll_recv(c->comm, c->out, c->count, o->dtype, prev) : s1;
    st = gcoll_group_end(c->comm);
    return s2 != GCOLL_OK ? s2 : st;
}

/* One operation, out of place (ip == 0) or in place; req NULL: blocking, else req[0] (and
 * req[1] for sendrecv) receive the requests. */
static gcoll_status_t post(const ctx_t *c, int ip, gcoll_request_t **req)
{
    const bench_opts_t *o = c->o;
    gcoll_comm_t *m = c->comm;
    const size_t cnt = c->count, mine = (size_t)c->rank * cnt * c->esz;
    void *src = ip ? c->out : c->in, *dst = c->out;
    gcoll_dtype_t d = o->dtype;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
        return req ? gcoll_iallreduce(m, src, dst, cnt, d, o->op, req)
                   : gcoll_allreduce(m, src, dst, cnt, d, o->op);
    case BENCH_ALLGATHER:
        if (ip)
            src = c->out + mine;
        return req ? gcoll_iallgather(m, src, dst, cnt, d, req)
                   : gcoll_allgather(m, src, dst, cnt, d);
    case BENCH_REDUCE_SCATTER:
        if (ip)
            dst = c->out + mine;
        return req ? gcoll_ireduce_scatter(m, src, dst, cnt, d, o->op, req)
                   : gcoll_reduce_scatter(m, src, dst, cnt, d, o->op);
    case BENCH_ALLTOALL:
        return req ? gcoll_ialltoall(m, src, dst, cnt, d, req)
                   : gcoll_alltoall(m, src, dst, cnt, d);
    case BENCH_BROADCAST:
        return req ? gcoll_ibroadcast(m, dst, cnt, d, o->root, req)
                   : gcoll_broadcast(m, dst, cnt, d, o->root);
    case BENCH_BARRIER:
        return req ? gcoll_ibarrier(m, req) : gcoll_barrier(m);
    case BENCH_SENDRECV:
        return sendrecv(c, req);
    case BENCH_REDUCE:
        return req ? gcoll_ireduce(m, src, dst, cnt, d, o->op, o->root, req)
                   : gcoll_reduce(m, src, dst, cnt, d, o->op, o->root);
    case BENCH_GATHER:
        if (ip)
            src = c->out + mine;
        return req ? gcoll_igather(m, src, dst, cnt, d, o->root, req)
                   : gcoll_gather(m, src, dst, cnt, d, o->root);
    case BENCH_SCATTER:
        if (ip)
            dst = c->out + mine;
        return req ? gcoll_iscatter(m, src, dst, cnt, d, o->root, req)
                   : gcoll_scatter(m, src, dst, cnt, d, o->root);
    default:
        return GCOLL_ERR_INVALID;
    }
}

/* Fills this rank's input for a placement (every element, so that a wrong result cannot be
 * left over from the last run). */
static void fill(const ctx_t *c, int ip)
{
    const bench_opts_t *o = c->o;
    const size_t cnt = c->count, n = (size_t)c->n, r = (size_t)c->rank;
    uint8_t *buf = ip ? c->out : c->in;
    switch (o->coll) {
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
        if (ip) {
            memset(c->out, 0xa5, cnt * n * c->esz);
            bench_fill(o, c->out + r * cnt * c->esz, cnt, c->rank, 0);
        } else {
            bench_fill(o, c->in, cnt, c->rank, 0);
            memset(c->out, 0xa5, cnt * n * c->esz);
        }
        break;
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLTOALL:
    case BENCH_SCATTER:
        bench_fill(o, buf, cnt * n, c->rank, 0);
        if (!ip)
            memset(c->out, 0xa5, (o->coll == BENCH_ALLTOALL ? cnt * n : cnt) * c->esz);
        break;
    case BENCH_BARRIER:
        break;
    default: /* allreduce, broadcast, sendrecv, reduce (a non-root's buffer: its own input) */
        bench_fill(o, buf, cnt, c->rank, 0);
        if (!ip)
            memset(c->out, 0xa5, cnt * c->esz);
        break;
    }
}

/* Wrong output elements on this rank after one run of a placement. */
static long verify(const ctx_t *c, int ip)
{
    const bench_opts_t *o = c->o;
    const size_t cnt = c->count, blk = cnt * c->esz, r = (size_t)c->rank;
    long wrong = 0;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
        return bench_wrong(o, c->out, cnt, c->n, -1, 0);
    case BENCH_REDUCE_SCATTER:
        return bench_wrong(o, c->out + (ip ? r * blk : 0), cnt, c->n, -1, r * cnt);
    case BENCH_ALLGATHER:
        for (int k = 0; k < c->n; k++)
            wrong += bench_wrong(o, c->out + (size_t)k * blk, cnt, c->n, k, 0);
        return wrong;
    case BENCH_ALLTOALL:
        for (int k = 0; k < c->n; k++)
            wrong += bench_wrong(o, c->out + (size_t)k * blk, cnt, c->n, k, r * cnt);
        return wrong;
    case BENCH_BROADCAST:
        return bench_wrong(o, c->out, cnt, c->n, o->root, 0);
    case BENCH_SENDRECV:
        return bench_wrong(o, c->out, cnt, c->n, (c->rank + c->n - 1) % c->n, 0);
    case BENCH_SCATTER:
        return bench_wrong(o, c->out + (ip ? r * blk : 0), cnt, c->n, o->root, r * cnt);
    case BENCH_REDUCE: /* only the root has a result */
        return c->rank == o->root ? bench_wrong(o, c->out, cnt, c->n, -1, 0) : 0;
    case BENCH_GATHER:
        for (int k = 0; c->rank == o->root && k < c->n; k++)
            wrong += bench_wrong(o, c->out + (size_t)k * blk, cnt, c->n, k, 0);
        return wrong;
    default:
        return 0;
    }
}

/* -z's loop of k operations of one placement. */
static gcoll_status_t loop(const ctx_t *c, int ip, int k, gcoll_request_t **reqs)
{
    gcoll_status_t st = GCOLL_OK;
    if (c->o->blocking != BENCH_Z_NONBLOCKING) {
        for (int i = 0; i < k && st == GCOLL_OK; i++) {
            st = post(c, ip, NULL);
            if (st == GCOLL_OK && c->o->blocking == BENCH_Z_BARRIER)
                st = gcoll_barrier(c->comm);
        }
        return st;
    }
    /* two request slots per operation (sendrecv's send and receive) */
    const int grouped = c->o->coll == BENCH_SENDRECV;
    if (grouped && (st = gcoll_group_start(c->comm)) != GCOLL_OK)
        return st;
    for (int i = 0; i < k && st == GCOLL_OK; i++)
        st = post(c, ip, &reqs[2 * i]);
    if (grouped) {
        gcoll_status_t g = gcoll_group_end(c->comm);
        if (st == GCOLL_OK)
            st = g;
    }
    for (int i = 0; i < 2 * k; i++) {
        if (!reqs[i])
            continue;
        gcoll_status_t w = gcoll_wait(reqs[i]);
        reqs[i] = NULL;
        if (st == GCOLL_OK)
            st = w;
    }
    return st;
}

static gcoll_status_t measure(const ctx_t *c, int ip, size_t size, gcoll_request_t **reqs,
                              bench_result_t *res)
{
    const bench_opts_t *o = c->o;
    gcoll_status_t st;
    fill(c, ip);
    if ((st = loop(c, ip, o->warmup, reqs)) != GCOLL_OK ||
        (st = gcoll_barrier(c->comm)) != GCOLL_OK)
        return st;
    double t0 = now_us();
    if ((st = loop(c, ip, o->iters, reqs)) != GCOLL_OK)
        return st;
    double t = (now_us() - t0) / o->iters;
    if ((st = bench_combine_time(c->comm, o->average, &t)) != GCOLL_OK)
        return st;
    res->ran = 1;
    res->time_us = t;
    res->algbw = t > 0 ? (double)size / t / 1e3 : 0;
    res->busbw = res->algbw * bench_bus_factor(o->coll, c->n);
    res->wrong = -1;
    if (o->check <= 0 || o->coll == BENCH_BARRIER)
        return GCOLL_OK;
    int64_t wrong = 0;
    for (int k = 0; k < o->check; k++) {
        fill(c, ip);
        if ((st = post(c, ip, NULL)) != GCOLL_OK)
            return st;
        wrong += verify(c, ip);
    }
    if ((st = gcoll_allreduce(c->comm, &wrong, &wrong, 1, GCOLL_INT64, GCOLL_SUM)) != GCOLL_OK)
        return st;
    res->wrong = (long)wrong;
    return GCOLL_OK;
}

static size_t next_size(const bench_opts_t *o, size_t bytes)
{
    size_t next = o->factor > 1 ? (size_t)((double)bytes * o->factor) : bytes + o->step;
    return next > bytes ? next : o->max_bytes + 1;
}

gcoll_status_t bench_run(gcoll_comm_t *comm, const bench_opts_t *o,
                         void (*emit)(const bench_row_t *row, void *ctx), void *ectx)
{
    const int n = gcoll_comm_size(comm);
    const size_t esz = gcoll_dtype_size(o->dtype);
    size_t nin, nout, count, size;
    shape(o, o->max_bytes, n, &nin, &nout, &count, &size);
    size_t nbuf = nin > nout ? nin : nout;
    ctx_t c = {.comm = comm, .o = o, .esz = esz, .rank = gcoll_comm_rank(comm), .n = n};
    c.in = calloc(nin + 1, esz);
    c.out = calloc(nbuf + 1, esz);
    int nreq = o->iters > o->warmup ? o->iters : o->warmup;
    gcoll_request_t **reqs = calloc(2 * (size_t)nreq + 2, sizeof(*reqs));
    float *ref = NULL;
    gcoll_compressor_t *comp = NULL;
    gcoll_status_t st = c.in && c.out && reqs ? GCOLL_OK : GCOLL_ERR_NOMEM;
    if (st == GCOLL_OK && o->coll == BENCH_COMPRESSED &&
        (st = gcoll_compressor_create(o->spec, &comp)) == GCOLL_OK &&
        !(ref = calloc(nout + 1, sizeof(float))))
        st = GCOLL_ERR_NOMEM;
    for (size_t bytes = o->min_bytes; st == GCOLL_OK && bytes <= o->max_bytes;
         bytes = next_size(o, bytes)) {
        shape(o, bytes, n, &nin, &nout, &c.count, &size);
        bench_row_t row = {.bytes = size, .count = c.count};
        if (comp) {
            st = bench_compressed_row(comm, o, comp, c.count, (float *)c.in, (float *)c.out, ref,
                                      &row);
            row.oop.algbw = row.oop.time_us > 0 ? (double)size / row.oop.time_us / 1e3 : 0;
            row.oop.busbw = row.oop.algbw * bench_bus_factor(o->coll, n);
        } else {
            if (bench_coll_has_oop(o->coll))
                st = measure(&c, 0, size, reqs, &row.oop);
            if (st == GCOLL_OK && bench_coll_has_ip(o->coll))
                st = measure(&c, 1, size, reqs, &row.ip);
        }
        if (st != GCOLL_OK)
            break;
        emit(&row, ectx);
        if (o->coll == BENCH_BARRIER)
            break; /* one row: a barrier has no size */
    }
    gcoll_compressor_destroy(comp);
    free(ref);
    free(reqs);
    free(c.in);
    free(c.out);
    return st;
}
