/* fuzz_ps.c: libFuzzer target for the parameter server's messages (lib/training/ps_wire.c):
 * the header, a push or compressed pull answer's frame through the decoder, and the
 * server's fused apply of fp32 frames. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "training/ps_wire.h"

/*
 * Input: a selector byte (the codec), a byte of slice counts, then the message. Three
 * slices of counts (c0, 0 or c1, c2) from the second byte's bits, so empty slices and
 * mismatching counts occur. Both calls must return GCOLL_OK or GCOLL_ERR_INVALID, never
 * read past the message (an exact-size heap copy for ASan) or write past the slices, and
 * leave the output untouched on error. The fused apply takes a frame exactly when the
 * decoder does and the codec is fp32 as it is, and then adds what the decoder adds (a = 1:
 * x + 1 * v rounds once as x + v does).
 */
static const char *const specs[] = {"none", "fp16", "topk:density=0.1", "q8:bucket=8",
                                    "topk:density=0.2+q8"};

#define SENT 3.5f
enum { NT = 3 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    gcoll_compressor_t *c = fuzz_pick(specs, sizeof(specs) / sizeof(*specs), data[0]);
    const size_t counts[NT] = {(size_t)(data[1] & 7) * 9, (data[1] & 8) ? 5 : 0,
                               (size_t)(data[1] >> 4) * 3 + 1};
    size_t len = size - 2;
    uint8_t *m = malloc(len ? len : 1);
    if (len)
        memcpy(m, data + 2, len);
    gcoll_ps_hdr_t h;
    if (gcoll_ps_get_hdr(m, len, &h) != GCOLL_OK && len >= GCOLL_PS_HDR &&
        gcoll_get_u32(m) == GCOLL_PS_MAGIC)
        abort();
    float *out[NT], *sum[NT];
    for (int t = 0; t < NT; t++) {
        out[t] = malloc((counts[t] + 1) * sizeof(float));
        sum[t] = malloc((counts[t] + 1) * sizeof(float));
        for (size_t j = 0; j <= counts[t]; j++)
            out[t][j] = sum[t][j] = SENT;
    }
    char why[128];
    gcoll_status_t st = gcoll_ps_frame_decode(c, m, len, out, counts, NT, 1, why, sizeof(why));
    if (st != GCOLL_OK && st != GCOLL_ERR_INVALID)
        abort();
    gcoll_status_t sa = gcoll_ps_frame_axpy(c, m, len, sum, counts, NT, 1.0f, why, sizeof(why));
    if (sa != GCOLL_OK && sa != GCOLL_ERR_INVALID)
        abort();
    /* both check the whole frame the same way; the fused apply takes only fp32 as it is */
    const int done = sa == GCOLL_OK;
    if (done != (st == GCOLL_OK && gcoll_ps_exact(c)))
        abort();
    for (int t = 0; t < NT; t++) {
        for (size_t j = 0; j < counts[t]; j++) {
            if (st != GCOLL_OK && out[t][j] != SENT)
                abort();
            if (!done && sum[t][j] != SENT)
                abort();
            if (done && memcmp(&sum[t][j], &out[t][j], sizeof(float)) != 0)
                abort();
        }
        if (out[t][counts[t]] != SENT || sum[t][counts[t]] != SENT)
            abort();
        free(out[t]);
        free(sum[t]);
    }
    free(m);
    return 0;
}
