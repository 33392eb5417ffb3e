/* idx.c: IDX reader (Y. LeCun's MNIST format: big-endian magic 0x0000TTNN, NN u32 dims,
 * then the array), through zlib when built with it so .gz files are read as they ship. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GCOLL_TRAIN_HAVE_ZLIB
#include <zlib.h>
#endif

#include "idx.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_MAX_BYTES ((size_t)1 << 30)

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int train_idx_have_gzip(void)
{
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    return 1;
#else
    return 0;
#endif
}

/* A byte source: zlib's gzFile reads gzip and plain files alike; stdio otherwise. */
typedef struct {
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    gzFile gz;
#else
    FILE *f;
#endif
    const char *path;
} src_t;

static int src_open(src_t *s, const char *path, char *err, size_t errlen)
{
    s->path = path;
    FILE *f = fopen(path, "rb");
    if (!f) {
        seterr(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    fclose(f);
    s->gz = gzopen(path, "rb");
    if (!s->gz) {
        seterr(err, errlen, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
        return -1;
    }
    gzbuffer(s->gz, 1 << 17);
#else
    int c0 = fgetc(f), c1 = fgetc(f);
    if (c0 == 0x1f && c1 == 0x8b) {
        fclose(f);
        seterr(err, errlen,
               "%s: gzip-compressed, but gcoll-train was built without zlib (install zlib1g-dev "
               "and reconfigure, or gunzip the file)",
               path);
        return -1;
    }
    rewind(f);
    s->f = f;
#endif
    return 0;
}

#ifdef GCOLL_TRAIN_HAVE_ZLIB
/* zlib's message, without the "path: " it prefixes. */
static const char *gz_message(src_t *s, int *zerr)
{
    const char *msg = gzerror(s->gz, zerr);
    size_t n = strlen(s->path);
    if (strncmp(msg, s->path, n) == 0 && strncmp(msg + n, ": ", 2) == 0)
        msg += n + 2;
    return msg;
}
#endif

/* Reads up to n bytes; returns the count read (short at end of file), -1 on a read error
 * (message in err). */
static long long src_read(src_t *s, void *buf, size_t n, char *err, size_t errlen)
{
    size_t got = 0;
    while (got < n) {
#ifdef GCOLL_TRAIN_HAVE_ZLIB
        unsigned want = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(s->gz, (uint8_t *)buf + got, want);
        if (r < 0) {
            int zerr;
            const char *msg = gz_message(s, &zerr);
            seterr(err, errlen, "%s: corrupt gzip stream: %s", s->path,
                   zerr == Z_ERRNO ? strerror(errno) : msg);
            return -1;
        }
        if (r == 0) {
            /* zlib reports a gzip stream cut short at EOF only through gzerror */
            int zerr;
            const char *msg = gz_message(s, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) {
                seterr(err, errlen, "%s: corrupt gzip stream: %s", s->path, msg);
                return -1;
            }
            break;
        }
#else
        size_t r = fread((uint8_t *)buf + got, 1, n - got, s->f);
        if (r == 0) {
            if (ferror(s->f)) {
                seterr(err, errlen, "%s: read error: %s", s->path, strerror(errno));
                return -1;
            }
            break;
        }
#endif
        got += (size_t)r;
    }
    return (long long)got;
}

static void src_close(src_t *s)
{
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    if (s->gz)
        gzclose(s->gz);
#else
    if (s->f)
        fclose(s->f);
#endif
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int train_idx_load(const char *path, unsigned ndims, train_idx_t *out, char *err, size_t errlen)
{
    if (!path || !out || ndims == 0 || ndims > TRAIN_IDX_MAX_DIMS) {
        seterr(err, errlen, "train_idx_load: bad arguments");
        return -1;
    }
    src_t s = {0};
    if (src_open(&s, path, err, errlen) != 0)
        return -1;
    int rc = -1;
    uint8_t *data = NULL;
    uint8_t hdr[4 + 4 * TRAIN_IDX_MAX_DIMS];
    size_t hlen = 4 + 4 * (size_t)ndims;
    long long got = src_read(&s, hdr, 4, err, errlen);
    if (got < 0)
        goto out;
    if (got < 4) {
        seterr(err, errlen, "%s: truncated: %lld of the 4 magic bytes", path, got);
        goto out;
    }
    uint32_t magic = be32(hdr);
    uint32_t want = (uint32_t)IDX_TYPE_UBYTE << 8 | ndims;
    if (magic != want) {
        if ((magic >> 16) != 0 || (magic >> 8 & 0xff) != IDX_TYPE_UBYTE)
            seterr(err, errlen,
                   "%s: not an IDX file of unsigned bytes: magic 0x%08x, expected 0x%08x", path,
                   magic, want);
        else
            seterr(err, errlen, "%s: IDX file has %u dimensions, expected %u", path, magic & 0xff,
                   ndims);
        goto out;
    }
    got = src_read(&s, hdr + 4, hlen - 4, err, errlen);
    if (got < 0)
        goto out;
    if ((size_t)got < hlen - 4) {
        seterr(err, errlen, "%s: truncated header: %lld of %zu dimension bytes", path, got,
               hlen - 4);
        goto out;
    }
    size_t total = 1, item = 1;
    for (unsigned i = 0; i < ndims; i++) {
        out->dims[i] = be32(hdr + 4 + 4 * i);
        if (out->dims[i] == 0 || (total *= out->dims[i]) > IDX_MAX_BYTES) {
            seterr(err, errlen, "%s: implausible dimensions (dimension %u is %u)", path, i,
                   out->dims[i]);
            goto out;
        }
        if (i > 0)
            item *= out->dims[i];
    }
    data = malloc(total);
    if (!data) {
        seterr(err, errlen, "%s: out of memory for %zu bytes", path, total);
        goto out;
    }
    got = src_read(&s, data, total, err, errlen);
    if (got < 0)
        goto out;
    if ((size_t)got < total) {
        seterr(err, errlen, "%s: truncated: %lld of %zu data bytes (%u items announced)", path, got,
               total, out->dims[0]);
        goto out;
    }
    uint8_t extra;
    got = src_read(&s, &extra, 1, err, errlen);
    if (got < 0)
        goto out;
    if (got != 0) {
        seterr(err, errlen, "%s: trailing bytes after the %zu data bytes", path, total);
        goto out;
    }
    out->data = data;
    out->ndims = ndims;
    out->items = out->dims[0];
    out->item_size = item;
    data = NULL;
    rc = 0;
out:
    free(data);
    src_close(&s);
    return rc;
}

void train_idx_free(train_idx_t *idx)
{
    if (!idx)
        return;
    free(idx->data);
    idx->data = NULL;
}
