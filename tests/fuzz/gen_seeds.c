/* gen_seeds.c: writes the committed seed corpora of the codec fuzz targets (run by run-fuzzers.sh
 * --seeds). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compress/compress.h"

static void put(const char *dir, const char *name, const void *a, size_t alen, const void *b,
                size_t blen)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen)) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static void fill(float *x, size_t n, unsigned seed)
{
    uint64_t s = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * (float)(1 + i % 9);
    }
}

/* Valid messages of each spec (index = selector byte) at a few sizes. */
static void messages(const char *dir, const char *const *specs, size_t nspecs)
{
    static const size_t sizes[] = {0, 1, 9, 40, 300};
    float x[300];
    uint8_t buf[4096];
    for (size_t s = 0; s < nspecs; s++) {
        gcoll_compressor_t *c;
        if (gcoll_compressor_create(specs[s], &c) != GCOLL_OK)
            exit(1);
        gcoll_tensor_state_t *st;
        for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
            size_t n = sizes[z], len;
            fill(x, n, (unsigned)(s * 10 + z));
            if (gcoll_state_create(c, n, &st) != GCOLL_OK ||
                gcoll_encode(c, st, x, n, buf, sizeof(buf), &len) != GCOLL_OK)
                exit(1);
            gcoll_state_destroy(st);
            uint8_t sel = (uint8_t)s;
            char name[64];
            snprintf(name, sizeof(name), "seed-%02zu-%zu", s, n);
            put(dir, name, &sel, 1, buf, len);
        }
        gcoll_compressor_destroy(c);
    }
}

/* Row-coded messages (rowsparse, a few touched rows of a larger tensor, the last one
 * short) as seeds of selector sel of the sparse decoders. */
static void row_messages(const char *dir, uint8_t sel, const char *spec, size_t dim)
{
    gcoll_compressor_t *c;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK)
        exit(1);
    static const size_t sizes[] = {301, 1003};
    float x[1003];
    uint8_t buf[8192];
    for (size_t z = 0; z < 2; z++) {
        size_t n = sizes[z], len;
        memset(x, 0, sizeof(x));
        for (size_t r = 3; r * dim < n; r += 17 + z * 20)
            for (size_t j = 0; j < dim && r * dim + j < n; j++)
                x[r * dim + j] = (float)(j + 1) * 0.5f;
        x[n - 1] = 2.0f;
        if (gcoll_encode(c, NULL, x, n, buf, sizeof(buf), &len) != GCOLL_OK)
            exit(1);
        char name[64];
        snprintf(name, sizeof(name), "rows-%02u-%zu", sel, n);
        put(dir, name, &sel, 1, buf, len);
    }
    gcoll_compressor_destroy(c);
}

/* Checkpoints of states of each spec (index = selector byte, as in fuzz_state.c) after two
 * encodes, so vq's carry a warm codebook; the first spec's also with a warm server state. */
static void states(const char *dir, const char *const *specs, size_t nspecs)
{
    static const size_t sizes[] = {1, 9, 40};
    float x[40];
    uint8_t msg[4096], buf[8192];
    for (size_t s = 0; s < nspecs; s++) {
        gcoll_compressor_t *c;
        if (gcoll_compressor_create(specs[s], &c) != GCOLL_OK)
            exit(1);
        for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
            size_t n = sizes[z], len;
            gcoll_tensor_state_t *st;
            if (gcoll_state_create(c, n, &st) != GCOLL_OK)
                exit(1);
            for (unsigned t = 0; t < 2; t++) {
                fill(x, n, (unsigned)(s * 10 + z + t));
                if (gcoll_encode(c, st, x, n, msg, sizeof(msg), &len) != GCOLL_OK)
                    exit(1);
            }
            if (s == 0 && z == 2) {
                if (gcoll_state_create_mode(c, n / 2, GCOLL_STATE_SERVER, &st->server) !=
                        GCOLL_OK ||
                    gcoll_encode(c, st->server, x, n / 2, msg, sizeof(msg), &len) != GCOLL_OK)
                    exit(1);
            }
            if (gcoll_state_save(st, buf, sizeof(buf), &len) != GCOLL_OK)
                exit(1);
            gcoll_state_destroy(st);
            uint8_t sel = (uint8_t)s;
            char name[64];
            snprintf(name, sizeof(name), "seed-%02zu-%zu", s, n);
            put(dir, name, &sel, 1, buf, len);
        }
        gcoll_compressor_destroy(c);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds CORPUS_ROOT\n");
        return 2;
    }
    const char *root = argv[1];
    const char *dirs[] = {"decode_dense", "decode_sparse", "decode_randomk",
                          "encode",       "spec",          "state"};
    char d[6][512];
    for (int i = 0; i < 6; i++) {
        snprintf(d[i], sizeof(d[i]), "%s/%s", root, dirs[i]);
        if (mkdir(d[i], 0755) && errno != EEXIST) {
            perror(d[i]);
            return 1;
        }
    }
    /* keep these tables in the order of the targets' tables */
    static const char *const dense[] = {"none",
                                        "fp16",
                                        "bf16",
                                        "q8:bucket=16",
                                        "q8",
                                        "sign",
                                        "sign:chunk=16",
                                        "qsgd:bits=2,bucket=8",
                                        "qsgd:bits=5,bucket=16",
                                        "qsgd:bits=8,bucket=512",
                                        "fp8:format=e4m3",
                                        "fp8:format=e5m2,round=stochastic",
                                        "mxfp8:format=e4m3",
                                        "mxfp8:format=e5m2",
                                        "mxfp4",
                                        "bf16:round=stochastic",
                                        "vq:dim=4,bits=3",
                                        "vq:dim=3,bits=8"};
    static const char *const sparse[] = {"topk:density=0.1",
                                         "threshold:tau=0.1",
                                         "topk:density=0.1+q8:bucket=8",
                                         "topk:density=0.1+qsgd:bits=3,bucket=8",
                                         "topk:density=0.1+fp16",
                                         "topk:density=0.1+bf16",
                                         "topk:density=0.1+sign",
                                         "dgc:density=0.1",
                                         "topk:density=0.1+mxfp4",
                                         "topk:density=0.1+fp8:format=e5m2",
                                         "rowsparse:dim=4",
                                         "rowsparse:dim=3,density=0.5+mxfp4"};
    static const char *const rk[] = {
        "randomk:density=0.1,seed=1", "randomk:density=0.1,seed=1+q8:bucket=8",
        "randomk:density=0.1,seed=1+fp16", "randomk:density=0.1,seed=1+mxfp8:format=e4m3"};
    messages(d[0], dense, sizeof(dense) / sizeof(*dense));
    messages(d[1], sparse, sizeof(sparse) / sizeof(*sparse));
    row_messages(d[1], 10, sparse[10], 4);
    row_messages(d[1], 11, sparse[11], 3);
    messages(d[2], rk, sizeof(rk) / sizeof(*rk));
    float x[200];
    for (unsigned s = 0; s < 18; s++) {
        size_t n = (size_t[]){0, 3, 17, 64, 200}[s % 5];
        fill(x, n, s);
        if (s % 6 == 5 && n > 2)
            x[n / 2] = NAN;
        uint8_t sel = (uint8_t)(s | (s % 4 == 3 ? 0x80 : 0));
        char name[64];
        snprintf(name, sizeof(name), "seed-%02u", s);
        put(d[3], name, &sel, 1, x, n * sizeof(float));
    }
    static const char *const specs[] = {
        "none",
        "fp16:clip=1",
        "q8:bucket=64",
        "sign:scale=l2,chunk=64",
        "qsgd:bits=4",
        "topk:density=0.01,select=reuse,reuse_steps=4",
        "topk:k=5+q8",
        "randomk:density=0.1,seed=3,unbiased=1,ef=0",
        "threshold:tau=0.5+bf16",
        "dgc:density=0.001,momentum=0.9,warmup_steps=10,schedule=linear",
        "topk:density=2",
        "topk:density=0.1+qsgd:bits=3,bucket=8,ef=0",
        "fp8:format=e5m2,round=stochastic",
        "mxfp8:format=e4m3,ef=0",
        "topk:density=0.1+mxfp4:round=stochastic",
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(*specs); i++) {
        char name[64];
        snprintf(name, sizeof(name), "seed-%02zu", i);
        put(d[4], name, specs[i], strlen(specs[i]), NULL, 0);
    }
    static const char *const state_specs[] = {"vq:dim=4,bits=3", "vq:dim=2,bits=5,ef=0",
                                              "topk:density=0.1", "dgc:density=0.1", "q8"};
    states(d[5], state_specs, sizeof(state_specs) / sizeof(*state_specs));
    return 0;
}
