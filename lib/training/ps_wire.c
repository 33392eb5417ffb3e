/* ps_wire.c: encoding and bounds-checked decoding of the parameter server's messages
 * (lib/training/ps_wire.h). */
#include "training/ps_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "compress/kernels.h"
#include "compress/wire.h"

void gcoll_ps_put_hdr(uint8_t *buf, uint32_t kind, uint64_t a, uint64_t b, uint64_t c)
{
    gcoll_put_u32(buf, GCOLL_PS_MAGIC);
    gcoll_put_u32(buf + 4, kind);
    gcoll_put_u64(buf + 8, a);
    gcoll_put_u64(buf + 16, b);
    gcoll_put_u64(buf + 24, c);
}

gcoll_status_t gcoll_ps_get_hdr(const uint8_t *buf, size_t len, gcoll_ps_hdr_t *h)
{
    if (!buf || len < GCOLL_PS_HDR || gcoll_get_u32(buf) != GCOLL_PS_MAGIC)
        return GCOLL_ERR_INVALID;
    h->kind = gcoll_get_u32(buf + 4);
    h->a = gcoll_get_u64(buf + 8);
    h->b = gcoll_get_u64(buf + 16);
    h->c = gcoll_get_u64(buf + 24);
    return GCOLL_OK;
}

size_t gcoll_ps_frame_bound(const gcoll_compressor_t *c, const size_t *counts, int n)
{
    size_t cap = GCOLL_PS_HDR;
    for (int i = 0; i < n; i++)
        cap += 4 + (counts[i] ? gcoll_compressor_bound(c, counts[i]) : 0);
    return cap;
}

gcoll_status_t gcoll_ps_frame_encode(gcoll_compressor_t *c, gcoll_tensor_state_t *const *st,
                                     const float *const *src, const size_t *counts, int n,
                                     uint8_t *out, size_t cap, size_t *len_p)
{
    size_t pos = GCOLL_PS_HDR;
    for (int i = 0; i < n; i++) {
        if (cap - pos < 4)
            return GCOLL_ERR_INVALID;
        size_t l = 0;
        if (counts[i]) {
            gcoll_tensor_state_t *s = st ? st[i] : NULL;
            GCOLL_CHECK(gcoll_encode(c, s, src[i], counts[i], out + pos + 4, cap - pos - 4, &l));
        }
        gcoll_put_u32(out + pos, (uint32_t)l);
        pos += 4 + l;
    }
    *len_p = pos;
    return GCOLL_OK;
}

static gcoll_status_t bad(char *why, size_t whylen, const char *fmt, ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return GCOLL_ERR_INVALID;
}

/* The whole frame, before anything is written: the framing (a length per slice inside the
 * message, none past it, none for an empty slice, no trailing bytes), then each slice's
 * codec message in full against c and counts[i] (gcoll_codec_parse), whose header and index
 * section size it leaves in h[i] and isz[i], and its offset in off[i]. */
static gcoll_status_t frame_check(const gcoll_compressor_t *c, const uint8_t *buf, size_t len,
                                  const size_t *counts, int n, gcoll_wire_hdr_t *h, size_t *isz,
                                  size_t *off, char *why, size_t whylen)
{
    if (len < GCOLL_PS_HDR)
        return bad(why, whylen, "truncated header");
    size_t pos = GCOLL_PS_HDR;
    for (int i = 0; i < n; i++) {
        if (len - pos < 4)
            return bad(why, whylen, "truncated at tensor %d", i);
        size_t l = gcoll_get_u32(buf + pos);
        pos += 4;
        if (l > len - pos || (counts[i] == 0 && l != 0))
            return bad(why, whylen, "tensor %d length %zu past the message", i, l);
        off[i] = pos;
        if (counts[i] && gcoll_codec_parse(c, buf + pos, l, counts[i], &h[i], &isz[i]) != GCOLL_OK)
            return bad(why, whylen, "tensor %d does not decode (%s)", i,
                       gcoll_status_string(GCOLL_ERR_INVALID));
        pos += l;
    }
    if (pos != len)
        return bad(why, whylen, "%zu trailing bytes", len - pos);
    return GCOLL_OK;
}

gcoll_status_t gcoll_ps_frame_decode(const gcoll_compressor_t *c, const uint8_t *buf, size_t len,
                                     float *const *dst, const size_t *counts, int n, int accumulate,
                                     char *why, size_t whylen)
{
    const int m = n > 0 ? n : 1;
    gcoll_wire_hdr_t h[m];
    size_t isz[m], off[m];
    GCOLL_CHECK(frame_check(c, buf, len, counts, n, h, isz, off, why, whylen));
    for (int i = 0; i < n; i++) {
        if (!counts[i])
            continue;
        gcoll_status_t st = gcoll_codec_apply(&h[i], buf + off[i] + GCOLL_WIRE_HDR, isz[i], dst[i],
                                              accumulate ? GCOLL_DECODE_ADD : GCOLL_DECODE_SET);
        if (st != GCOLL_OK)
            return bad(why, whylen, "tensor %d does not decode (%s)", i, gcoll_status_string(st));
    }
    return GCOLL_OK;
}

int gcoll_ps_exact(const gcoll_compressor_t *c)
{
    return c->sparsify == GCOLL_SPARSIFY_NONE && c->vs.fmt == GCOLL_VF_F32 && c->clip <= 0 &&
           c->clip_value <= 0;
}

gcoll_status_t gcoll_ps_frame_axpy(const gcoll_compressor_t *c, const uint8_t *buf, size_t len,
                                   float *const *dst, const size_t *counts, int n, float a,
                                   char *why, size_t whylen)
{
    if (!gcoll_ps_exact(c))
        return bad(why, whylen, "codec '%s' does not send fp32 as it is", c->spec);
    const int m = n > 0 ? n : 1;
    gcoll_wire_hdr_t h[m];
    size_t isz[m], off[m];
    GCOLL_CHECK(frame_check(c, buf, len, counts, n, h, isz, off, why, whylen));
    const gcoll_kernels_t *k = gcoll_kernels();
    for (int i = 0; i < n; i++) {
        const uint8_t *v = buf + off[i] + GCOLL_WIRE_HDR;
        float *d = dst[i];
        if (((uintptr_t)v & (sizeof(float) - 1)) == 0) { /* as a received buffer always is */
            k->axpy(d, (const float *)(const void *)v, counts[i], a);
            continue;
        }
        for (size_t j = 0; j < counts[i]; j++) {
            float x;
            memcpy(&x, v + 4 * j, sizeof(x));
            d[j] += a * x;
        }
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_ps_encode_delta(gcoll_compressor_t *c, const float *w, float *view,
                                     float *scratch, const size_t *counts, int n, uint8_t *out,
                                     size_t cap, size_t *len_p)
{
    const float *src[n > 0 ? n : 1];
    float *dst[n > 0 ? n : 1];
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        for (size_t j = 0; j < counts[i]; j++)
            scratch[off + j] = w[off + j] - view[off + j];
        src[i] = scratch + off;
        dst[i] = view + off;
        off += counts[i];
    }
    GCOLL_CHECK(gcoll_ps_frame_encode(c, NULL, src, counts, n, out, cap, len_p));
    /* what the worker will add: decoded from the message itself, so both sides agree
     * bit for bit */
    return gcoll_ps_frame_decode(c, out, *len_p, dst, counts, n, 1, NULL, 0);
}
