/* fuzz_bootstrap.c: libFuzzer target for the rendezvous messages (lib/core/bootstrap.c's hello and
 * reply parsers). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bootstrap.h"

/*
 * Input: a selector byte (bit 0: hello or reply; the rest: the job size for a reply),
 * then the message. The parsers are fed a growing prefix as a socket reader feeds them:
 * each "need more" must ask for more than it was given, the verdict on the whole must not
 * depend on how it arrived, and a complete message must lie inside the bytes given and
 * encode back to the same bytes (hello).
 */
static int parse(int hello, const uint8_t *m, size_t len, uint32_t size, void *out, size_t *need)
{
    const char *why = NULL;
    int r = hello ? gcoll_bs_hello_parse(m, len, out, need, &why)
                  : gcoll_bs_reply_parse(m, len, size, out, need, &why);
    if ((r < 0) != (why != NULL) || r < -1 || r > 1)
        abort();
    if ((r == 0 && *need <= len) || (r == 1 && *need > len))
        abort();
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int hello = data[0] & 1;
    uint32_t jobsize = (uint32_t)(data[0] >> 1) + 1;
    size_t len = size - 1;
    uint8_t *m = malloc(len ? len : 1); /* exact size: ASan sees reads past the end */
    memcpy(m, data + 1, len);
    gcoll_bs_hello_t h;
    gcoll_bs_reply_t r;
    void *out = hello ? (void *)&h : (void *)&r;
    size_t need = 0, got = 0;
    /* as a reader does: read exactly what the parser asks for, then ask again */
    int v;
    while ((v = parse(hello, m, got, jobsize, out, &need)) == 0 && need <= len)
        got = need;
    size_t whole_need;
    int whole = parse(hello, m, len, jobsize, out, &whole_need);
    if (v != whole && !(v == 0 && need > len))
        abort();
    if (whole == 1 && whole_need != need)
        abort();
    if (whole == 1 && hello) {
        if (h.mlen > GCOLL_BS_MAX_FIELD || h.blen > GCOLL_BS_MAX_FIELD ||
            (const uint8_t *)h.match < m || h.blob + h.blen > m + len ||
            memchr(h.version, '\0', sizeof(h.version)) == NULL)
            abort();
        size_t n = gcoll_bs_hello_encode(&h, NULL);
        uint8_t *e = malloc(n);
        if (n != whole_need || gcoll_bs_hello_encode(&h, e) != n)
            abort();
        /* the version's last byte is forced to NUL; everything else is carried */
        if (memcmp(e, m, 35) != 0 || memcmp(e + 36, m + 36, n - 36) != 0)
            abort();
        free(e);
    } else if (whole == 1) {
        if (r.mlen > GCOLL_BS_MAX_FIELD || r.n > jobsize || r.table + r.tlen > m + len ||
            (r.status != 0 && r.n != 0))
            abort();
        /* the table's entries tile it exactly */
        size_t off = 0;
        for (uint32_t i = 0; i < r.n; i++) {
            if (r.tlen - off < 4)
                abort();
            uint32_t l = (uint32_t)r.table[off] | (uint32_t)r.table[off + 1] << 8 |
                         (uint32_t)r.table[off + 2] << 16 | (uint32_t)r.table[off + 3] << 24;
            if (l > r.tlen - off - 4)
                abort();
            off += 4 + l;
        }
        if (off != r.tlen)
            abort();
    }
    free(m);
    return 0;
}
