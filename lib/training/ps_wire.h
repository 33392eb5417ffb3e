/* ps_wire.h: the parameter server's messages (lib/training/ps.c), network-free so tests can
 * feed them crafted bytes. A message is a 32-byte header (magic, kind, three 64-bit fields)
 * and, for a push or a compressed pull answer, a frame: per registered tensor a 32-bit
 * length and that tensor's codec message (empty when the owner's slice is). Every decoder
 * checks each field against the message length and the registered slices first. */
#ifndef GCOLL_PS_WIRE_H
#define GCOLL_PS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "gcoll.h"

enum {
    GCOLL_PS_MAGIC = 0x31535047u, /* "GPS1" */
    GCOLL_PS_PUSH = 1,            /* a: clock, b: read clock, c: tensors; then a frame */
    GCOLL_PS_PULL = 2,            /* a: clock */
    GCOLL_PS_DONE = 3,            /* a: clock */
    GCOLL_PS_REPLY = 4,           /* a: shard clock, b: 0 dense / 1 frame, c: floats or tensors */
    GCOLL_PS_HDR = 32
};

typedef struct {
    uint32_t kind;
    uint64_t a, b, c;
} gcoll_ps_hdr_t;

void gcoll_ps_put_hdr(uint8_t *buf, uint32_t kind, uint64_t a, uint64_t b, uint64_t c);
/* GCOLL_ERR_INVALID if len < GCOLL_PS_HDR or the magic is wrong. */
gcoll_status_t gcoll_ps_get_hdr(const uint8_t *buf, size_t len, gcoll_ps_hdr_t *h);

/* The worst-case size of a frame over n slices of counts[i] floats, header included. */
size_t gcoll_ps_frame_bound(const gcoll_compressor_t *c, const size_t *counts, int n);

/* Encodes src[i][0..counts[i]) with c, each with state st[i] (st or st[i] NULL: without
 * feedback), after the header room: out[GCOLL_PS_HDR..*len_p). The header is the caller's. */
gcoll_status_t gcoll_ps_frame_encode(gcoll_compressor_t *c, gcoll_tensor_state_t *const *st,
                                     const float *const *src, const size_t *counts, int n,
                                     uint8_t *out, size_t cap, size_t *len_p);

/* Decodes a frame of n slices into dst[i][0..counts[i]) (overwrite, or add when
 * accumulate). First the whole frame is checked: a length per tensor inside the message,
 * none past it, none for an empty slice, no trailing bytes, and each codec message in
 * full (counts[i] elements, c's codec and value format, bounds, finite values); only then
 * is anything written. On GCOLL_ERR_INVALID why (if not NULL) says what is wrong. */
gcoll_status_t gcoll_ps_frame_decode(const gcoll_compressor_t *c, const uint8_t *buf, size_t len,
                                     float *const *dst, const size_t *counts, int n, int accumulate,
                                     char *why, size_t whylen);

/* 1 when c sends fp32 as it is (the codec 'none', without clipping): its messages are
 * the values themselves, and an error-feedback residual would stay 0 exactly. */
int gcoll_ps_exact(const gcoll_compressor_t *c);

/* dst[i][j] += a * x[i][j] for a frame of such a codec (gcoll_ps_exact), read from the
 * message without a decoded copy; checked in full first, as gcoll_ps_frame_decode does.
 * GCOLL_ERR_INVALID, nothing written, for a malformed frame or another codec. */
gcoll_status_t gcoll_ps_frame_axpy(const gcoll_compressor_t *c, const uint8_t *buf, size_t len,
                                   float *const *dst, const size_t *counts, int n, float a,
                                   char *why, size_t whylen);

/* A compressed pull answer (Qsparse-style error feedback with the residual on the owner):
 * the owner keeps view, the model the worker holds; it sends C(w - view) and adds what it
 * sent to view, so the worker, which adds the same decoded message to its params, holds
 * view exactly and w - view is the residual of the next answer. scratch: room for the
 * slices' total. Writes the frame after the header room, as gcoll_ps_frame_encode. */
gcoll_status_t gcoll_ps_encode_delta(gcoll_compressor_t *c, const float *w, float *view,
                                     float *scratch, const size_t *counts, int n, uint8_t *out,
                                     size_t cap, size_t *len_p);

#endif
