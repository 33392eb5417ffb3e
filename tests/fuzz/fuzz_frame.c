/* fuzz_frame.c: libFuzzer target for the TCP transport's frame header (transports/tcp/tcp_frame.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/tcp/tcp_frame.h"

/*
 * Input: a 48-byte header (shorter inputs are zero-padded). A header the decoder accepts
 * must describe a fragment inside its message within the sane bounds, and encode back to
 * the same bytes but for the reserved fields (which the decoder ignores).
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t hdr[GCOLL_FRAME_HDR_LEN] = {0}, again[GCOLL_FRAME_HDR_LEN];
    memcpy(hdr, data, size < sizeof(hdr) ? size : sizeof(hdr));
    gcoll_frame_t f;
    memset(&f, 0xa5, sizeof(f));
    if (gcoll_frame_decode(hdr, &f) != NULL)
        return 0;
    if (f.msg_len > GCOLL_FRAME_MAX_MSG || f.frag_len > f.msg_len ||
        f.frag_off + f.frag_len > f.msg_len)
        abort();
    if (f.type == GCOLL_FRAME_ABORT && f.msg_len > GCOLL_FRAME_MAX_CTL)
        abort();
    gcoll_frame_encode(&f, again);
    static const uint8_t reserved[GCOLL_FRAME_HDR_LEN] = {
        [6] = 1, [7] = 1, [12] = 1, [13] = 1, [14] = 1, [15] = 1};
    for (size_t i = 0; i < sizeof(hdr); i++)
        if (!reserved[i] && hdr[i] != again[i])
            abort();
    gcoll_frame_t g;
    if (gcoll_frame_decode(again, &g) != NULL || memcmp(&f, &g, sizeof(f)) != 0)
        abort();
    return 0;
}
