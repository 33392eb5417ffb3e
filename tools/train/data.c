/* data.c: Fashion-MNIST loading (four IDX files), shuffling and minibatch assembly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "idx.h"

/* Finds dir/base.gz or dir/base; prefers the gzipped name as Debian ships it. */
static void find_file(const char *dir, const char *base, char *path, size_t len)
{
    snprintf(path, len, "%s/%s.gz", dir, base);
    if (access(path, F_OK) == 0)
        return;
    snprintf(path, len, "%s/%s", dir, base);
    if (access(path, F_OK) == 0)
        return;
    snprintf(path, len, "%s/%s.gz", dir, base); /* report the name we expected */
}

static int load_split(const char *dir, const char *prefix, train_split_t *s, char *err,
                      size_t errlen)
{
    char ipath[4096], lpath[4096], base[64];
    snprintf(base, sizeof(base), "%s-images-idx3-ubyte", prefix);
    find_file(dir, base, ipath, sizeof(ipath));
    snprintf(base, sizeof(base), "%s-labels-idx1-ubyte", prefix);
    find_file(dir, base, lpath, sizeof(lpath));
    train_idx_t im = {0}, lb = {0};
    if (train_idx_load(ipath, 3, &im, err, errlen) != 0)
        return -1;
    if (train_idx_load(lpath, 1, &lb, err, errlen) != 0) {
        train_idx_free(&im);
        return -1;
    }
    int rc = -1;
    if (im.items != lb.items) {
        snprintf(err, errlen, "%s has %zu images but %s has %zu labels", ipath, im.items, lpath,
                 lb.items);
        goto out;
    }
    for (size_t i = 0; i < lb.items; i++)
        if (lb.data[i] >= TRAIN_CLASSES) {
            snprintf(err, errlen, "%s: label %u of example %zu is not a class 0..%d", lpath,
                     lb.data[i], i, TRAIN_CLASSES - 1);
            goto out;
        }
    s->n = im.items;
    s->dim = im.item_size;
    s->x = im.data;
    s->y = lb.data;
    return 0;
out:
    train_idx_free(&im);
    train_idx_free(&lb);
    return rc;
}

int train_data_load(const char *dir, train_data_t *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof(*d));
    if (load_split(dir, "train", &d->train, err, errlen) != 0)
        return -1;
    if (load_split(dir, "t10k", &d->test, err, errlen) != 0) {
        train_data_free(d);
        return -1;
    }
    if (d->train.dim != d->test.dim) {
        snprintf(err, errlen, "%s: training images have %zu pixels but test images %zu", dir,
                 d->train.dim, d->test.dim);
        train_data_free(d);
        return -1;
    }
    return 0;
}

void train_data_free(train_data_t *d)
{
    free(d->train.x);
    free(d->train.y);
    free(d->test.x);
    free(d->test.y);
    memset(d, 0, sizeof(*d));
}

void train_permutation(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t s = seed * 0x2545f4914f6cdd1dull ^ (epoch + 1) * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    /* Fisher-Yates; the modulo bias (n < 2^32 against 2^64) is negligible */
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(train_splitmix64(&s) % i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

void train_gather(const train_split_t *s, const uint32_t *idx, size_t b, float *x, uint8_t *y)
{
    const float scale = 1.0f / 255.0f;
    for (size_t i = 0; i < b; i++) {
        const uint8_t *src = s->x + (size_t)idx[i] * s->dim;
        float *dst = x + i * s->dim;
        for (size_t j = 0; j < s->dim; j++)
            dst[j] = (float)src[j] * scale;
        y[i] = s->y[idx[i]];
    }
}
