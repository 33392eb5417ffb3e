/* check_overlap.c: coll_check's overlap mode. The bucketer's results are bit-identical to
 * per-tensor reduction for any ready() order and timing, any layout (automatic with its
 * split tensors and rebuild, or GCOLL_BUCKET_BYTES sizes) and either priority setting
 * (GCOLL_BUCKET_PRIORITY, set by the caller); compressed buckets equal the compressed
 * allreduce of each bucket however the buckets are ordered; gcoll_bucketer_wait_tensor
 * returns the tensor's final result before the step ends. Every rank logs the order its
 * buckets ran in (GCOLL_DEBUG=debug), which the calling script compares across ranks.
 * CHECK_OVERLAP=pipeline: compressed buckets encoded ahead by the codec worker
 * (GCOLL_BUCKET_PIPELINE=1) give bit for bit what buckets encoded in their turn give, and
 * the compressed allreduce of each bucket; CHECK_OVERLAP=kill (stall): the last rank dies
 * (stops) inside a pipelined step and the others end it with an error. */
#include <unistd.h>

#include "check.h"

/* backward order: the model's last layer first; 1.2 MB 'b.weight' is split by the
 * automatic sizes (about 1/8 of the 3.2 MB model per bucket) */
static const struct {
    const char *name;
    size_t count;
} ov[] = {
    {"head.bias", 10},    {"head.weight", 40000}, {"f.bias", 3},        {"f.weight", 100000},
    {"e.weight", 65536},  {"d.bias", 512},        {"d.weight", 200704}, {"c.norm", 256},
    {"b.weight", 300000}, {"a.bias", 64},         {"a.weight", 90000},
};
#define NOV ((int)(sizeof(ov) / sizeof(ov[0])))

/* Small integers: their sums are exact in any order, so reduction order cannot hide a
 * misplaced element, and bit equality with the reference is the check. */
static float ov_val(int r, int step, int l, size_t i)
{
    return (float)((int)((i * 11 + (size_t)l * 7 + (size_t)r * 5 + (size_t)step * 3) % 23) - 11);
}

static uint64_t ov_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* This rank's ready order for a step: a shuffle seeded by rank and step, and a pause of
 * 0-2 ms before some tensors, different on every rank (timings differ, so do launches). */
static void ov_ready(gcoll_bucketer_t *b, const int *id, int step)
{
    int order[NOV];
    uint64_t s = (uint64_t)(rank * 1000 + step) * 2654435761u + 1;
    for (int l = 0; l < NOV; l++)
        order[l] = l;
    if (step % 3 != 0) /* every third step in backward order */
        for (int l = NOV - 1; l > 0; l--) {
            int j = (int)(ov_rng(&s) % (uint64_t)(l + 1)), x = order[l];
            order[l] = order[j];
            order[j] = x;
        }
    for (int k = 0; k < NOV; k++) {
        if (ov_rng(&s) % 3 == 0)
            usleep((useconds_t)(ov_rng(&s) % 2000));
        if (gcoll_bucketer_ready(b, id[order[k]]) != GCOLL_OK)
            FAIL("ready(%s): %s", ov[order[k]].name, gcoll_comm_last_error(comm));
    }
}

/* Dense: several steps (past the automatic layout's rebuild after the second) against a
 * per-tensor gcoll_allreduce of the same inputs. */
static void ov_dense(size_t bucket_bytes)
{
    gcoll_bucketer_config_t cfg = {
        .bucket_bytes = bucket_bytes, .op = GCOLL_AVG, .default_spec = "none"};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, bucket_bytes ? &cfg : NULL, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return;
    }
    float *g[NOV], *in[NOV], *ref[NOV], *early = malloc(ov[NOV - 1].count * sizeof(float));
    int id[NOV], nb0 = 0;
    for (int l = 0; l < NOV; l++) {
        g[l] = malloc(ov[l].count * sizeof(float));
        in[l] = malloc(ov[l].count * sizeof(float));
        ref[l] = malloc(ov[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, ov[l].name, g[l], ov[l].count, GCOLL_FLOAT32, NULL, &id[l]);
    }
    for (int step = 0; step < 5 && !failures; step++) {
        for (int l = 0; l < NOV; l++)
            for (size_t i = 0; i < ov[l].count; i++)
                in[l][i] = g[l][i] = ov_val(rank, step, l, i);
        ov_ready(b, id, step);
        checks++;
        /* the first layer (registered last) is final before the step ends */
        if (gcoll_bucketer_wait_tensor(b, id[NOV - 1]) != GCOLL_OK)
            FAIL("wait_tensor: %s", gcoll_comm_last_error(comm));
        memcpy(early, g[NOV - 1], ov[NOV - 1].count * sizeof(float));
        /* queued behind the step's buckets on every rank */
        for (int l = 0; l < NOV; l++)
            gcoll_allreduce(comm, in[l], ref[l], ov[l].count, GCOLL_FLOAT32, GCOLL_AVG);
        if (memcmp(early, ref[NOV - 1], ov[NOV - 1].count * sizeof(float)) != 0)
            FAIL("bucket_bytes %zu step %d: %s not final after wait_tensor", bucket_bytes, step,
                 ov[NOV - 1].name);
        if (step == 0)
            nb0 = gcoll_bucketer_num_buckets(b);
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("bucketer_wait: %s", gcoll_comm_last_error(comm));
            break;
        }
        for (int l = 0; l < NOV; l++)
            if (memcmp(g[l], ref[l], ov[l].count * sizeof(float)) != 0) {
                FAIL("bucket_bytes %zu step %d: %s differs from the per-tensor allreduce",
                     bucket_bytes, step, ov[l].name);
                break;
            }
    }
    int nb = gcoll_bucketer_num_buckets(b);
    printf("rank %d: bucket_bytes %zu: %d buckets, %d after the rebuild\n", rank, bucket_bytes, nb0,
           nb);
    /* before the rebuild (whose sizes follow the measured per-bucket cost): 1/8 of the
     * model per bucket, the large tensor split */
    if (bucket_bytes == 0 && nb0 < 8)
        FAIL("automatic sizes made %d buckets of a 3.2 MB model, expected at least 8", nb0);
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NOV; l++) {
        free(g[l]);
        free(in[l]);
        free(ref[l]);
    }
    free(early);
}

/* Compressed, GCOLL_BUCKET_BYTES layout: each bucket's result is the compressed allreduce
 * of its fused tensors with its own state, whatever order the buckets ran in. The layout
 * is recomputed here from the documented rule (whole tensors, a new bucket when the next
 * tensor would pass bucket_bytes). */
static void ov_compressed(const char *spec, size_t bucket_bytes)
{
    gcoll_bucketer_config_t cfg = {
        .bucket_bytes = bucket_bytes, .op = GCOLL_SUM, .default_spec = spec};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return;
    }
    float *g[NOV];
    int id[NOV], first[NOV + 1], nb = 0;
    size_t bytes = 0;
    for (int l = 0; l < NOV; l++) {
        g[l] = malloc(ov[l].count * sizeof(float));
        gcoll_bucketer_add_tensor(b, ov[l].name, g[l], ov[l].count, GCOLL_FLOAT32, NULL, &id[l]);
        if (l == 0 || (bytes > 0 && bytes + ov[l].count * 4 > bucket_bytes)) {
            first[nb++] = l;
            bytes = 0;
        }
        bytes += ov[l].count * 4;
    }
    first[nb] = NOV;
    gcoll_tensor_state_t *st[NOV];
    gcoll_compressor_t *c;
    gcoll_compressor_create(spec, &c);
    size_t len[NOV];
    float *fused[NOV], *out[NOV];
    for (int j = 0; j < nb; j++) {
        len[j] = 0;
        for (int l = first[j]; l < first[j + 1]; l++)
            len[j] += ov[l].count;
        gcoll_state_create(c, len[j], &st[j]);
        fused[j] = malloc(len[j] * sizeof(float));
        out[j] = malloc(len[j] * sizeof(float));
    }
    for (int step = 0; step < 3 && !failures; step++) {
        for (int j = 0; j < nb; j++)
            for (int l = first[j], off = 0; l < first[j + 1]; off += (int)ov[l].count, l++)
                for (size_t i = 0; i < ov[l].count; i++)
                    fused[j][off + i] = g[l][i] = ov_val(rank, step, l, i) * 0.37f;
        ov_ready(b, id, step + 1);
        checks++;
        if (gcoll_bucketer_wait(b) != GCOLL_OK) {
            FAIL("bucketer %s: %s", spec, gcoll_comm_last_error(comm));
            break;
        }
        for (int j = 0; j < nb; j++) {
            if (gcoll_compressed_allreduce(comm, st[j], fused[j], out[j], len[j], GCOLL_SUM) !=
                GCOLL_OK)
                FAIL("compressed allreduce: %s", gcoll_comm_last_error(comm));
            for (int l = first[j], off = 0; l < first[j + 1]; off += (int)ov[l].count, l++)
                if (memcmp(g[l], out[j] + off, ov[l].count * sizeof(float)) != 0)
                    FAIL("%s step %d: %s differs from its bucket's compressed allreduce", spec,
                         step, ov[l].name);
        }
    }
    if (gcoll_bucketer_num_buckets(b) != nb)
        FAIL("%s: %d buckets, the rule gives %d", spec, gcoll_bucketer_num_buckets(b), nb);
    gcoll_bucketer_destroy(b);
    for (int j = 0; j < nb; j++) {
        gcoll_state_destroy(st[j]);
        free(fused[j]);
        free(out[j]);
    }
    gcoll_compressor_destroy(c);
    for (int l = 0; l < NOV; l++)
        free(g[l]);
}

/* A duplicate of comm that reads GCOLL_BUCKET_PIPELINE=pipeline and, with a fixed
 * automatic layout (no rebuild from timings), GCOLL_BUCKET_REBUILD=0 at its creation. */
static gcoll_comm_t *dup_pipeline(const char *pipeline)
{
    const char *was = getenv("GCOLL_BUCKET_PIPELINE"), *wr = getenv("GCOLL_BUCKET_REBUILD");
    char *keep = was ? strdup(was) : NULL, *keepr = wr ? strdup(wr) : NULL;
    setenv("GCOLL_BUCKET_PIPELINE", pipeline, 1);
    setenv("GCOLL_BUCKET_REBUILD", "0", 1);
    gcoll_comm_t *c = NULL;
    if (gcoll_comm_dup(comm, &c) != GCOLL_OK) {
        FAIL("comm_dup: %s", gcoll_comm_last_error(comm));
        c = NULL;
    }
    if (keep)
        setenv("GCOLL_BUCKET_PIPELINE", keep, 1);
    else
        unsetenv("GCOLL_BUCKET_PIPELINE");
    if (keepr)
        setenv("GCOLL_BUCKET_REBUILD", keepr, 1);
    else
        unsetenv("GCOLL_BUCKET_REBUILD");
    free(keep);
    free(keepr);
    return c;
}

/* The same steps through a pipelined bucketer and one that encodes in each bucket's turn,
 * on two communicators, with different shuffled ready() orders: bit-identical results,
 * step after step (the residuals carry every difference forward). */
static void ov_pipeline(gcoll_comm_t *on, gcoll_comm_t *off, const char *spec, size_t bucket_bytes)
{
    gcoll_bucketer_config_t cfg = {
        .bucket_bytes = bucket_bytes, .op = GCOLL_AVG, .default_spec = spec};
    gcoll_bucketer_t *b[2] = {NULL, NULL};
    float *g[2][NOV];
    int id[2][NOV];
    memset(g, 0, sizeof(g));
    for (int v = 0; v < 2; v++) {
        if (gcoll_bucketer_create(v ? off : on, &cfg, &b[v]) != GCOLL_OK) {
            FAIL("bucketer_create %s: %s", spec, gcoll_comm_last_error(v ? off : on));
            goto out;
        }
        for (int l = 0; l < NOV; l++) {
            g[v][l] = malloc(ov[l].count * sizeof(float));
            gcoll_bucketer_add_tensor(b[v], ov[l].name, g[v][l], ov[l].count, GCOLL_FLOAT32, NULL,
                                      &id[v][l]);
        }
    }
    for (int step = 0; step < 5 && !failures; step++) {
        for (int v = 0; v < 2 && !failures; v++) {
            for (int l = 0; l < NOV; l++)
                for (size_t i = 0; i < ov[l].count; i++)
                    g[v][l][i] = ov_val(rank, step, l, i) * 0.37f;
            ov_ready(b[v], id[v], 7 * step + 1 + 3 * v);
            /* the first layer's result while later buckets may still run */
            if (gcoll_bucketer_wait_tensor(b[v], id[v][NOV - 1]) != GCOLL_OK ||
                gcoll_bucketer_wait(b[v]) != GCOLL_OK)
                FAIL("bucketer %s (pipeline %d) step %d: %s", spec, !v, step,
                     gcoll_comm_last_error(v ? off : on));
        }
        checks++;
        for (int l = 0; l < NOV && !failures; l++)
            if (memcmp(g[0][l], g[1][l], ov[l].count * sizeof(float)) != 0)
                FAIL("%s bucket_bytes %zu step %d: %s encoded ahead differs from the same "
                     "encoded in its turn",
                     spec, bucket_bytes, step, ov[l].name);
    }
    if (!failures && gcoll_bucketer_num_buckets(b[0]) != gcoll_bucketer_num_buckets(b[1]))
        FAIL("%s: %d buckets pipelined, %d not", spec, gcoll_bucketer_num_buckets(b[0]),
             gcoll_bucketer_num_buckets(b[1]));
    if (rank == 0)
        printf("pipeline %s bucket_bytes %zu: %d buckets, 5 steps identical\n", spec, bucket_bytes,
               gcoll_bucketer_num_buckets(b[0]));
out:
    for (int v = 0; v < 2; v++) {
        gcoll_bucketer_destroy(b[v]);
        for (int l = 0; l < NOV; l++)
            free(g[v][l]);
    }
}

/* The last rank exits (stall: stops for 12 s) in the middle of step 2's ready() calls;
 * every other rank's step must end with an error (a dead peer, GCOLL_TIMEOUT_MS), not
 * hang. Exit status 0 means the error came; the calling script bounds the time. */
static int ov_kill(int stall)
{
    gcoll_bucketer_config_t cfg = {.op = GCOLL_AVG, .default_spec = "topk:density=0.05"};
    gcoll_bucketer_t *b;
    if (gcoll_bucketer_create(comm, &cfg, &b) != GCOLL_OK) {
        FAIL("bucketer_create: %s", gcoll_comm_last_error(comm));
        return failures;
    }
    float *g[NOV];
    int id[NOV];
    for (int l = 0; l < NOV; l++) {
        g[l] = malloc(ov[l].count * sizeof(float));
        for (size_t i = 0; i < ov[l].count; i++)
            g[l][i] = ov_val(rank, 0, l, i);
        gcoll_bucketer_add_tensor(b, ov[l].name, g[l], ov[l].count, GCOLL_FLOAT32, NULL, &id[l]);
    }
    gcoll_status_t st = GCOLL_OK;
    double t0 = 0;
    for (int step = 0; step < 4 && st == GCOLL_OK; step++) {
        if (step == 2)
            t0 = now();
        for (int l = 0; l < NOV && st == GCOLL_OK; l++) {
            if (step == 2 && l == NOV / 2 && rank == size - 1) {
                if (!stall) {
                    fprintf(stderr, "rank %d: exiting in step 2\n", rank);
                    _exit(3);
                }
                fprintf(stderr, "rank %d: stalling 12 s in step 2\n", rank);
                sleep(12);
            }
            st = gcoll_bucketer_ready(b, id[l]);
        }
        if (st == GCOLL_OK)
            st = gcoll_bucketer_wait(b);
    }
    if (st == GCOLL_OK)
        FAIL("the steps after rank %d died succeeded", size - 1);
    else
        printf("rank %d: pipelined step failed after %.1f s: %s (%s)\n", rank, now() - t0,
               gcoll_status_string(st), gcoll_comm_last_error(comm));
    gcoll_bucketer_destroy(b);
    for (int l = 0; l < NOV; l++)
        free(g[l]);
    gcoll_comm_abort(comm);
    return failures;
}

static int ov_pipelines(void)
{
    gcoll_comm_t *on = dup_pipeline("1"), *off = dup_pipeline("0");
    static const char *const specs[] = {"topk:density=0.05", "dgc:density=0.05,momentum=0.9",
                                        "randomk:density=0.05", "topk:density=0.05+q8", "sign"};
    for (int i = 0; on && off && i < 5 && !failures; i++) {
        ov_pipeline(on, off, specs[i], 0); /* automatic: split tensors, several buckets */
        if (i != 4)
            ov_pipeline(on, off, specs[i], 256 * 1024);
    }
    if (on)
        gcoll_comm_destroy(on);
    if (off)
        gcoll_comm_destroy(off);
    /* and against each bucket's compressed allreduce (one k across a bucket there) */
    const char *ls = getenv("GCOLL_LAYER_SELECT");
    if (!failures && ls && strcmp(ls, "0") == 0) {
        ov_compressed("topk:density=0.05", 256 * 1024);
        ov_compressed("dgc:density=0.05,momentum=0.9", 256 * 1024);
        ov_compressed("randomk:density=0.05", 64 * 1024);
    }
    return failures;
}

int run_overlap(void)
{
    const char *only = getenv("CHECK_OVERLAP");
    if (only && strcmp(only, "pipeline") == 0)
        return ov_pipelines();
    if (only && (strcmp(only, "kill") == 0 || strcmp(only, "stall") == 0))
        return ov_kill(strcmp(only, "stall") == 0);
    ov_dense(0); /* automatic (GCOLL_BUCKET_BYTES unset) */
    ov_dense(4096);
    ov_dense(256 * 1024);
    ov_dense(1 << 20);
    ov_compressed("sign", 256 * 1024);
    const char *ls = getenv("GCOLL_LAYER_SELECT");
    if (ls && strcmp(ls, "0") == 0) /* one k across a fused bucket, as the reference */
        ov_compressed("topk:density=0.05", 256 * 1024);
    return failures;
}
