/* idx.h: loader for the IDX files MNIST and Fashion-MNIST ship in (plain or gzipped). */
#ifndef GCOLL_TRAIN_IDX_H
#define GCOLL_TRAIN_IDX_H

#include <stddef.h>
#include <stdint.h>

#define TRAIN_IDX_MAX_DIMS 4

/* An IDX file of unsigned bytes: dims[0] items of item_size = dims[1] * ... bytes each. */
typedef struct {
    uint8_t *data;
    unsigned ndims;
    uint32_t dims[TRAIN_IDX_MAX_DIMS];
    size_t items;
    size_t item_size;
} train_idx_t;

/* Whether gzipped files can be read (built with zlib). */
int train_idx_have_gzip(void);

/* Loads path, which must hold an IDX array of unsigned bytes (type 0x08) with ndims
 * dimensions. Gzipped files are recognized by their magic, not their name. Returns 0, or -1
 * with a message naming the file and the problem in err (missing file, truncated header or
 * data, wrong magic or type, wrong number of dimensions, trailing bytes, a corrupt gzip
 * stream). Never reads or allocates past what the header announces (bounded to 1 GiB). */
int train_idx_load(const char *path, unsigned ndims, train_idx_t *out, char *err, size_t errlen);
void train_idx_free(train_idx_t *idx);

#endif
