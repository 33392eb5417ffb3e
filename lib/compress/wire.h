/* wire.h: the codec wire format: header layout, index coding and value-section sizes. */
#ifndef GCOLL_COMPRESS_WIRE_H
#define GCOLL_COMPRESS_WIRE_H

/*
 * Every message is a 48-byte little-endian header followed by the payload:
 *
 *   off size field
 *     0    4 magic        "GCZ1" (0x315a4347)
 *     4    1 version      1
 *     5    1 codec        1 dense, 2 sparse, 3 random-k
 *     6    2 flags        bit0 indices sorted (strictly ascending), bit1 delta-bitpacked
 *                         indices, bit2 dense fallback inside a sparse message, bit3
 *                         row-coded indices
 *     8    8 count        tensor (chunk) elements
 *    16    8 nnz          values carried (count for dense)
 *    24    8 payload_len  bytes after the header; must equal len - 48 exactly
 *    32    8 param        bits 0-7 value format, 8-15 qsgd bits, 32-63 bucket/chunk
 *    40    8 key          random-k index key (0 otherwise)
 *
 * Payloads:
 *   dense    value section of count values
 *   sparse   index section (nnz indices) + value section of nnz values; with the dense
 *            flag no index section and nnz == count
 *   random-k value section of nnz values; indices from gcoll_randomk_indices(key, ...)
 *
 * Index section: raw u32 array, or (flag bit1) blocks of 128 gaps: one width byte w
 * (0..32) then the gaps bitpacked LSB-first in ceil(m*w/8) bytes. The first gap is the
 * first index; later gaps are idx[i] - idx[i-1] - 1, so sortedness is built in.
 * Row-coded (flag bit3, with bit0 and without bit1; rowsparse's whole rows): u32 dim D,
 * u32 nrows, u32 last_len, then the nrows ascending row indices r as delta blocks above.
 * Row r carries elements r*D .. r*D + len - 1, len = D for every row but the last
 * carried one, whose len is last_len (1..D; below D only for the tensor's short last row,
 * ending at count), and nnz = (nrows - 1) * D + last_len. 12 bytes plus about one
 * row-gap's bits a row, where element deltas cost a block's widest gap per element.
 *
 * Value sections (nb = number of buckets):
 *   f32   4*n          f16/bf16 2*n
 *   q8    4*nb scales (f32) then n int8 codes in [-127, 127]
 *   qsgd  4*nb norms (f32) then n codes of B bits, offset binary in [0, 2s], s = 2^(B-1)-1
 *   sign  4*nb scales (f32) then ceil(n/8) bytes, bit set = negative
 *   fp8   one f32 scale (a power of two) then n OFP8 codes (sign bit 7; bits: 1 E4M3,
 *         2 E5M2)
 *   mxfp8 nb = ceil(n/32) E8M0 scale bytes (bucket 32), then n E4M3/E5M2 codes
 *   mxfp4 nb E8M0 scale bytes, then ceil(n/2) bytes of E2M1 codes, element 2i in the low
 *         nibble of byte i (sign bit 3); an odd count leaves the last high nibble zero
 */

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"

#define GCOLL_WIRE_MAGIC 0x315a4347u
#define GCOLL_WIRE_VERSION 1
#define GCOLL_WIRE_HDR 48
#define GCOLL_WIRE_IDX_BLOCK 128
/* Values per shared scale of the MX formats (OCP MX v1.0's block size) */
#define GCOLL_MX_BLOCK 32
/* Largest count a message may describe: indices are 32-bit. */
#define GCOLL_WIRE_MAX_COUNT 0xffffffffull

enum { GCOLL_WIRE_DENSE = 1, GCOLL_WIRE_SPARSE = 2, GCOLL_WIRE_RANDOMK = 3 };
enum {
    GCOLL_WIRE_F_SORTED = 1u << 0,
    GCOLL_WIRE_F_DELTA = 1u << 1,
    GCOLL_WIRE_F_DENSE = 1u << 2,
    GCOLL_WIRE_F_ROWS = 1u << 3,
    GCOLL_WIRE_F_ALL = 0xfu
};

typedef struct {
    unsigned codec;
    unsigned flags;
    uint64_t count;
    uint64_t nnz;
    uint64_t payload_len;
    gcoll_vspec_t vs; /* sign_l2 is not on the wire (the scale is) */
    uint64_t key;
} gcoll_wire_hdr_t;

void gcoll_wire_put_hdr(uint8_t *p, const gcoll_wire_hdr_t *h);

/* Parses and checks the header against len and count (count == SIZE_MAX: any): magic,
 * version, codec, flags, counts, payload length. Logs and returns GCOLL_ERR_INVALID. */
gcoll_status_t gcoll_wire_parse_hdr(const void *in, size_t len, size_t count, gcoll_wire_hdr_t *h);

/* The whole check of a message before anything is written: the header against len and
 * count, the codec and value format against c's (c NULL: any), the index and value
 * sections (bounds, order, finite values). Fills h and the index section's size for
 * gcoll_codec_apply. Logs and returns GCOLL_ERR_INVALID. */
gcoll_status_t gcoll_codec_parse(const gcoll_compressor_t *c, const void *in, size_t len,
                                 size_t count, gcoll_wire_hdr_t *h, size_t *isz_p);

/* Applies a message whose header h and payload pl (index section isz bytes) were
 * validated to out (decode.c; the encoder subtracts what it sent from the residual with
 * it); sparse ADD/SUB touch only the nnz targets. */
gcoll_status_t gcoll_codec_apply(const gcoll_wire_hdr_t *h, const uint8_t *pl, size_t isz,
                                 float *out, gcoll_dmode_t mode);

/* Bytes of a value section of n values; SIZE_MAX on overflow or bad parameters. */
size_t gcoll_vsec_size(const gcoll_vspec_t *vs, uint64_t n);
/* Number of scale buckets of a value section of n values. */
uint64_t gcoll_vsec_buckets(const gcoll_vspec_t *vs, uint64_t n);

/* Index coding. Bytes needed for delta-bitpacked sorted indices. */
size_t gcoll_idx_delta_size(const uint32_t *idx, size_t nnz);
size_t gcoll_idx_delta_write(const uint32_t *idx, size_t nnz, uint8_t *out);
/* Row coding of sorted element indices idx[0..nnz) of a tensor of count elements viewed as
 * rows of dim: the section's size, or 0 when the indices are not whole rows (each row
 * complete, the tensor's last one up to count) or nnz is 0. rows: scratch of nnz/dim + 1
 * entries, receives the row indices. */
size_t gcoll_idx_rows_size(const uint32_t *idx, size_t nnz, uint64_t count, uint32_t dim,
                           uint32_t *rows, size_t *nrows_p);
/* Writes the section gcoll_idx_rows_size measured (rows[0..nrows) from it). */
size_t gcoll_idx_rows_write(const uint32_t *rows, size_t nrows, size_t nnz, uint32_t dim,
                            uint8_t *out);
/* Validates an index section starting at p with avail bytes: every index < count,
 * strictly ascending if sorted. On success *used receives its length in bytes. */
gcoll_status_t gcoll_idx_check(const uint8_t *p, size_t avail, unsigned flags, uint64_t nnz,
                               uint64_t count, size_t *used);
/* Reads nnz indices of an already checked section. */
void gcoll_idx_read(const uint8_t *p, unsigned flags, uint64_t nnz, uint32_t *idx);

/* Iterates indices of a checked section in blocks of up to GCOLL_WIRE_IDX_BLOCK, so that
 * decoders need no nnz-sized scratch. */
typedef struct {
    const uint8_t *p;
    unsigned flags;
    uint64_t left;
    uint64_t prev_plus1; /* last index + 1 (delta coding; of the rows when row-coded) */
    /* row coding: the row indices' delta blocks are read into rbuf a block at a time */
    uint32_t dim, last_len;
    uint64_t rows_left; /* rows not read into rbuf yet */
    size_t rn, rpos;    /* rows in rbuf, the current one */
    uint32_t in_row;    /* elements of the current row already returned */
    uint32_t rbuf[GCOLL_WIRE_IDX_BLOCK];
} gcoll_idx_iter_t;
void gcoll_idx_iter_init(gcoll_idx_iter_t *it, const uint8_t *p, unsigned flags, uint64_t nnz);
/* Fills up to GCOLL_WIRE_IDX_BLOCK indices, returns how many (0 at the end). */
size_t gcoll_idx_iter_next(gcoll_idx_iter_t *it, uint32_t *idx);

#endif /* GCOLL_COMPRESS_WIRE_H */
