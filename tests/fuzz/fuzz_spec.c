/* fuzz_spec.c: libFuzzer target for the compressor spec parser and its canonical form. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

/* Any string either parses, and then its canonical spec parses to itself, or is refused
 * with a message. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = malloc(size + 1);
    memcpy(spec, data, size);
    spec[size] = '\0';
    char err[256];
    gcoll_compressor_t *c = NULL;
    gcoll_status_t st = gcoll_compressor_create(spec, &c);
    if (st == GCOLL_OK) {
        gcoll_compressor_t *c2 = NULL;
        if (gcoll_compressor_create(gcoll_compressor_spec(c), &c2) != GCOLL_OK ||
            strcmp(gcoll_compressor_spec(c), gcoll_compressor_spec(c2)))
            abort();
        if (gcoll_compressor_bound(c, 1000) < 48)
            abort();
        gcoll_compressor_destroy(c2);
        gcoll_compressor_destroy(c);
    } else if (st != GCOLL_ERR_INVALID ||
               gcoll_compressor_check(spec, err, sizeof(err)) != GCOLL_ERR_INVALID ||
               err[0] == '\0') {
        abort();
    }
    free(spec);
    return 0;
}
