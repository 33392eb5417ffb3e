/* train_test_util.h: the training unit tests' small dataset of noisy class prototypes. */
#ifndef GCOLL_TRAIN_TEST_UTIL_H
#define GCOLL_TRAIN_TEST_UTIL_H

#include <stdlib.h>

#include "train/train.h"

/* Ten classes of noisy prototypes of dim bytes, stored as IDX-style bytes: ntrain training
 * and ntest test examples, the same for a seed. */
static inline void test_make_prototypes(train_data_t *d, int dim, size_t ntrain, size_t ntest)
{
    uint64_t s = 11;
    uint8_t proto[TRAIN_CLASSES][256];
    assert_true(dim > 0 && dim <= 256);
    for (int c = 0; c < TRAIN_CLASSES; c++)
        for (int j = 0; j < dim; j++)
            proto[c][j] = (uint8_t)(train_splitmix64(&s) % 200);
    train_split_t *sp[2] = {&d->train, &d->test};
    size_t ns[2] = {ntrain, ntest};
    for (int k = 0; k < 2; k++) {
        train_split_t *t = sp[k];
        t->n = ns[k];
        t->dim = (size_t)dim;
        t->x = malloc(t->n * (size_t)dim);
        t->y = malloc(t->n);
        for (size_t i = 0; i < t->n; i++) {
            t->y[i] = (uint8_t)(train_splitmix64(&s) % TRAIN_CLASSES);
            for (int j = 0; j < dim; j++)
                t->x[i * (size_t)dim + (size_t)j] =
                    (uint8_t)(proto[t->y[i]][j] + train_splitmix64(&s) % 56);
        }
    }
}

#endif /* GCOLL_TRAIN_TEST_UTIL_H */
