/* state_io.c: a tensor state as bytes and back (checkpoints: gcoll_state_save/load). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "compress/wire.h"

/* Layout, in host byte order (checked little-endian below, like the wire format):
 *   "GCST" u32 version u32 speclen spec[speclen] body
 *   body = u64 count u64 step u32 flags u32 reuse_thr u64 reuse_at
 *          [float e[count]] [float u[count]] [u32 nbook float book[nbook]]
 *          [body of the server state] [body of the hierarchical part's state]
 * flags: 1 e present, 2 u present, 4 server present, 8 reuse threshold valid, 16 the state
 * of this rank's part of a hierarchical allreduce's step across hosts present (its own
 * count; it may hold a server state, never a part of its own), 32 vq's warm codebook
 * present (nbook = 2^bits * dim of the spec, finite values; version 2 only).
 * Version 1 (before the codebook) still loads: its vq states start their next encode cold.
 * Everything that decides a later encode is here, so a restored state continues bit for
 * bit; the spare buffer and the scratch are rewritten before they are read, and the
 * salt is set by every collective call. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "state_io.c writes host byte order and assumes a little-endian host"
#endif

#define STATE_MAGIC "GCST"
#define STATE_VERSION 2u
enum { F_E = 1, F_U = 2, F_SERVER = 4, F_REUSE = 8, F_HIER = 16, F_BOOK = 32 };

/* Floats in vq's codebook for compressor c, 0 for other codecs. */
static size_t book_floats(const gcoll_compressor_t *c)
{
    return c->vs.fmt == GCOLL_VF_VQ ? ((size_t)1 << c->vs.bits) * c->vs.bucket : 0;
}

/* What a body belongs to: the caller's state, its server state, or its hierarchical part
 * (which bounds the nesting: only the top holds a part, and a server holds nothing). */
enum { K_TOP, K_SERVER, K_HIER };

typedef struct {
    unsigned char *p; /* NULL: only count */
    size_t len, cap;
} out_t;

static void put(out_t *o, const void *src, size_t n)
{
    if (o->p && o->len + n <= o->cap)
        memcpy(o->p + o->len, src, n);
    o->len += n;
}

static void put_body(out_t *o, const gcoll_tensor_state_t *s)
{
    uint64_t count = s->count, step = s->step, at = s->reuse_at;
    const size_t nbook = s->vq_book ? book_floats(s->c) : 0;
    uint32_t flags = (s->e ? F_E : 0) | (s->u ? F_U : 0) | (s->server ? F_SERVER : 0) |
                     (s->reuse_valid ? F_REUSE : 0) | (s->hier_part ? F_HIER : 0) |
                     (nbook ? F_BOOK : 0);
    put(o, &count, 8);
    put(o, &step, 8);
    put(o, &flags, 4);
    put(o, &s->reuse_thr, 4);
    put(o, &at, 8);
    if (s->e)
        put(o, s->e, s->count * sizeof(float));
    if (s->u)
        put(o, s->u, s->count * sizeof(float));
    if (nbook) {
        uint32_t nb = (uint32_t)nbook;
        put(o, &nb, 4);
        put(o, s->vq_book, nbook * sizeof(float));
    }
    if (s->server)
        put_body(o, s->server);
    if (s->hier_part)
        put_body(o, s->hier_part);
}

GCOLL_EXPORT gcoll_status_t gcoll_state_save(const gcoll_tensor_state_t *s, void *buf, size_t cap,
                                             size_t *len_p)
{
    if (!s || !len_p || (!buf && cap)) {
        GCOLL_WARN("compress: gcoll_state_save: NULL state or length pointer");
        return GCOLL_ERR_INVALID;
    }
    const char *spec = gcoll_compressor_spec(s->c);
    uint32_t version = STATE_VERSION, speclen = (uint32_t)strlen(spec);
    out_t o = {.p = buf, .cap = cap};
    put(&o, STATE_MAGIC, 4);
    put(&o, &version, 4);
    put(&o, &speclen, 4);
    put(&o, spec, speclen);
    put_body(&o, s);
    if (buf && o.len > cap) {
        GCOLL_WARN("compress: gcoll_state_save: %zu bytes needed, %zu given", o.len, cap);
        return GCOLL_ERR_INVALID;
    }
    *len_p = o.len;
    return GCOLL_OK;
}

typedef struct {
    const unsigned char *p;
    size_t len, off;
    uint32_t version; /* of the buffer: 1 has no codebooks */
} in_t;

static int get(in_t *in, void *dst, size_t n)
{
    if (in->len - in->off < n)
        return -1;
    if (dst)
        memcpy(dst, in->p + in->off, n);
    in->off += n;
    return 0;
}

/* The buffers a state of this kind has: a nested state that does not exist yet is checked
 * against what gcoll_state_create_mode would give it (a server state: e with error feedback,
 * never u; a hierarchical part: the same as its top state). */
typedef struct {
    int e, u;
    gcoll_state_mode_t mode;
} want_t;

static gcoll_status_t get_body(in_t *in, gcoll_tensor_state_t *s, const gcoll_compressor_t *c,
                               int apply, int kind, want_t want, char *why, size_t whylen);

/* Reads the nested state that follows a body (a server state or a hierarchical part),
 * replacing *slot with one of the saved count when the sizes differ. */
static gcoll_status_t get_nested(in_t *in, gcoll_tensor_state_t **slot, const gcoll_compressor_t *c,
                                 int apply, int kind, want_t want, char *why, size_t whylen)
{
    /* the nested state's size is its own (this rank's chunk or part): read it ahead */
    uint64_t ncount;
    if (in->len - in->off < 8) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    memcpy(&ncount, in->p + in->off, 8);
    if (ncount > GCOLL_WIRE_MAX_COUNT) {
        snprintf(why, whylen, "malformed");
        return GCOLL_ERR_INVALID;
    }
    gcoll_tensor_state_t *n = *slot && (*slot)->count == ncount ? *slot : NULL;
    if (apply && !n) {
        gcoll_state_destroy(*slot);
        *slot = NULL;
        GCOLL_CHECK(gcoll_state_create_mode(c, (size_t)ncount, want.mode, &n));
        *slot = n;
    }
    return get_body(in, n, c, apply, kind, want, why, whylen);
}

/* Checks one body against s (apply == 0; s NULL for a nested state not made yet) or copies
 * it in (apply != 0, after a check). */
static gcoll_status_t get_body(in_t *in, gcoll_tensor_state_t *s, const gcoll_compressor_t *c,
                               int apply, int kind, want_t want, char *why, size_t whylen)
{
    uint64_t count, step, at;
    uint32_t flags, thr;
    if (get(in, &count, 8) || get(in, &step, 8) || get(in, &flags, 4) || get(in, &thr, 4) ||
        get(in, &at, 8)) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    if (kind == K_TOP && count != s->count) {
        snprintf(why, whylen, "saved for %llu elements, the state has %zu",
                 (unsigned long long)count, s->count);
        return GCOLL_ERR_MISMATCH;
    }
    uint32_t allowed = F_E | F_U | F_REUSE | (kind != K_SERVER ? F_SERVER : 0) |
                       (kind == K_TOP ? F_HIER : 0) | (in->version >= 2 ? F_BOOK : 0);
    if (count > GCOLL_WIRE_MAX_COUNT || (flags & ~allowed)) {
        snprintf(why, whylen, "malformed");
        return GCOLL_ERR_INVALID;
    }
    int want_e = s ? !!s->e : want.e, want_u = s ? !!s->u : want.u;
    if (!!(flags & F_E) != want_e || !!(flags & F_U) != want_u) {
        snprintf(why, whylen, "the saved state's buffers do not match this compressor's");
        return GCOLL_ERR_MISMATCH;
    }
    size_t bytes = (size_t)count * sizeof(float);
    const unsigned char *e = in->p + in->off;
    if ((flags & F_E) && get(in, NULL, bytes)) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    const unsigned char *u = in->p + in->off;
    if ((flags & F_U) && get(in, NULL, bytes)) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    /* vq's codebook: exactly the spec's size, every value finite (the encoder starts its
     * Lloyd iterations from it, and a NaN would reach every later message) */
    const size_t nbook = (flags & F_BOOK) ? book_floats(c) : 0;
    const unsigned char *book = in->p + in->off;
    if (flags & F_BOOK) {
        uint32_t nb;
        if (get(in, &nb, 4)) {
            snprintf(why, whylen, "truncated");
            return GCOLL_ERR_INVALID;
        }
        if (!nbook || nb != nbook) {
            snprintf(why, whylen, "malformed: a codebook of %u values where the spec's has %zu", nb,
                     nbook);
            return GCOLL_ERR_INVALID;
        }
        book = in->p + in->off;
        if (get(in, NULL, nbook * sizeof(float))) {
            snprintf(why, whylen, "truncated");
            return GCOLL_ERR_INVALID;
        }
        for (size_t i = 0; i < nbook; i++) {
            float f;
            memcpy(&f, book + 4 * i, 4);
            if (!isfinite(f)) {
                snprintf(why, whylen, "malformed: codebook value %zu is %g", i, (double)f);
                return GCOLL_ERR_INVALID;
            }
        }
    }
    if (apply) {
        /* the one allocation first, so that running out of memory leaves this body as it was */
        if (nbook && !s->vq_book && !(s->vq_book = malloc(nbook * sizeof(float)))) {
            snprintf(why, whylen, "no memory for the codebook");
            return GCOLL_ERR_NOMEM;
        }
        if (nbook) {
            memcpy(s->vq_book, book, nbook * sizeof(float));
        } else { /* saved cold: the next encode starts cold too */
            free(s->vq_book);
            s->vq_book = NULL;
        }
        s->step = step;
        s->reuse_thr = thr;
        s->reuse_at = at;
        s->reuse_valid = !!(flags & F_REUSE);
        if (s->e)
            memcpy(s->e, e, bytes);
        if (s->u)
            memcpy(s->u, u, bytes);
    }
    gcoll_tensor_state_t *none = NULL;
    if (flags & F_SERVER) {
        want_t w = {.e = !!c->ef, .u = 0, .mode = GCOLL_STATE_SERVER};
        GCOLL_CHECK(get_nested(in, s ? &s->server : &none, c, apply, K_SERVER, w, why, whylen));
    } else if (apply) {
        gcoll_state_destroy(s->server);
        s->server = NULL;
    }
    if (kind != K_TOP)
        return GCOLL_OK;
    if (flags & F_HIER) {
        want_t w = {.e = !!s->e, .u = !!s->u, .mode = s->mode};
        GCOLL_CHECK(get_nested(in, &s->hier_part, c, apply, K_HIER, w, why, whylen));
    } else if (apply) {
        gcoll_state_destroy(s->hier_part);
        s->hier_part = NULL;
    }
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_state_load(gcoll_tensor_state_t *s, const void *buf, size_t len)
{
    if (!s || (!buf && len)) {
        GCOLL_WARN("compress: gcoll_state_load: NULL state or buffer");
        return GCOLL_ERR_INVALID;
    }
    char why[160] = "";
    in_t in = {.p = buf, .len = len};
    char magic[4];
    uint32_t version, speclen;
    gcoll_status_t st = GCOLL_ERR_INVALID;
    if (get(&in, magic, 4) || memcmp(magic, STATE_MAGIC, 4) || get(&in, &version, 4) ||
        version < 1 || version > STATE_VERSION || get(&in, &speclen, 4) ||
        in.len - in.off < speclen) {
        snprintf(why, sizeof(why), "not a saved gcoll state of version 1..%u", STATE_VERSION);
        goto fail;
    }
    const char *spec = gcoll_compressor_spec(s->c);
    if (speclen != strlen(spec) || memcmp(in.p + in.off, spec, speclen)) {
        snprintf(why, sizeof(why), "saved with compressor '%.*s', the state's is '%s'",
                 (int)(speclen > 200 ? 200 : speclen), (const char *)in.p + in.off, spec);
        st = GCOLL_ERR_MISMATCH;
        goto fail;
    }
    in.off += speclen;
    in.version = version;
    size_t body = in.off;
    /* check everything first, so that a bad buffer leaves the state as it was */
    if ((st = get_body(&in, s, s->c, 0, K_TOP, (want_t){0}, why, sizeof(why))) != GCOLL_OK)
        goto fail;
    if (in.off != in.len) {
        snprintf(why, sizeof(why), "%zu bytes after the state", in.len - in.off);
        st = GCOLL_ERR_INVALID;
        goto fail;
    }
    in.off = body;
    if ((st = get_body(&in, s, s->c, 1, K_TOP, (want_t){0}, why, sizeof(why))) != GCOLL_OK)
        goto fail;
    return GCOLL_OK;
fail:
    GCOLL_WARN("compress: gcoll_state_load: %s", why);
    return st;
}
