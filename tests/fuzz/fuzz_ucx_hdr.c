/* fuzz_ucx_hdr.c: libFuzzer target for the UCX transport's active-message header
 * (gcoll_ucx_hdr_decode). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/ucx/ucx_int.h"

/*
 * Input: the header as UCX hands it to the callback (any length). An accepted header has
 * the exact length and a message type, and its fields survive an encode and a decode.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *m = malloc(size ? size : 1); /* exact size: ASan sees reads past the end */
    memcpy(m, data, size);
    ucx_hdr_t h, g;
    memset(&h, 0, sizeof(h));
    memset(&g, 0, sizeof(g));
    if (gcoll_ucx_hdr_decode(m, size, &h) == NULL) {
        if (size != GCOLL_UCX_HDR_LEN || h.type < UCX_MSG_DATA)
            abort();
        uint8_t again[GCOLL_UCX_HDR_LEN];
        gcoll_ucx_hdr_encode(&h, again);
        if (gcoll_ucx_hdr_decode(again, sizeof(again), &g) != NULL ||
            memcmp(&h, &g, sizeof(h)) != 0)
            abort();
    }
    free(m);
    return 0;
}
