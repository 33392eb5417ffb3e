/* fuzz_common.h: shared helpers of the codec fuzz targets (compressor table, silent logging). */
#ifndef GCOLL_FUZZ_COMMON_H
#define GCOLL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "compress/compress.h"

/* One compressor per spec, created once; the first input byte picks one. */
static inline gcoll_compressor_t *fuzz_pick(const char *const *specs, size_t nspecs, uint8_t sel)
{
    static gcoll_compressor_t *cache[64];
    size_t i = sel % nspecs;
    if (!cache[i] && gcoll_compressor_create(specs[i], &cache[i]) != GCOLL_OK)
        abort(); /* a spec in the table is broken: a bug in the fuzzer */
    return cache[i];
}

#endif
