/* tcp_frame.h: the TCP transport's frame header, encoded and validated without sockets
 * so that the checks can be unit-tested. */
#ifndef GCOLL_TCP_FRAME_H
#define GCOLL_TCP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define GCOLL_FRAME_MAGIC 0x46544347u /* "GCTF" little-endian */
#define GCOLL_FRAME_VERSION 1
#define GCOLL_FRAME_HDR_LEN 48
#define GCOLL_FRAME_MAX_MSG (1ull << 40) /* sanity bound on one message */
#define GCOLL_FRAME_MAX_CTL 1024         /* longest control (abort) payload */

enum { GCOLL_FRAME_DATA = 1, GCOLL_FRAME_ABORT = 2 };

/* Layout (little-endian): magic u32, version u8, type u8, reserved u16, sig u32,
 * reserved u32, tag u64, msg_len u64, frag_off u64, frag_len u64. */
typedef struct {
    int type;
    uint32_t sig;
    uint64_t tag;
    uint64_t msg_len;
    uint64_t frag_off;
    uint64_t frag_len;
} gcoll_frame_t;

void gcoll_frame_encode(const gcoll_frame_t *f, uint8_t hdr[GCOLL_FRAME_HDR_LEN]);
/* NULL if the header is valid, else a short description of what is wrong. */
const char *gcoll_frame_decode(const uint8_t hdr[GCOLL_FRAME_HDR_LEN], gcoll_frame_t *f);

#endif /* GCOLL_TCP_FRAME_H */
