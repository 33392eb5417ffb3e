/* state_io.c: a tensor state as bytes and back (checkpoints: gcoll_state_save/load). */
#include <stdio.h>
#include <string.h>

#include "compress.h"
#include "wire.h"

/* Layout, in host byte order (checked little-endian below, like the wire format):
 *   "GCST" u32 version u32 speclen spec[speclen] body
 *   body = u64 count u64 step u32 flags u32 reuse_thr u64 reuse_at
 *          [float e[count]] [float u[count]] [body of the server state]
 * flags: 1 e present, 2 u present, 4 server present, 8 reuse threshold valid.
 * Everything that decides a later encode is here, so a restored state continues bit for
 * bit; the spare buffer and the scratch are rewritten before they are read, and the
 * salt is set by every collective call. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "state_io.c writes host byte order and assumes a little-endian host"
#endif

#define STATE_MAGIC "GCST"
#define STATE_VERSION 1u
enum { F_E = 1, F_U = 2, F_SERVER = 4, F_REUSE = 8 };

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
    uint32_t flags = (s->e ? F_E : 0) | (s->u ? F_U : 0) | (s->server ? F_SERVER : 0) |
                     (s->reuse_valid ? F_REUSE : 0);
    put(o, &count, 8);
    put(o, &step, 8);
    put(o, &flags, 4);
    put(o, &s->reuse_thr, 4);
    put(o, &at, 8);
    if (s->e)
        put(o, s->e, s->count * sizeof(float));
    if (s->u)
        put(o, s->u, s->count * sizeof(float));
    if (s->server)
        put_body(o, s->server);
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

/* Checks one body against s (apply == 0) or copies it in (apply != 0, after a check).
 * depth bounds the nesting: a worker state has at most one server state. */
static gcoll_status_t get_body(in_t *in, gcoll_tensor_state_t *s, const gcoll_compressor_t *c,
                               int apply, int depth, char *why, size_t whylen)
{
    uint64_t count, step, at;
    uint32_t flags, thr;
    if (get(in, &count, 8) || get(in, &step, 8) || get(in, &flags, 4) || get(in, &thr, 4) ||
        get(in, &at, 8)) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    if (s && count != s->count) {
        snprintf(why, whylen, "saved for %llu elements, the state has %zu",
                 (unsigned long long)count, s->count);
        return GCOLL_ERR_MISMATCH;
    }
    if (count > GCOLL_WIRE_MAX_COUNT || (flags & ~(uint32_t)(F_E | F_U | F_SERVER | F_REUSE)) ||
        ((flags & F_SERVER) && depth > 0)) {
        snprintf(why, whylen, "malformed");
        return GCOLL_ERR_INVALID;
    }
    /* a state of this compressor has e and u exactly when the saved one had them (a
     * server state, checked before it exists: e with error feedback, never u) */
    int want_e = s ? !!s->e : !!c->ef, want_u = s ? !!s->u : 0;
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
    if (apply) {
        s->step = step;
        s->reuse_thr = thr;
        s->reuse_at = at;
        s->reuse_valid = !!(flags & F_REUSE);
        if (s->e)
            memcpy(s->e, e, bytes);
        if (s->u)
            memcpy(s->u, u, bytes);
    }
    if (!(flags & F_SERVER)) {
        if (apply) {
            gcoll_state_destroy(s->server);
            s->server = NULL;
        }
        return GCOLL_OK;
    }
    /* the server state's size is its own (this rank's chunk): read it ahead */
    uint64_t scount;
    if (in->len - in->off < 8) {
        snprintf(why, whylen, "truncated");
        return GCOLL_ERR_INVALID;
    }
    memcpy(&scount, in->p + in->off, 8);
    if (scount > GCOLL_WIRE_MAX_COUNT) {
        snprintf(why, whylen, "malformed");
        return GCOLL_ERR_INVALID;
    }
    gcoll_tensor_state_t *srv = NULL;
    if (apply) {
        if (s->server && s->server->count == scount) {
            srv = s->server;
        } else {
            gcoll_state_destroy(s->server);
            s->server = NULL;
            GCOLL_CHECK(gcoll_state_create_mode(c, (size_t)scount, GCOLL_STATE_SERVER, &srv));
            s->server = srv;
        }
    }
    return get_body(in, srv, c, apply, depth + 1, why, whylen);
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
        version != STATE_VERSION || get(&in, &speclen, 4) || in.len - in.off < speclen) {
        snprintf(why, sizeof(why), "not a saved gcoll state (or another version)");
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
    size_t body = in.off;
    /* check everything first, so that a bad buffer leaves the state as it was */
    if ((st = get_body(&in, s, s->c, 0, 0, why, sizeof(why))) != GCOLL_OK)
        goto fail;
    if (in.off != in.len) {
        snprintf(why, sizeof(why), "%zu bytes after the state", in.len - in.off);
        st = GCOLL_ERR_INVALID;
        goto fail;
    }
    in.off = body;
    if ((st = get_body(&in, s, s->c, 1, 0, why, sizeof(why))) != GCOLL_OK)
        goto fail;
    return GCOLL_OK;
fail:
    GCOLL_WARN("compress: gcoll_state_load: %s", why);
    return st;
}
