/* fuzz_encode.c: libFuzzer target: arbitrary floats through every encoder, with and without state.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

/*
 * Input: selector byte, then float32 values (any bit patterns, NaN and Inf included).
 * Encode must succeed exactly when every value is finite, stay within the bound, and
 * its message must decode; with error feedback, decode + new residual == old + input
 * for the exact sparsifiers.
 */
static const char *const specs[] = {
    "none",
    "fp16",
    "bf16",
    "q8:bucket=16",
    "sign:chunk=8",
    "sign:scale=l2",
    "qsgd:bits=3,bucket=8",
    "topk:density=0.1",
    "topk:k=3,select=sample",
    "topk:density=0.2,select=reuse,reuse_steps=2",
    "threshold:tau=0.5",
    "randomk:density=0.3,seed=4",
    "randomk:density=0.3,seed=4,unbiased=1,ef=0",
    "topk:density=0.3+q8:bucket=4",
    "topk:density=0.3+qsgd:bits=2,bucket=4",
    "dgc:density=0.2,momentum=0.5,warmup_steps=2",
    "fp8:format=e4m3,round=stochastic",
    "mxfp8:format=e5m2",
    "mxfp4:round=stochastic",
    "fp16:round=stochastic",
    "randomk:density=0.2,seed=4,feedback=ef21",
    "rowsparse:dim=4",
    "vq:dim=4,bits=3",
    "vq:dim=2,bits=5,ef=0",
    "rowsparse:dim=5,density=0.3+q8:bucket=4",
    "fp16:clip=1",
    "topk:density=0.5,clip=0.01",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gcoll_compressor_t *c = fuzz_pick(specs, sizeof(specs) / sizeof(*specs), data[0]);
    size_t n = (size - 1) / 4;
    float *x = malloc((n ? n : 1) * sizeof(float));
    memcpy(x, data + 1, n * sizeof(float));
    int finite = 1;
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(x[i]) != 0;
    if (data[0] & 0x80) /* simd level from the selector's top bit */
        gcoll_simd_set(GCOLL_SIMD_GENERIC);
    else
        gcoll_simd_set(GCOLL_SIMD_AUTO);
    size_t cap = gcoll_compressor_bound(c, n), len = 0;
    uint8_t *buf = malloc(cap);
    float *d = malloc((n ? n : 1) * sizeof(float));
    gcoll_tensor_state_t *s = NULL;
    if (gcoll_state_create(c, n, &s) != GCOLL_OK)
        abort();
    if (!(gcoll_compressor_flags(c) & GCOLL_CODEC_NEEDS_STATE)) {
        gcoll_status_t st = gcoll_encode(c, NULL, x, n, buf, cap, &len);
        /* finite inputs may still overflow a sum (sign, qsgd) or the n/k scaling */
        int may_fail =
            !finite || c->vs.fmt == GCOLL_VF_SIGN || c->vs.fmt == GCOLL_VF_QSGD || c->unbiased;
        if (st != GCOLL_OK && (st != GCOLL_ERR_INVALID || !may_fail))
            abort();
        if (st == GCOLL_OK && (!finite || len > cap))
            abort();
        if (st == GCOLL_OK && gcoll_decode(c, buf, len, d, n, 0) != GCOLL_OK)
            abort();
    }
    float *e0 = malloc((n ? n : 1) * sizeof(float));
    for (int step = 0; step < 2; step++) {
        const float *res = gcoll_state_residual(s); /* NULL with ef=0 */
        if (res)
            memcpy(e0, res, n * sizeof(float));
        gcoll_status_t st = gcoll_encode(c, s, x, n, buf, cap, &len);
        if (st != GCOLL_OK) {
            if (st != GCOLL_ERR_INVALID)
                abort();
            if (!finite && res && memcmp(e0, res, n * sizeof(float)))
                abort(); /* refused input must leave the state alone */
            break;
        }
        if (len > cap || gcoll_decode(c, buf, len, d, n, 0) != GCOLL_OK)
            abort();
        unsigned fl = gcoll_compressor_flags(c);
        int exact =
            (fl & (GCOLL_CODEC_QUANTIZED | GCOLL_CODEC_NEEDS_STATE)) == GCOLL_CODEC_SPARSE &&
            !c->unbiased && !c->ef21 && c->clip == 0 && res;
        for (size_t i = 0; exact && i < n; i++) {
            float want = e0[i] + x[i], got = d[i] + res[i];
            if (isfinite(want) && memcmp(&want, &got, 4))
                abort();
        }
    }
    gcoll_state_destroy(s);
    free(e0);
    free(d);
    free(buf);
    free(x);
    return 0;
}
