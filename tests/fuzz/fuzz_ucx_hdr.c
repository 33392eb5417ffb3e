/* fuzz_ucx_hdr.c: libFuzzer target for the UCX transport's active-message header
 * (gcoll_ucx_hdr_decode) and its single-copy write request (gcoll_ucx_put_decode). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/ucx/ucx_int.h"

/*
 * Input: the header as UCX hands it to the callback (any length), and the same bytes as a
 * UCX_MSG_PUT payload. An accepted header has the exact length and a message type, and its
 * fields survive an encode and a decode; so does an accepted request, whose tokens are
 * nonzero, whose buffer does not wrap and whose sender's part lies within the message.
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
    ucx_put_t q, r;
    if (gcoll_ucx_put_decode(m, size, &q) == NULL) {
        if (size != GCOLL_UCX_PUT_LEN || !q.send_token || !q.token ||
            (q.len && q.addr + q.len < q.addr) || q.wlen > q.len)
            abort();
        uint8_t again[GCOLL_UCX_PUT_LEN];
        gcoll_ucx_put_encode(&q, again);
        if (gcoll_ucx_put_decode(again, sizeof(again), &r) != NULL ||
            memcmp(&q, &r, sizeof(q)) != 0)
            abort();
    }
    free(m);
    return 0;
}
