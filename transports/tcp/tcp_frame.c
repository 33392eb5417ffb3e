/* tcp_frame.c: encoding and bounds-checked decoding of TCP frame headers. */
#include "transports/tcp/tcp_frame.h"

#include <string.h>

#include "base/util.h"

void gcoll_frame_encode(const gcoll_frame_t *f, uint8_t hdr[GCOLL_FRAME_HDR_LEN])
{
    memset(hdr, 0, GCOLL_FRAME_HDR_LEN);
    gcoll_put_u32(hdr, GCOLL_FRAME_MAGIC);
    hdr[4] = GCOLL_FRAME_VERSION;
    hdr[5] = (uint8_t)f->type;
    gcoll_put_u32(hdr + 8, f->sig);
    gcoll_put_u64(hdr + 16, f->tag);
    gcoll_put_u64(hdr + 24, f->msg_len);
    gcoll_put_u64(hdr + 32, f->frag_off);
    gcoll_put_u64(hdr + 40, f->frag_len);
}

const char *gcoll_frame_decode(const uint8_t hdr[GCOLL_FRAME_HDR_LEN], gcoll_frame_t *f)
{
    if (gcoll_get_u32(hdr) != GCOLL_FRAME_MAGIC)
        return "bad magic";
    if (hdr[4] != GCOLL_FRAME_VERSION)
        return "unsupported frame version";
    f->type = hdr[5];
    f->sig = gcoll_get_u32(hdr + 8);
    f->tag = gcoll_get_u64(hdr + 16);
    f->msg_len = gcoll_get_u64(hdr + 24);
    f->frag_off = gcoll_get_u64(hdr + 32);
    f->frag_len = gcoll_get_u64(hdr + 40);
    if (f->type != GCOLL_FRAME_DATA && f->type != GCOLL_FRAME_ABORT)
        return "unknown frame type";
    if (f->msg_len > GCOLL_FRAME_MAX_MSG)
        return "message length beyond the sane maximum";
    if (f->frag_len > f->msg_len || f->frag_off > f->msg_len - f->frag_len)
        return "fragment outside its message";
    if (f->type == GCOLL_FRAME_ABORT &&
        (f->msg_len > GCOLL_FRAME_MAX_CTL || f->frag_off != 0 || f->frag_len != f->msg_len))
        return "malformed abort frame";
    if (f->type == GCOLL_FRAME_DATA && f->frag_len == 0 && f->msg_len != 0)
        return "empty fragment of a non-empty message";
    return NULL;
}
