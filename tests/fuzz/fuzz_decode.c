/* fuzz_decode.c: libFuzzer target for the message decoders; FUZZ_FAMILY picks dense, sparse or
 * random-k. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

/*
 * Input: one selector byte (which compressor decodes), then the message. The decoders
 * must return GCOLL_OK or GCOLL_ERR_INVALID, never touch memory they do not own
 * (AddressSanitizer checks), leave the output untouched on error, and produce only
 * finite values on success.
 */
#if FUZZ_FAMILY == 1
static const char *const specs[] = {"none",
                                    "fp16",
                                    "bf16",
                                    "q8:bucket=16",
                                    "q8",
                                    "sign",
                                    "sign:chunk=16",
                                    "qsgd:bits=2,bucket=8",
                                    "qsgd:bits=5,bucket=16",
                                    "qsgd:bits=8,bucket=512",
                                    "fp8:format=e4m3",
                                    "fp8:format=e5m2,round=stochastic",
                                    "mxfp8:format=e4m3",
                                    "mxfp8:format=e5m2",
                                    "mxfp4",
                                    "bf16:round=stochastic",
                                    "vq:dim=4,bits=3",
                                    "vq:dim=3,bits=8"};
#elif FUZZ_FAMILY == 2
static const char *const specs[] = {"topk:density=0.1",
                                    "threshold:tau=0.1",
                                    "topk:density=0.1+q8:bucket=8",
                                    "topk:density=0.1+qsgd:bits=3,bucket=8",
                                    "topk:density=0.1+fp16",
                                    "topk:density=0.1+bf16",
                                    "topk:density=0.1+sign",
                                    "dgc:density=0.1",
                                    "topk:density=0.1+mxfp4",
                                    "topk:density=0.1+fp8:format=e5m2",
                                    "rowsparse:dim=4",
                                    "rowsparse:dim=3,density=0.5+mxfp4"};
#elif FUZZ_FAMILY == 3
static const char *const specs[] = {
    "randomk:density=0.1,seed=1", "randomk:density=0.1,seed=1+q8:bucket=8",
    "randomk:density=0.1,seed=1+fp16", "randomk:density=0.1,seed=1+mxfp8:format=e4m3"};
#else
#error "define FUZZ_FAMILY as 1 (dense), 2 (sparse) or 3 (random-k)"
#endif

#define MAX_COUNT (1u << 16)
#define SENT 3.5f

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gcoll_compressor_t *c = fuzz_pick(specs, sizeof(specs) / sizeof(*specs), data[0]);
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    /* copy to an exact-size heap block so ASan sees any read past the end */
    uint8_t *m = malloc(len ? len : 1);
    if (len)
        memcpy(m, msg, len);
    size_t count = 0, nnz = 0;
    if (gcoll_decode_info(m, len, &count, &nnz) != GCOLL_OK || count > MAX_COUNT)
        count = 64; /* still exercise the full decoder on a bad header */
    float *out = malloc((count + 1) * sizeof(float));
    for (size_t i = 0; i <= count; i++)
        out[i] = SENT;
    gcoll_status_t st = gcoll_decode(c, m, len, out, count, 1);
    if (st != GCOLL_OK && st != GCOLL_ERR_INVALID)
        abort();
    for (size_t i = 0; i < count; i++)
        if (st != GCOLL_OK ? out[i] != SENT : !isfinite(out[i]))
            abort();
    if (out[count] != SENT)
        abort();
    if (st == GCOLL_OK) {
        /* the same message decodes to pairs and into a fresh buffer */
        uint32_t *idx = malloc((nnz + 1) * sizeof(uint32_t));
        float *val = malloc((nnz + 1) * sizeof(float));
        size_t got = 0;
        if (gcoll_decode_pairs(c, m, len, count, idx, val, nnz, &got) != GCOLL_OK || got != nnz)
            abort();
        for (size_t j = 0; j < got; j++)
            if (idx[j] >= count || (j > 0 && idx[j] <= idx[j - 1]) || !isfinite(val[j]))
                abort();
        if (gcoll_decode(c, m, len, out, count, 0) != GCOLL_OK)
            abort();
        free(idx);
        free(val);
    }
    /* the collectives' merged sum of two copies: two accumulating decodes, bit for bit, or
     * refused with the output untouched */
    {
        const uint8_t *two[2] = {m, m};
        size_t lens[2] = {len, len};
        float *ref = malloc((count + 1) * sizeof(float));
        float *sum = malloc((count + 1) * sizeof(float));
        for (size_t i = 0; i <= count; i++)
            sum[i] = SENT;
        memset(ref, 0, (count + 1) * sizeof(float));
        int bad = -1;
        gcoll_status_t s2 = gcoll_codec_sum(c, two, lens, 2, sum, count, 1.0f, &bad);
        if (s2 != st || (st != GCOLL_OK && bad != 0) || sum[count] != SENT)
            abort();
        if (st == GCOLL_OK) {
            gcoll_decode(c, m, len, ref, count, 1);
            gcoll_decode(c, m, len, ref, count, 1);
            if (memcmp(ref, sum, count * sizeof(float)) != 0)
                abort();
        } else {
            for (size_t i = 0; i < count; i++)
                if (sum[i] != SENT)
                    abort();
        }
        free(ref);
        free(sum);
    }
    /* a wrong expected count is always refused */
    if (gcoll_decode(c, m, len, out, count + 1, 0) != GCOLL_ERR_INVALID)
        abort();
    free(out);
    free(m);
    return 0;
}
