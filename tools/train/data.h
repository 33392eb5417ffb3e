/* data.h: the Fashion-MNIST (or MNIST) training and test sets, and minibatch assembly. */
#ifndef GCOLL_TRAIN_DATA_H
#define GCOLL_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define TRAIN_CLASSES 10

/* n examples of dim bytes each (pixels 0..255) and their labels (< TRAIN_CLASSES). */
typedef struct {
    size_t n, dim;
    uint8_t *x;
    uint8_t *y;
} train_split_t;

typedef struct {
    train_split_t train, test;
} train_data_t;

/* Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from dir (the .gz name first).
 * Returns 0, or -1 with a message in err naming the file: missing, corrupt, or images and
 * labels that disagree in count, size or label range. */
int train_data_load(const char *dir, train_data_t *d, char *err, size_t errlen);
void train_data_free(train_data_t *d);

/* Builds a permutation of [0, n) from (seed, epoch): the same on every rank and for every
 * rank count, so P ranks see the same global batches as one rank does. */
void train_permutation(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch);

/* x[i * dim ..] = pixels / 255 and y[i] for the examples idx[0..b). */
void train_gather(const train_split_t *s, const uint32_t *idx, size_t b, float *x, uint8_t *y);

/* splitmix64 (Steele, Lea & Flood 2014): a small, well-mixed generator for shuffles and
 * initialization. */
static inline uint64_t train_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
