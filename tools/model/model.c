/* model.c: alpha-beta-gamma (Hockney) costs of gcoll's allreduce algorithms in the forms of
 * Thakur, Rabenseifner & Gropp 2005 (ring's 2(P-1)/P volume from Patarasuk & Yuan 2009),
 * the sparse schemes of SparCML (Renggli et al. 2019) and Ok-Topk (Li & Hoefler 2022), the
 * quantized all-to-all of 1-bit Adam (Tang et al. 2021), the two-level scheme of Horovod
 * and NCCL, and a least-squares fit of alpha, beta and gamma to measured times. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

const char *const model_algo_names[ALG_COUNT] = {"ring",      "rhd",      "rd",         "tree",
                                                 "allgather", "streamed", "split",      "oktopk",
                                                 "alltoall",  "qring",    "compressed", "best"};

model_algo_t model_algo_parse(const char *s)
{
    for (int i = 0; i < ALG_COUNT; i++)
        if (strcmp(s, model_algo_names[i]) == 0)
            return (model_algo_t)i;
    return ALG_COUNT;
}

int model_algo_valid(model_algo_t a, const model_codec_t *c)
{
    switch (a) {
    case ALG_RING:
    case ALG_RHD:
    case ALG_RD:
    case ALG_TREE:
    case ALG_BEST:
        return c == NULL;
    case ALG_ALLGATHER:
    case ALG_STREAMED:
    case ALG_SPLIT:
    case ALG_OKTOPK:
        return c != NULL && c->density > 0;
    case ALG_ALLTOALL:
    case ALG_QRING:
        return c != NULL && c->density == 0;
    case ALG_COMPRESSED:
        return c != NULL;
    default:
        return 0;
    }
}

const model_codec_t *model_codec_find(const model_t *m, const char *spec)
{
    for (int i = 0; i < m->ncodec; i++)
        if (strcmp(m->codec[i].spec, spec) == 0)
            return &m->codec[i];
    return NULL;
}

/* What one allreduce costs, split by the parameter each part scales with, so that the fit
 * is linear: time = sw (msgs alpha + wbytes beta) + s (rbytes gamma + codec + intra). */
typedef struct {
    double msgs;   /* messages on the critical path */
    double wbytes; /* bytes on the critical path of the link */
    double rbytes; /* bytes reduced by one rank */
    double codec;  /* s of encode and decode on one rank */
    double imsgs;  /* steps inside a host */
    double ibytes; /* bytes copied inside a host */
} terms_t;

static int floor_log2(int p)
{
    int l = 0;
    while ((2 << l) <= p)
        l++;
    return l;
}

static int ceil_log2(int p)
{
    int l = 0;
    while ((1 << l) < p)
        l++;
    return l;
}

#define NPAR 4                      /* alpha, beta, gamma, kappa */
#define BCAST_TREE_MAX 65536.0      /* collectives/bcast.c */
#define RING_CHUNK 524288.0         /* GCOLL_RING_CHUNK's default */
#define STREAM_MIN (16 * 1048576.0) /* 16 segments of GCOLL_TOPK_STREAM's default */
#define STREAM_PAD 1.22 /* candidates / k of the streamed scheme (topk_stream.c, at 25M) */

/* Dense algorithms on P ranks, n bytes (Thakur et al. 2005, section 4). */
static void dense_terms(model_algo_t a, int P, double n, terms_t *t)
{
    double f = (double)(P - 1) / P;
    int lg = floor_log2(P), p2 = 1 << lg;
    double f2 = (double)(p2 - 1) / p2;
    switch (a) {
    case ALG_RING: /* reduce-scatter + allgather: 2(P-1) steps of n/P bytes */
        t->msgs += 2.0 * (P - 1);
        t->wbytes += 2.0 * f * n;
        t->rbytes += f * n;
        return;
    case ALG_RHD: /* Rabenseifner: halving reduce-scatter + doubling allgather */
        t->msgs += 2.0 * lg;
        t->wbytes += 2.0 * f2 * n;
        t->rbytes += f2 * n;
        break;
    case ALG_RD: /* recursive doubling: lg exchanges of the whole vector */
        t->msgs += lg;
        t->wbytes += lg * n;
        t->rbytes += lg * n;
        break;
    case ALG_TREE: { /* binomial reduce to rank 0, then broadcast (collectives/bcast.c) */
        int l = ceil_log2(P);
        t->msgs += l;
        t->wbytes += l * n;
        t->rbytes += l * n;
        if (n <= BCAST_TREE_MAX || P == 2) { /* binomial */
            t->msgs += l;
            t->wbytes += l * n;
        } else { /* pipelined chain in ring chunks: fill of P-2 chunks, then n */
            t->msgs += P - 1;
            t->wbytes += n + (P - 2) * (n < RING_CHUNK ? n : RING_CHUNK);
        }
        return;
    }
    default:
        return;
    }
    if (p2 != P) { /* the extra ranks fold in (send, reduce) and out (send) whole vectors */
        t->msgs += 2.0;
        t->wbytes += 2.0 * n;
        t->rbytes += n;
    }
}

static double codec_density(const model_codec_t *c, const model_query_t *q)
{
    return q->density > 0 ? q->density : c->density;
}

static double codec_ratio(const model_codec_t *c, const model_query_t *q)
{
    return c->density > 0 ? c->ratio * codec_density(c, q) / c->density : c->ratio;
}

/* Compressed schemes on P ranks of N floats (n = 4N bytes). */
static void comp_terms(model_algo_t a, int P, double n, const model_codec_t *c,
                       const model_query_t *q, terms_t *t)
{
    double N = n / 4, f = (double)(P - 1) / P, r = codec_ratio(c, q);
    double k = codec_density(c, q) * N;
    double u = N * (1.0 - pow(1.0 - codec_density(c, q), P)); /* union of independent picks */
    switch (a) {
    case ALG_RING: /* the sparse plan "dense": a dense ring of the decoded selection */
        dense_terms(ALG_RING, P, n, t);
        t->codec += N * (c->enc + c->dec);
        return;
    case ALG_ALLGATHER: /* each rank's message to every rank; sum P-1 received */
        t->msgs += P - 1;
        t->wbytes += (P - 1) * r * n;
        t->codec += N * (c->enc + c->dec) + (P - 1) * k * c->acc_nz;
        return;
    case ALG_STREAMED: /* the same with the sample's padding: STREAM_PAD k candidates */
        t->msgs += P - 1;
        t->wbytes += (P - 1) * STREAM_PAD * r * n;
        t->codec += N * (c->enc + c->dec) + (P - 1) * STREAM_PAD * k * c->acc_nz;
        return;
    case ALG_SPLIT:  /* reduce-scatter of f32 pairs by index range, gather of the union */
    case ALG_OKTOPK: /* the same, gathering a global top-k of the sum: O(k) */
        if (a == ALG_OKTOPK)
            u = k;
        t->msgs += 2.0 * (P - 1);
        t->wbytes += f * 8.0 * (k + u);
        t->codec += N * (c->enc + c->dec) + (k + u) * c->acc_nz;
        return;
    case ALG_ALLTOALL: /* compress, all-to-all, reduce own chunk, re-compress, gather */
        t->msgs += 2.0 * (P - 1);
        t->wbytes += 2.0 * f * r * n;
        t->codec += N * c->enc + N * c->acc + N / P * c->enc + N * c->dec;
        return;
    case ALG_QRING: /* 2(P-1) hops; a hop decodes, adds and re-encodes one chunk */
        t->msgs += 2.0 * (P - 1);
        t->wbytes += 2.0 * f * r * n;
        t->codec += f * N * (c->enc + c->acc) + N / P * c->enc + N * c->dec;
        return;
    default:
        return;
    }
}

/* Hosts of L ranks when Q is hierarchical, else 1. */
static int host_ranks(const model_query_t *q)
{
    return q->ppn > 1 && q->ppn < q->ranks && q->ranks % q->ppn == 0 ? q->ppn : 1;
}

model_algo_t model_resolve(const model_t *m, const model_query_t *qin)
{
    model_query_t inter = *qin; /* a hierarchical call decides on its step across hosts */
    const model_query_t *q = &inter;
    int L = host_ranks(qin);
    inter.ranks /= L;
    inter.bytes /= L;
    inter.ppn = 0;
    if (q->algo == ALG_COMPRESSED && q->codec) {
        const model_codec_t *c = q->codec;
        if (c->density == 0) /* the ring once every rank's chunk is 1 MiB or more */
            return q->bytes / q->ranks >= 1048576.0 ? ALG_QRING : ALG_ALLTOALL;
        /* the sparse plan that moves the fewest bytes (collectives/sparse.c) */
        double N = q->bytes / 4, d = codec_density(c, q), k = d * N;
        double u = N * (1.0 - pow(1.0 - d, q->ranks)), P = q->ranks;
        double ag = (P - 1) * codec_ratio(c, q) * q->bytes, sp = (P - 1) / P * 8 * (k + u);
        double dense = 2 * (P - 1) / P * q->bytes;
        /* top-k with f32 values on 16 or more segments of GCOLL_TOPK_STREAM (1M) elements
         * streams (collectives/compressed/topk_stream.c) while k pairs from all ranks stay under
         * the dense size */
        if (!strncmp(c->spec, "topk:", 5) && !strchr(c->spec, '+') && N >= STREAM_MIN &&
            P * k * 8 < q->bytes)
            return ALG_STREAMED;
        if (dense < ag && dense < sp) /* the merged density makes a dense ring cheaper */
            return ALG_RING;
        return ag <= sp ? ALG_ALLGATHER : ALG_SPLIT;
    }
    if (q->algo == ALG_BEST) {
        model_algo_t best = ALG_RING;
        double bt = 1e300;
        for (int a = ALG_RING; a <= ALG_TREE; a++) {
            model_query_t x = *q;
            x.algo = (model_algo_t)a;
            double t = model_predict(m, &x, NULL, 0);
            if (t >= 0 && t < bt) {
                bt = t;
                best = (model_algo_t)a;
            }
        }
        return best;
    }
    return q->algo;
}

/* The terms of Q and the CPU shares that scale them. */
static int query_terms(const model_t *m, const model_query_t *q, terms_t *t, double *s, double *sw,
                       char *why, size_t len)
{
    memset(t, 0, sizeof(*t));
    if (q->ranks < 1 || q->bytes < 0 || !(q->bytes < 1e18)) {
        if (why)
            snprintf(why, len, "ranks must be at least 1 and the size nonnegative");
        return -1;
    }
    if (!model_algo_valid(q->algo, q->codec)) {
        if (why)
            snprintf(why, len, "algorithm %s does not apply to %s", model_algo_names[q->algo],
                     q->codec ? q->codec->spec : "dense data");
        return -1;
    }
    model_algo_t a = model_resolve(m, q);
    int P = q->ranks, L = host_ranks(q);
    int H = P / L;
    double n = q->bytes;
    if (L > 1) { /* two levels: exact inside the host over shared memory, then across */
        t->imsgs += 3.0 * ceil_log2(L);
        t->ibytes += 2.0 * n;
        t->rbytes += (double)(L - 1) / L * n;
        n /= L;
    }
    if (H > 1) {
        double w0 = t->wbytes;
        if (q->codec)
            comp_terms(a, H, n, q->codec, q, t);
        else
            dense_terms(a, H, n, t);
        if (L > 1 && q->nics > 0 && q->nics < L) /* L rails through nics links */
            t->wbytes = w0 + (t->wbytes - w0) * L / q->nics;
    }
    double on_host = q->ppn > 0 ? q->ppn : P;
    if (q->load > on_host) /* other jobs' processes share the CPUs too */
        on_host = q->load;
    *s = q->cores > 0 && on_host > q->cores ? on_host / q->cores : 1.0;
    *sw = m->wire_cpu ? *s : 1.0;
    return 0;
}

double model_predict(const model_t *m, const model_query_t *q, char *why, size_t len)
{
    terms_t t;
    double s, sw;
    if (query_terms(m, q, &t, &s, &sw, why, len) != 0)
        return -1;
    return sw * (t.msgs * m->alpha + t.wbytes * m->beta) +
           s * (t.rbytes * m->gamma + m->kappa * t.codec + t.imsgs * m->ialpha +
                t.ibytes * m->ibeta);
}

/* Solves the k x k system A x = b in place (Gaussian elimination, partial pivoting). */
static int solve(double A[NPAR][NPAR], double b[NPAR], int k)
{
    for (int i = 0; i < k; i++) {
        int piv = i;
        for (int j = i + 1; j < k; j++)
            if (fabs(A[j][i]) > fabs(A[piv][i]))
                piv = j;
        if (fabs(A[piv][i]) < 1e-300)
            return -1;
        for (int j = 0; j < k; j++) {
            double x = A[i][j];
            A[i][j] = A[piv][j];
            A[piv][j] = x;
        }
        double x = b[i];
        b[i] = b[piv];
        b[piv] = x;
        for (int j = i + 1; j < k; j++) {
            double f = A[j][i] / A[i][i];
            for (int l = i; l < k; l++)
                A[j][l] -= f * A[i][l];
            b[j] -= f * b[i];
        }
    }
    for (int i = k - 1; i >= 0; i--) {
        for (int j = i + 1; j < k; j++)
            b[i] -= A[i][j] * b[j];
        b[i] /= A[i][i];
    }
    return 0;
}

/* Row i's features (alpha, beta, gamma, kappa) and known part, scaled by 1/time so that the
 * fit minimises the relative error. */
static int features(const model_t *m, const model_obs_t *o, double x[NPAR + 1], char *why,
                    size_t len)
{
    terms_t t;
    double s, sw;
    if (query_terms(m, &o->q, &t, &s, &sw, why, len) != 0)
        return -1;
    if (!(o->time > 0)) {
        snprintf(why, len, "a measured time must be positive");
        return -1;
    }
    double w = 1.0 / o->time;
    x[0] = w * sw * t.msgs;
    x[1] = w * sw * t.wbytes;
    x[2] = w * s * t.rbytes;
    x[3] = w * s * t.codec;
    x[4] = w * s * (t.imsgs * m->ialpha + t.ibytes * m->ibeta);
    return 0;
}

/* Nonnegative least squares over the four unknowns by trying every set of free ones
 * (Lawson & Hanson's active sets, exhaustively: 16 subsets) and keeping the best feasible. */
int model_fit(model_t *m, const model_obs_t *obs, int n, unsigned fixed_mask, char *why, size_t len)
{
    if (n < 1) {
        snprintf(why, len, "no measurements to fit");
        return -1;
    }
    double(*X)[NPAR + 1] = calloc((size_t)n, sizeof(*X));
    if (!X) {
        snprintf(why, len, "out of memory");
        return -1;
    }
    double fixed[NPAR] = {m->alpha, m->beta, m->gamma, m->kappa};
    for (int i = 0; i < n; i++) {
        if (features(m, &obs[i], X[i], why, len) != 0) {
            free(X);
            return -1;
        }
        for (int j = 0; j < NPAR; j++)
            if (fixed_mask & (1u << j))
                X[i][NPAR] += X[i][j] * fixed[j];
    }
    double best[NPAR] = {0}, bres = INFINITY;
    for (unsigned set = 0; set < 1u << NPAR; set++) {
        if (set & fixed_mask)
            continue;
        int idx[NPAR], k = 0;
        for (int j = 0; j < NPAR; j++)
            if (set & (1u << j))
                idx[k++] = j;
        double A[NPAR][NPAR] = {{0}}, b[NPAR] = {0}, x[NPAR] = {0};
        for (int i = 0; i < n; i++)
            for (int a = 0; a < k; a++) {
                b[a] += X[i][idx[a]] * (1.0 - X[i][NPAR]);
                for (int c = 0; c < k; c++)
                    A[a][c] += X[i][idx[a]] * X[i][idx[c]];
            }
        if (k > 0 && solve(A, b, k) != 0)
            continue;
        int ok = 1;
        for (int a = 0; a < k; a++) {
            ok &= b[a] >= 0;
            x[idx[a]] = b[a];
        }
        if (!ok)
            continue;
        double res = 0;
        for (int i = 0; i < n; i++) {
            double e = X[i][NPAR] - 1.0;
            for (int j = 0; j < NPAR; j++)
                e += X[i][j] * x[j];
            res += e * e;
        }
        if (res < bres) {
            bres = res;
            memcpy(best, x, sizeof(best));
        }
    }
    free(X);
    if (!isfinite(bres)) {
        snprintf(why, len, "the measurements do not determine the parameters");
        return -1;
    }
    double *par[NPAR] = {&m->alpha, &m->beta, &m->gamma, &m->kappa};
    for (int j = 0; j < NPAR; j++)
        if (!(fixed_mask & (1u << j)))
            *par[j] = best[j];
    m->nfit = n;
    m->rms = sqrt(bres / n);
    return 0;
}
