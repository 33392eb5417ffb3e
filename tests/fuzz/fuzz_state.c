/* fuzz_state.c: libFuzzer target: gcoll_state_load (lib/compress/state_io.c) on arbitrary
 * checkpoints, vq's codebook section included. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

/*
 * Input: selector byte, then a checkpoint. The state is made with the count the checkpoint
 * names (when it is small), so that inputs reach the bodies, the codebook and the nested
 * states. A refused load must leave the state's checkpoint as it was; an accepted one of
 * the current version must save back to the same bytes; a loaded vq state with a tame
 * residual must encode (its codebook finite), and every message encoded must decode.
 */
static const char *const specs[] = {
    "vq:dim=4,bits=3", "vq:dim=2,bits=5,ef=0", "topk:density=0.1", "dgc:density=0.1", "q8",
};

static uint8_t *save(const gcoll_tensor_state_t *s, size_t *len)
{
    if (gcoll_state_save(s, NULL, 0, len) != GCOLL_OK)
        abort();
    uint8_t *b = malloc(*len ? *len : 1);
    if (!b || gcoll_state_save(s, b, *len, len) != GCOLL_OK)
        abort();
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gcoll_compressor_t *c = fuzz_pick(specs, sizeof(specs) / sizeof(*specs), data[0]);
    const uint8_t *p = data + 1;
    size_t len = size - 1, n = 8;
    uint32_t speclen;
    uint64_t count;
    if (len >= 12) {
        memcpy(&speclen, p + 8, 4);
        if (speclen <= len - 12 && len - 12 - speclen >= 8) {
            memcpy(&count, p + 12 + speclen, 8);
            if (count <= 4096)
                n = (size_t)count;
        }
    }
    gcoll_tensor_state_t *s = NULL;
    if (gcoll_state_create(c, n, &s) != GCOLL_OK)
        abort();
    size_t blen, alen;
    uint8_t *before = save(s, &blen);
    gcoll_status_t st = gcoll_state_load(s, p, len);
    uint8_t *after = save(s, &alen);
    if (st != GCOLL_OK) {
        if (st != GCOLL_ERR_NOMEM && (alen != blen || memcmp(before, after, blen)))
            abort(); /* a refused checkpoint changed the state */
    } else {
        uint32_t version;
        memcpy(&version, p + 4, 4);
        if (version == 2 && (alen != len || memcmp(after, p, len)))
            abort(); /* a loaded state does not save to what it loaded */
        float x[64], d[64];
        size_t m = n < 64 ? n : 64;
        for (size_t i = 0; i < m; i++)
            x[i] = (float)((int)(i % 7) - 3) * 0.25f;
        if (m == n) {
            /* the residual is the checkpoint's own (not checked for range): an encode may
             * refuse e + x that overflows; vq's must not refuse because of its codebook */
            const float *e = gcoll_state_residual(s);
            int tame = 1;
            for (size_t i = 0; e && i < n; i++)
                tame &= fabsf(e[i]) < 1e30f;
            size_t cap = gcoll_compressor_bound(c, n), mlen;
            uint8_t *msg = malloc(cap ? cap : 1);
            gcoll_status_t es = gcoll_encode(c, s, x, n, msg, cap, &mlen);
            if ((es != GCOLL_OK && tame && c->vs.fmt == GCOLL_VF_VQ) ||
                (es == GCOLL_OK && gcoll_decode(c, msg, mlen, d, n, 0) != GCOLL_OK))
                abort();
            free(msg);
        }
    }
    free(before);
    free(after);
    gcoll_state_destroy(s);
    return 0;
}
