/* check_bucketer.c: coll_check's bucketer, adapt, bucket_missing and bucket_nan modes. */
#include "check.h"

/* ---- bucketer ---- */

static const struct {
    const char *name;
    size_t count;
} layers[] = {
    /* backward order: the network's last layer first */
    {"fc3.bias", 10},      {"fc3.weight", 2560}, {"norm2.weight", 256},  {"fc2.bias", 256},
    {"fc2.weight", 65536}, {"fc1.bias", 512},    {"fc1.weight", 200704},
};
#define NLAYERS ((int)(sizeof(layers) / sizeof(layers[0])))

static float layer_val(int r, int step, int l, size_t i)
{
    return (float)((int)((i * 7 + (size_t)l * 5 + (size_t)r * 3 + (size_t)step) % 19) - 9);
}

/* Ready order: a different permutation on every rank. */
static void ready_all(gcoll_bucketer_t *b, const int *id, int skip)
{
    for (int k = 0; k < NLAYERS; k++) {
        int l = (k * 3 + rank * 5 + 1) % NLAYERS;
        if (l != skip && gcoll_bucketer_ready(b, id[l]) != GCOLL_OK)
            FAIL("bucketer_ready(%s)", layers[l].name);
    }
}

/* A bucketer over the test's layers (gradient buffers in g, zeroed; ids in id), tensors
 * registered in backward order; NULL and a failure if it cannot be created. */
static gcoll_bucketer_t *make_bucketer(const gcoll_bucketer_config_t *cfg, float **g, int *id)
{
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return NULL;
    }
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = calloc(layers[l].count, sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    return b;
}

static void free_bucketer(gcoll_bucketer_t *b, float **g)
{
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
}

static void check_bucketer_dense(int accumulate)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024,
                                   .op = GCOLL_AVG,
                                   .default_spec = "none",
                                   .accumulate_steps = accumulate};
    float *g[NLAYERS];
    int id[NLAYERS];
    gcoll_bucketer_t *b = make_bucketer(&cfg, g, id);
    if (!b)
        return;
    for (int step = 0; step < 2 * accumulate; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                g[l][i] = layer_val(rank, step, l, i);
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("bucketer_wait: %s", gcoll_comm_last_error(comm));
            break;
        }
        int comm_step = (step + 1) % accumulate == 0;
        for (int l = 0; l < NLAYERS; l++) {
            for (size_t i = 0; i < layers[l].count; i++) {
                double want = 0;
                if (!comm_step) {
                    want = layer_val(rank, step, l, i); /* untouched: accumulated locally */
                } else {
                    for (int r = 0; r < size; r++)
                        for (int s2 = step + 1 - accumulate; s2 <= step; s2++)
                            want += layer_val(r, s2, l, i);
                    want /= size;
                }
                if (fabs(g[l][i] - want) > 1e-6 * (fabs(want) + 1)) {
                    FAIL("bucketer (accumulate %d) step %d %s[%zu]: got %g want %g", accumulate,
                         step, layers[l].name, i, g[l][i], want);
                    l = NLAYERS;
                    break;
                }
            }
        }
    }
    if (gcoll_bucketer_num_buckets(b) < 3)
        FAIL("bucketer made %d buckets, expected several", gcoll_bucketer_num_buckets(b));
    free_bucketer(b, g);
}

/* One bucket of one codec equals the compressed allreduce of the fused tensors, step
 * after step (the bucket's residual carries over like a tensor state's). */
static void check_bucketer_compressed(const char *spec)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 64 << 20, .op = GCOLL_SUM, .default_spec = spec};
    gcoll_bucketer_t *b;
    gcoll_bucketer_create(comm, &cfg, &b);
    gcoll_compressor_t *c;
    gcoll_tensor_state_t *st;
    size_t total = 0;
    for (int l = 0; l < NLAYERS; l++)
        total += layers[l].count;
    gcoll_compressor_create(spec, &c);
    gcoll_state_create(c, total, &st);
    float *g[NLAYERS], *fused = malloc(total * sizeof(float)), *ref = malloc(total * sizeof(float));
    int id[NLAYERS];
    for (int l = 0; l < NLAYERS; l++) {
        g[l] = malloc(layers[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, layers[l].name, g[l], layers[l].count, GCOLL_FLOAT32, NULL,
                                  &id[l]);
    }
    for (int step = 0; step < 2; step++) {
        size_t off = 0;
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                fused[off++] = g[l][i] = layer_val(rank, step, l, i) * 0.37f;
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK ||
            gcoll_compressed_allreduce(comm, st, fused, ref, total, GCOLL_SUM) != GCOLL_OK) {
            FAIL("bucketer %s: %s", spec, gcoll_comm_last_error(comm));
            break;
        }
        off = 0;
        for (int l = 0; l < NLAYERS; l++, off += layers[l - 1].count)
            if (memcmp(g[l], ref + off, layers[l].count * sizeof(float)) != 0) {
                FAIL("bucketer %s step %d: %s differs from the compressed allreduce", spec, step,
                     layers[l].name);
                break;
            }
    }
    if (gcoll_bucketer_num_buckets(b) != 1)
        FAIL("bucketer %s: %d buckets, expected 1", spec, gcoll_bucketer_num_buckets(b));
    gcoll_bucketer_destroy(b);
    gcoll_state_destroy(st);
    gcoll_compressor_destroy(c);
    for (int l = 0; l < NLAYERS; l++)
        free(g[l]);
    free(fused);
    free(ref);
}

static void check_bucketer_errors(void)
{
    gcoll_bucketer_t *b;
    gcoll_bucketer_config_t bad = {.policy = "*bias*=none;size<oops=fp16;*=topk:density=0.01"};
    checks += 4;
    if (gcoll_bucketer_create(comm, &bad, &b) != GCOLL_ERR_INVALID ||
        !strstr(gcoll_comm_last_error(comm), "size<oops=fp16"))
        FAIL("bad policy rule not named: '%s'", gcoll_comm_last_error(comm));
    gcoll_bucketer_config_t badspec = {.policy = "fc*=topk:density=7"};
    if (gcoll_bucketer_create(comm, &badspec, &b) != GCOLL_ERR_INVALID ||
        !strstr(gcoll_comm_last_error(comm), "fc*=topk:density=7"))
        FAIL("bad compressor in a policy rule not named: '%s'", gcoll_comm_last_error(comm));
    gcoll_bucketer_config_t ok = {.op = GCOLL_AVG, .default_spec = "none"};
    gcoll_bucketer_create(comm, &ok, &b);
    float x[4] = {1, 2, 3, 4}; /* finite: a NaN would abort the communicator (the NaN check) */
    int id;
    gcoll_bucketer_add_tensor(b, "w", x, 4, GCOLL_FLOAT32, NULL, &id);
    if (gcoll_bucketer_add_tensor(b, "w", x, 3, GCOLL_FLOAT32, NULL, &id) != GCOLL_ERR_INVALID)
        FAIL("re-registration accepted");
    if (gcoll_bucketer_ready(b, 99) != GCOLL_ERR_INVALID)
        FAIL("ready on an unknown tensor accepted");
    gcoll_bucketer_ready(b, 0);
    checks++;
    if (gcoll_bucketer_wait(b) != GCOLL_OK || x[0] != 1.0f || x[3] != 4.0f) /* avg, exact */
        FAIL("the bucketer after refused calls: %s, x = %g .. %g", gcoll_comm_last_error(comm),
             (double)x[0], (double)x[3]);
    gcoll_bucketer_destroy(b);
}

/* ---- selection per tensor inside a fused bucket (GCOLL_LAYER_SELECT) ---- */

/* Whether this run selects per tensor (GCOLL_LAYER_SELECT unset or true). */
static int layer_select(void)
{
    const char *e = getenv("GCOLL_LAYER_SELECT");
    return !e || !(strcmp(e, "0") == 0 || strcmp(e, "no") == 0 || strcmp(e, "false") == 0 ||
                   strcmp(e, "off") == 0);
}

/* Distinct magnitudes within a rank: (i * 7919 + 97 r) mod 100003 is a permutation of
 * i < 100003; signs alternate. */
static float two_val(int r, size_t i, double scale)
{
    double m = (double)((i * 7919 + (size_t)r * 97) % 100003 + 1) / 100003.0;
    return (float)((i & 1 ? -m : m) * scale);
}

static int by_abs_desc(const void *a, const void *b)
{
    const float *x = *(const float *const *)a, *y = *(const float *const *)b;
    float ax = fabsf(*x), ay = fabsf(*y);
    if (ax != ay)
        return ax < ay ? 1 : -1;
    return x < y ? -1 : x > y; /* ties to the lower index */
}

/* ref[i] += the top k of x[0..n) by |x| (by sorting: independent of lib/compress/sparsify.c) */
static void add_topk(const float *x, size_t n, size_t k, double *ref)
{
    const float **p = malloc(n * sizeof(*p));
    for (size_t i = 0; i < n; i++)
        p[i] = x + i;
    qsort(p, n, sizeof(*p), by_abs_desc);
    for (size_t j = 0; j < k && j < n; j++)
        ref[p[j] - x] += *p[j];
    free(p);
}

/* Two weight tensors (one of large values, one of values 1000 times smaller) and a small
 * bias in one bucket of top-k 1%, one step: per-tensor selection sends k = ceil(0.01 n) of
 * each from every rank (the bias: 1), per-bucket selection the bucket's k from the large
 * one only. Checked against top-k computed here by sorting, every rank's inputs. */
static void check_bucket_two_tensors(void)
{
    enum { NB = 3 };
    static const char *name[NB] = {"big.weight", "small.weight", "small.bias"};
    static const size_t n[NB] = {6000, 5000, 10};
    static const double scale[NB] = {1.0, 1e-3, 1e-6};
    gcoll_bucketer_config_t cfg = {
        .bucket_bytes = 1 << 20, .op = GCOLL_AVG, .default_spec = "topk:density=0.01"};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return;
    }
    float *g[NB], *x[NB];
    int id[NB];
    for (int t = 0; t < NB; t++) {
        g[t] = malloc(n[t] * sizeof(float));
        x[t] = malloc(n[t] * sizeof(float));
        gcoll_bucketer_add_tensor(b, name[t], g[t], n[t], GCOLL_FLOAT32, NULL, &id[t]);
        for (size_t i = 0; i < n[t]; i++)
            g[t][i] = two_val(rank, i, scale[t]);
    }
    for (int t = 0; t < NB; t++)
        gcoll_bucketer_ready(b, id[t]);
    checks++;
    if (gcoll_bucketer_wait(b) != GCOLL_OK)
        FAIL("bucketer_wait: %s", gcoll_comm_last_error(comm));
    if (gcoll_bucketer_num_buckets(b) != 1)
        FAIL("two tensors: %d buckets, expected 1", gcoll_bucketer_num_buckets(b));
    int per = layer_select();
    size_t total = n[0] + n[1] + n[2];
    double *ref = calloc(total, sizeof(double));
    float *all = malloc(total * sizeof(float));
    for (int r = 0; r < size; r++) {
        size_t off = 0;
        for (int t = 0; t < NB; t++) {
            for (size_t i = 0; i < n[t]; i++)
                x[t][i] = all[off + i] = two_val(r, i, scale[t]);
            if (per)
                add_topk(x[t], n[t], (size_t)ceil(0.01 * (double)n[t]), ref + off);
            off += n[t];
        }
        if (!per)
            add_topk(all, total, (size_t)ceil(0.01 * (double)total), ref);
    }
    size_t off = 0, nz[NB] = {0, 0, 0};
    for (int t = 0; t < NB; t++) {
        for (size_t i = 0; i < n[t]; i++) {
            double want = ref[off + i] / size;
            nz[t] += g[t][i] != 0;
            if (fabs(g[t][i] - want) > 1e-6 * fabs(want)) {
                FAIL("two tensors (per %s): %s[%zu] = %g, want %g", per ? "tensor" : "bucket",
                     name[t], i, g[t][i], want);
                break;
            }
        }
        off += n[t];
    }
    checks++;
    if (per ? (nz[1] < 50 || nz[2] < 1) : (nz[1] != 0 || nz[2] != 0))
        FAIL("per-%s selection: %zu, %zu and %zu non-zeros", per ? "tensor" : "bucket", nz[0],
             nz[1], nz[2]);
    else
        printf("rank %d: per-%s selection in one bucket: %zu, %zu and %zu non-zeros in %s, %s "
               "and %s\n",
               rank, per ? "tensor" : "bucket", nz[0], nz[1], nz[2], name[0], name[1], name[2]);
    gcoll_bucketer_destroy(b);
    for (int t = 0; t < NB; t++) {
        free(g[t]);
        free(x[t]);
    }
    free(ref);
    free(all);
}

/* Per-tensor selection in one fused bucket gives what one bucket per tensor gives, bit for
 * bit, step after step (residuals, DGC's momentum and its sampled threshold included). */
static void check_bucket_fused_equals_split(const char *spec)
{
    gcoll_bucketer_config_t fc = {.bucket_bytes = 64 << 20, .op = GCOLL_AVG, .default_spec = spec};
    gcoll_bucketer_config_t sc = fc;
    sc.bucket_bytes = 1;
    float *gf[NLAYERS], *gs[NLAYERS];
    int idf[NLAYERS], ids[NLAYERS];
    gcoll_bucketer_t *bf = make_bucketer(&fc, gf, idf), *bs = make_bucketer(&sc, gs, ids);
    if (!bf || !bs)
        return;
    for (int step = 0; step < 3; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                gf[l][i] = gs[l][i] =
                    layer_val(rank, step, l, i) * (l == 4 ? 1e-3f : 0.37f) + 1e-4f * (float)(i % 7);
        ready_all(bf, idf, -1);
        ready_all(bs, ids, -1);
        checks++;
        if (gcoll_bucketer_wait(bf) != GCOLL_OK || gcoll_bucketer_wait(bs) != GCOLL_OK) {
            FAIL("fused/split %s: %s", spec, gcoll_comm_last_error(comm));
            break;
        }
        for (int l = 0; l < NLAYERS; l++)
            if (memcmp(gf[l], gs[l], layers[l].count * sizeof(float)) != 0) {
                FAIL("%s step %d: %s in one fused bucket differs from its own bucket", spec, step,
                     layers[l].name);
                break;
            }
    }
    if (gcoll_bucketer_num_buckets(bf) != 1 || gcoll_bucketer_num_buckets(bs) != NLAYERS)
        FAIL("fused/split %s: %d and %d buckets", spec, gcoll_bucketer_num_buckets(bf),
             gcoll_bucketer_num_buckets(bs));
    free_bucketer(bf, gf);
    free_bucketer(bs, gs);
}

int run_bucket_layers(void)
{
    check_bucket_two_tensors();
    if (layer_select()) {
        check_bucket_fused_equals_split("topk:density=0.01");
        check_bucket_fused_equals_split("dgc:density=0.01,momentum=0.9");
    } else {
        /* one selection across the bucket: the compressed allreduce of the fused tensor */
        check_bucketer_compressed("topk:density=0.01+q8");
    }
    return failures;
}

int run_bucketer(void)
{
    check_bucketer_dense(1);
    check_bucketer_dense(2);
    if (!layer_select()) /* per tensor: run_bucket_layers compares with split buckets */
        check_bucketer_compressed("topk:density=0.01+q8");
    check_bucketer_compressed("sign");
    check_bucketer_errors();
    return failures;
}

/* GCOLL_ADAPT (set by the caller): every rank measures its own (noisy) times, yet all
 * must pick the same densities at every step, within the configured bounds. */
int run_adapt(void)
{
    gcoll_bucketer_config_t cfg = {
        .bucket_bytes = 256 * 1024, .op = GCOLL_AVG, .policy = "*bias*=none;*=topk:density=0.01"};
    float *g[NLAYERS];
    int id[NLAYERS];
    /* GCOLL_PROBE=1 (set by the caller): a bandwidth from init, the same on every rank */
    const char *pe = getenv("GCOLL_PROBE");
    int probed = pe && strcmp(pe, "1") == 0;
    double pb = -1, pl = -1, ph = -1;
    checks++;
    if (gcoll_comm_probe_bandwidth(comm, &pb) != GCOLL_OK ||
        gcoll_allreduce(comm, &pb, &pl, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
        gcoll_allreduce(comm, &pb, &ph, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK || pl != ph ||
        (probed ? !(pb > 0) : pb != 0))
        FAIL("probe bandwidth %g (ranks %g..%g), GCOLL_PROBE=%s", pb, pl, ph, pe ? pe : "");
    else if (probed)
        printf("rank %d: probe bandwidth %.1f MB/s, the same on every rank\n", rank, pb / 1e6);
    gcoll_bucketer_t *b = make_bucketer(&cfg, g, id);
    if (!b)
        return failures;
    int changed = 0;
    double first = -1;
    for (int step = 0; step < 12; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                g[l][i] = layer_val(rank, step, l, i) * (step < 6 ? 1.0f : 5.0f);
        ready_all(b, id, -1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("adapt step %d: %s", step, gcoll_comm_last_error(comm));
            break;
        }
        for (int k = 0; k < gcoll_bucketer_num_buckets(b); k++) {
            double d = gcoll_bucketer_density(b, k), lo = d, hi = d;
            if (gcoll_allreduce(comm, &lo, &lo, 1, GCOLL_FLOAT64, GCOLL_MIN) != GCOLL_OK ||
                gcoll_allreduce(comm, &hi, &hi, 1, GCOLL_FLOAT64, GCOLL_MAX) != GCOLL_OK ||
                lo != hi)
                FAIL("adapt step %d bucket %d: ranks chose different densities (%g..%g)", step, k,
                     lo, hi);
            if (d != 1.0 && (d < 0.001 - 1e-12 || d > 0.2 + 1e-12))
                FAIL("adapt step %d bucket %d: density %g outside [0.001, 0.2]", step, k, d);
            if (k == gcoll_bucketer_num_buckets(b) - 1 && d != 1.0) {
                if (first < 0)
                    first = d;
                changed |= d != first;
            }
        }
    }
    printf("rank %d: adaptation kept densities equal on every rank; last bucket's density now "
           "%g%s\n",
           rank, gcoll_bucketer_density(b, gcoll_bucketer_num_buckets(b) - 1),
           changed ? " (changed during the run)" : "");
    free_bucketer(b, g);
    return failures;
}

/* Rank `victim` never marks fc2.weight ready: it reports that tensor, the others time out
 * in its bucket with an error naming the bucket. */
int run_bucket_missing(int victim)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024, .default_spec = "none"};
    float *g[NLAYERS];
    int id[NLAYERS];
    gcoll_bucketer_t *b = make_bucketer(&cfg, g, id);
    if (!b)
        return failures;
    double t0 = now();
    ready_all(b, id, rank == victim ? 4 : -1);
    gcoll_status_t st = gcoll_bucketer_wait(b);
    const char *err = gcoll_comm_last_error(comm);
    if (st == GCOLL_OK)
        FAIL("missing ready() went unnoticed");
    else if (rank == victim && !strstr(err, "fc2.weight"))
        FAIL("the rank that skipped ready() does not name the tensor: %s", err);
    else if (rank != victim && !strstr(err, "bucket"))
        FAIL("the others' error does not name the bucket: %s", err);
    else
        printf("rank %d: missing ready() failed as expected after %.2f s: %s | %s\n", rank,
               now() - t0, gcoll_status_string(st), err);
    free_bucketer(b, g);
    return failures;
}

/* A rank whose gradient holds a NaN: it gets GCOLL_ERR_INVALID naming the tensor and the
 * element (found while the bucket is gathered), the others an error, nobody hangs. With
 * accumulation (the NaN in the last of `accumulate` steps) the encoder finds it in the
 * accumulated sum: GCOLL_ERR_INVALID there too, and an error everywhere. */
int run_bucket_nan(int victim, int accumulate)
{
    gcoll_bucketer_config_t cfg = {.bucket_bytes = 256 * 1024,
                                   .default_spec = "topk:density=0.1",
                                   .accumulate_steps = accumulate};
    float *g[NLAYERS];
    int id[NLAYERS];
    gcoll_bucketer_t *b = make_bucketer(&cfg, g, id);
    if (!b)
        return failures;
    gcoll_status_t st = GCOLL_OK;
    double t0 = now();
    for (int step = 0; step < (accumulate > 1 ? accumulate : 1) && st == GCOLL_OK; step++) {
        for (int l = 0; l < NLAYERS; l++)
            for (size_t i = 0; i < layers[l].count; i++)
                g[l][i] = (float)(i % 7) - 3.0f;
        if (rank == victim && step == (accumulate > 1 ? accumulate : 1) - 1)
            g[4][17] = NAN; /* fc2.weight */
        t0 = now();
        ready_all(b, id, -1);
        st = gcoll_bucketer_wait(b);
    }
    const char *err = gcoll_comm_last_error(comm);
    checks++;
    if (st == GCOLL_OK)
        FAIL("a NaN gradient went unnoticed");
    else if (rank == victim && accumulate > 1 && st != GCOLL_ERR_INVALID)
        FAIL("the rank with the NaN got %s: %s", gcoll_status_string(st), err);
    else if (rank == victim && accumulate <= 1 &&
             (st != GCOLL_ERR_INVALID || !strstr(err, "fc2.weight") || !strstr(err, "element 17")))
        FAIL("the rank with the NaN does not name the tensor and element: %s: %s",
             gcoll_status_string(st), err);
    else
        printf("rank %d: NaN gradient failed as expected after %.2f s: %s | %s\n", rank, now() - t0,
               gcoll_status_string(st), err);
    free_bucketer(b, g);
    return failures;
}

/* ---- warm-up on the wire ---- */

/* The bytes a compressed allreduce puts on the wire follow the warm-up schedule step by
 * step: with GCOLL_SPARSE_ALGO=allgather (set by the caller) and the same gradient on
 * every rank, each rank sends its message (P - 1) times plus a census of fixed size. The
 * message is the one a shadow state encodes from the same gradient; its pair count is
 * ceil(density x n) of the density computed here from the schedule's definition. */
int run_warmup(void)
{
    static const struct {
        const char *spec;
        double d[12]; /* density at steps 0..11, by hand from the schedule */
    } cases[] = {
        /* exp, four stages of 2 steps, geometric from 1 to 0.0001: ratio 0.1 */
        {"topk:density=0.0001,warmup_steps=8",
         {1, 1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0001, 0.0001, 0.0001, 0.0001}},
        /* linear from 0.5 to 0.1 over 4 steps */
        {"dgc:density=0.1,warmup_steps=4,warmup_start=0.5,schedule=linear,select=exact",
         {0.5, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1}},
        /* step: 0.05 for 3 steps */
        {"topk:density=0.001,warmup_steps=3,warmup_start=0.05,schedule=step",
         {0.05, 0.05, 0.05, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001}},
    };
    const size_t n = 20000;
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    for (size_t cs = 0; cs < sizeof(cases) / sizeof(*cases); cs++) {
        gcoll_compressor_t *c;
        gcoll_tensor_state_t *s, *sh;
        if (gcoll_compressor_create(cases[cs].spec, &c) != GCOLL_OK ||
            gcoll_state_create(c, n, &s) != GCOLL_OK || gcoll_state_create(c, n, &sh) != GCOLL_OK) {
            FAIL("warmup: cannot create %s", cases[cs].spec);
            break;
        }
        size_t cap = gcoll_compressor_bound(c, n);
        uint8_t *msg = malloc(cap);
        long long over0 = -1;
        for (int t = 0; t < 12; t++) {
            for (size_t i = 0; i < n; i++) /* the same on every rank, no zeros */
                g[i] = (float)((i * 7919 + (size_t)t * 31) % 10007 + 1) * (i & 1 ? -1e-3f : 1e-3f);
            gcoll_counters_t c0, c1;
            gcoll_comm_counters(comm, &c0);
            checks++;
            if (gcoll_compressed_allreduce(comm, s, g, out, n, GCOLL_AVG) != GCOLL_OK) {
                FAIL("warmup %s step %d: %s", cases[cs].spec, t, gcoll_comm_last_error(comm));
                break;
            }
            gcoll_comm_counters(comm, &c1);
            size_t len = 0, nnz = 0;
            if (gcoll_encode(c, sh, g, n, msg, cap, &len) != GCOLL_OK ||
                gcoll_decode_info(msg, len, NULL, &nnz) != GCOLL_OK) {
                FAIL("warmup %s step %d: shadow encode", cases[cs].spec, t);
                break;
            }
            size_t k = (size_t)ceil(cases[cs].d[t] * (double)n - 1e-9);
            int dense = 8 * k > 4 * n; /* then the message is dense: n values */
            long long sent = (long long)(c1.bytes_sent - c0.bytes_sent);
            long long over = sent - (long long)(size - 1) * (long long)len;
            if (nnz != (dense ? n : k))
                FAIL("warmup %s step %d: %zu values sent, want %zu", cases[cs].spec, t, nnz,
                     dense ? n : k);
            if (over0 < 0)
                over0 = over;
            if (over != over0 || over < 0 || over > 1024)
                FAIL("warmup %s step %d: %lld bytes sent for a message of %zu (%lld beyond it, "
                     "%lld at step 0)",
                     cases[cs].spec, t, sent, len, over, over0);
            if (rank == 0 && cs == 0)
                printf("warmup %s step %d: density %g, %zu values, message %zu bytes, %lld sent\n",
                       cases[cs].spec, t, cases[cs].d[t], nnz, len, sent);
        }
        free(msg);
        gcoll_state_destroy(s);
        gcoll_state_destroy(sh);
        gcoll_compressor_destroy(c);
    }
    /* qsgd's bit width 8, 6, 4, 3 then 2 (exp over 8 steps; no feedback, so that each step
     * stands alone): whatever scheme carries it,
     * each step's bytes follow the width, every rank decodes the same result, and the
     * result is the (common) gradient within the width's quantization error */
    gcoll_compressor_t *q;
    gcoll_tensor_state_t *qs;
    if (gcoll_compressor_create("qsgd:bits=2,warmup_steps=8,ef=0", &q) != GCOLL_OK ||
        gcoll_state_create(q, n, &qs) != GCOLL_OK) {
        FAIL("warmup: cannot create the qsgd state");
    } else {
        static const unsigned bits[10] = {8, 8, 6, 6, 4, 4, 3, 3, 2, 2};
        long long sent[10];
        for (int t = 0; t < 10; t++) {
            for (size_t i = 0; i < n; i++)
                g[i] = (float)((i * 7919 + (size_t)t * 31) % 10007 + 1) * (i & 1 ? -1e-3f : 1e-3f);
            gcoll_counters_t c0, c1;
            gcoll_comm_counters(comm, &c0);
            checks++;
            if (gcoll_compressed_allreduce(comm, qs, g, out, n, GCOLL_AVG) != GCOLL_OK) {
                FAIL("warmup qsgd step %d: %s", t, gcoll_comm_last_error(comm));
                break;
            }
            gcoll_comm_counters(comm, &c1);
            sent[t] = (long long)(c1.bytes_sent - c0.bytes_sent);
            double e2 = 0, g2 = 0;
            for (size_t i = 0; i < n; i++) {
                e2 += ((double)out[i] - g[i]) * ((double)out[i] - g[i]);
                g2 += (double)g[i] * g[i];
            }
            /* QSGD's relative variance per bucket of 512 with s = 2^(b-1) - 1 levels is at
             * most min(512/s^2, sqrt(512)/s): a loose bound on one step's error */
            double sl = (double)((1u << (bits[t] - 1)) - 1);
            double bound = fmin(512.0 / (sl * sl), sqrt(512.0) / sl);
            if (!(e2 <= 4.0 * bound * g2))
                FAIL("warmup qsgd step %d (%u bits): relative error %g, bound %g", t, bits[t],
                     sqrt(e2 / g2), 2.0 * sqrt(bound));
            if (t > 0 && bits[t] == bits[t - 1] && sent[t] != sent[t - 1])
                FAIL("warmup qsgd step %d: %lld bytes at %u bits, %lld the step before", t, sent[t],
                     bits[t], sent[t - 1]);
            if (t > 0 && bits[t] < bits[t - 1] && !(sent[t] < sent[t - 1]))
                FAIL("warmup qsgd step %d: %lld bytes at %u bits, not fewer than %lld at %u", t,
                     sent[t], bits[t], sent[t - 1], bits[t - 1]);
            /* 2 ranks, the all-to-all scheme: a chunk of n/2 out, the re-compressed chunk
             * back: a 48-byte header, a float scale per 512 values, the packed codes */
            long long m = (long long)n / 2,
                      msg = 48 + 4 * ((m + 511) / 512) + (m * bits[t] + 7) / 8;
            if (size == 2 && sent[t] != 2 * msg)
                FAIL("warmup qsgd step %d: %lld bytes sent, want 2 x %lld", t, sent[t], msg);
            if (rank == 0)
                printf("warmup qsgd step %d: %u bits, %lld bytes sent\n", t, bits[t], sent[t]);
        }
        /* the payload scales with the width: 8 bits against 2, scales aside */
        if (!(sent[0] > 3 * sent[9]))
            FAIL("warmup qsgd: %lld bytes at 8 bits, %lld at 2", sent[0], sent[9]);
    }
    gcoll_state_destroy(qs);
    gcoll_compressor_destroy(q);
    free(g);
    free(out);
    return failures;
}
