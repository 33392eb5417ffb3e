/* api.c: the public compressor calls of gcoll.h: compressor and tensor-state lifetimes, encode,
 * decode. */
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/wire.h"

GCOLL_EXPORT gcoll_status_t gcoll_compressor_create(const char *spec, gcoll_compressor_t **c_p)
{
    if (!c_p) {
        GCOLL_WARN("compress: gcoll_compressor_create: NULL output pointer");
        return GCOLL_ERR_INVALID;
    }
    gcoll_compressor_t *c = malloc(sizeof(*c));
    if (!c)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = gcoll_spec_parse(spec, c, NULL, 0);
    if (st != GCOLL_OK) {
        free(c);
        return st;
    }
    GCOLL_INFO(GCOLL_SUBSYS_COMPRESS, "compress: compressor %s", c->spec);
    *c_p = c;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_compressor_check(const char *spec, char *errbuf, size_t errlen)
{
    gcoll_compressor_t c;
    return gcoll_spec_parse(spec, &c, errbuf, errlen);
}

GCOLL_EXPORT void gcoll_compressor_destroy(gcoll_compressor_t *c)
{
    free(c);
}

GCOLL_EXPORT const char *gcoll_compressor_spec(const gcoll_compressor_t *c)
{
    return c ? c->spec : "";
}

GCOLL_EXPORT size_t gcoll_compressor_bound(const gcoll_compressor_t *c, size_t count)
{
    return gcoll_codec_bound(c, count);
}

GCOLL_EXPORT unsigned gcoll_compressor_flags(const gcoll_compressor_t *c)
{
    return c ? gcoll_codec_flags(c) : 0;
}

gcoll_status_t gcoll_state_create_mode(const gcoll_compressor_t *c, size_t count,
                                       gcoll_state_mode_t mode, gcoll_tensor_state_t **s_p)
{
    if (!c || !s_p || count > GCOLL_WIRE_MAX_COUNT) {
        GCOLL_WARN("compress: state_create: NULL argument or %zu elements (max 2^32-1)", count);
        return GCOLL_ERR_INVALID;
    }
    gcoll_tensor_state_t *s = calloc(1, sizeof(*s));
    if (!s)
        return GCOLL_ERR_NOMEM;
    s->c = c;
    s->count = count;
    s->mode = mode;
    size_t alloc = count ? count : 1;
    if (c->ef && !(s->e = calloc(alloc, sizeof(float))))
        goto fail_alloc;
    if (c->sparsify == GCOLL_SPARSIFY_DGC && mode == GCOLL_STATE_WORKER &&
        !(s->u = calloc(alloc, sizeof(float))))
        goto fail_alloc;
    *s_p = s;
    return GCOLL_OK;
fail_alloc:
    GCOLL_WARN("compress: cannot allocate state buffers for %zu elements", count);
    free(s->e);
    free(s);
    return GCOLL_ERR_NOMEM;
}

GCOLL_EXPORT gcoll_status_t gcoll_state_create(gcoll_compressor_t *c, size_t count,
                                               gcoll_tensor_state_t **s_p)
{
    return gcoll_state_create_mode(c, count, GCOLL_STATE_WORKER, s_p);
}

GCOLL_EXPORT void gcoll_state_destroy(gcoll_tensor_state_t *s)
{
    if (!s)
        return;
    gcoll_state_destroy(s->server);
    gcoll_state_destroy(s->hier_part);
    gcoll_scratch_free(&s->sc);
    free(s->e);
    free(s->spare);
    gcoll_codec_spare_release(s);
    free(s->clamped);
    free(s->u);
    free(s->vq_book);
    free(s);
}

GCOLL_EXPORT const float *gcoll_state_residual(const gcoll_tensor_state_t *s)
{
    return s ? s->e : NULL;
}

GCOLL_EXPORT uint64_t gcoll_state_step(const gcoll_tensor_state_t *s)
{
    return s ? s->step : 0;
}

GCOLL_EXPORT void gcoll_state_advance(gcoll_tensor_state_t *s)
{
    if (s)
        s->step++;
}

GCOLL_EXPORT gcoll_status_t gcoll_encode(gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                         const float *in, size_t count, void *out, size_t cap,
                                         size_t *len_p)
{
    if (s && count != s->count) {
        GCOLL_WARN("compress: encode of %zu elements with a state for %zu", count, s->count);
        return GCOLL_ERR_INVALID;
    }
    GCOLL_CHECK(
        gcoll_codec_encode_range(c, s, 0, in, count, s ? s->step : 0, NULL, out, cap, len_p));
    if (s)
        s->step++;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_encode_chunk(gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                               size_t offset, const float *in, size_t count,
                                               void *out, size_t cap, size_t *len_p)
{
    return gcoll_codec_encode_range(c, s, offset, in, count, s ? s->step : 0, NULL, out, cap,
                                    len_p);
}

GCOLL_EXPORT gcoll_status_t gcoll_decode(const gcoll_compressor_t *c, const void *in, size_t len,
                                         float *out, size_t count, int accumulate)
{
    if (!c) {
        GCOLL_WARN("compress: gcoll_decode: NULL compressor");
        return GCOLL_ERR_INVALID;
    }
    return gcoll_codec_decode(c, in, len, out, count,
                              accumulate ? GCOLL_DECODE_ADD : GCOLL_DECODE_SET);
}

GCOLL_EXPORT gcoll_status_t gcoll_decode_info(const void *in, size_t len, size_t *count_p,
                                              size_t *nnz_p)
{
    gcoll_wire_hdr_t h;
    GCOLL_CHECK(gcoll_wire_parse_hdr(in, len, SIZE_MAX, &h));
    if (count_p)
        *count_p = (size_t)h.count;
    if (nnz_p)
        *nnz_p = (size_t)h.nnz;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_decode_pairs(const gcoll_compressor_t *c, const void *in,
                                               size_t len, size_t count, uint32_t *idx, float *val,
                                               size_t cap, size_t *nnz_p)
{
    if (!c) {
        GCOLL_WARN("compress: gcoll_decode_pairs: NULL compressor");
        return GCOLL_ERR_INVALID;
    }
    return gcoll_codec_decode_pairs(c, in, len, count, idx, val, cap, nnz_p);
}
