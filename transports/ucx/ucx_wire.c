/* ucx_wire.c: what the UCX transport reads off the wire, as pure functions (the fuzzer's
 * target, tests/fuzz/fuzz_ucx_hdr.c): the active-message header, the single-copy write
 * request (layouts in ucx_int.h); and UCX's statuses as gcoll's. */
#include "transports/ucx/ucx_int.h"
#include "base/util.h"

gcoll_status_t gcoll_ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return GCOLL_OK;
    case UCS_ERR_CANCELED:
        return GCOLL_ERR_ABORTED;
    case UCS_ERR_NO_MEMORY:
        return GCOLL_ERR_NOMEM;
    case UCS_ERR_MESSAGE_TRUNCATED: /* not expected: lengths are checked before receiving */
        return GCOLL_ERR_MISMATCH;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return GCOLL_ERR_PEER;
    default:
        return GCOLL_ERR_TRANSPORT;
    }
}

void gcoll_ucx_hdr_encode(const ucx_hdr_t *h, uint8_t out[GCOLL_UCX_HDR_LEN])
{
    gcoll_put_u32(out, GCOLL_UCX_MAGIC);
    out[4] = GCOLL_UCX_VERSION;
    out[5] = (uint8_t)h->type;
    out[6] = (uint8_t)(-h->status);
    out[7] = 0;
    gcoll_put_u32(out + 8, h->src);
    gcoll_put_u32(out + 12, h->sig);
    gcoll_put_u64(out + 16, h->cookie);
    gcoll_put_u64(out + 24, h->tag);
}

const char *gcoll_ucx_hdr_decode(const void *buf, size_t len, ucx_hdr_t *h)
{
    const uint8_t *p = buf;
    if (len != GCOLL_UCX_HDR_LEN || !p)
        return "bad header length";
    if (gcoll_get_u32(p) != GCOLL_UCX_MAGIC)
        return "bad magic";
    if (p[4] != GCOLL_UCX_VERSION)
        return "unsupported version";
    if (p[5] < UCX_MSG_DATA || p[5] > UCX_MSG_PUTFIN)
        return "unknown message type";
    h->type = p[5];
    h->status = -(int)p[6];
    h->src = gcoll_get_u32(p + 8);
    h->sig = gcoll_get_u32(p + 12);
    h->cookie = gcoll_get_u64(p + 16);
    h->tag = gcoll_get_u64(p + 24);
    return NULL;
}

void gcoll_ucx_put_encode(const ucx_put_t *m, uint8_t out[GCOLL_UCX_PUT_LEN])
{
    gcoll_put_u64(out, m->send_token);
    gcoll_put_u64(out + 8, m->addr);
    gcoll_put_u64(out + 16, m->len);
    gcoll_put_u64(out + 24, m->wlen);
    gcoll_put_u64(out + 32, m->tok_addr);
    gcoll_put_u64(out + 40, m->token);
}

const char *gcoll_ucx_put_decode(const void *buf, size_t len, ucx_put_t *m)
{
    const uint8_t *p = buf;
    if (len != GCOLL_UCX_PUT_LEN || !p)
        return "bad length";
    *m = (ucx_put_t){.send_token = gcoll_get_u64(p),
                     .addr = gcoll_get_u64(p + 8),
                     .len = gcoll_get_u64(p + 16),
                     .wlen = gcoll_get_u64(p + 24),
                     .tok_addr = gcoll_get_u64(p + 32),
                     .token = gcoll_get_u64(p + 40)};
    if (m->send_token == 0 || m->token == 0)
        return "zero token";
    if (m->len && m->addr + m->len < m->addr)
        return "buffer wraps the address space";
    if (m->wlen > m->len)
        return "asks for more than the message";
    return NULL;
}
