/* fuzz_wire.c: libFuzzer target for the codec wire format's header and index sections
 * (lib/compress/wire.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compress/wire.h"

/*
 * Input: flags byte, count (u32), nnz (u16), then bytes read two ways: as a message
 * whose header gcoll_wire_parse_hdr checks, and as an index section gcoll_idx_check
 * checks (bit 3 of the flags byte: row-coded). What the checks accept must read back
 * (whole and block by block, the same indices, each < count, ascending when sorted), and
 * re-encode to what was read (row-coded: whole rows, the same size and fixed fields).
 */
#define MAX_NNZ 4096

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 7)
        return 0;
    unsigned flags = data[0] & (GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_DELTA);
    if (data[0] & GCOLL_WIRE_F_ROWS) /* row-coded: sorted, its rows delta-coded inside */
        flags = GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_ROWS;
    uint64_t count = get32(data + 1);
    uint64_t nnz = (uint64_t)(data[5] | data[6] << 8) % (MAX_NNZ + 1);
    size_t len = size - 7;
    /* exact-size heap copy: ASan sees any read past the end */
    uint8_t *m = malloc(len ? len : 1);
    memcpy(m, data + 7, len);

    gcoll_wire_hdr_t h;
    if (gcoll_wire_parse_hdr(m, len, (data[0] & 0x80) ? SIZE_MAX : (size_t)count, &h) == GCOLL_OK) {
        if (h.payload_len != len - GCOLL_WIRE_HDR || h.count > GCOLL_WIRE_MAX_COUNT ||
            (h.flags & ~GCOLL_WIRE_F_ALL) != 0)
            abort();
        /* every header bit is meaningful or checked to be zero: it writes back the same */
        uint8_t again[GCOLL_WIRE_HDR];
        gcoll_wire_put_hdr(again, &h);
        if (memcmp(again, m, GCOLL_WIRE_HDR) != 0)
            abort();
    }

    size_t used = 0;
    if (gcoll_idx_check(m, len, flags, nnz, count, &used) == GCOLL_OK) {
        if (used > len)
            abort();
        uint32_t *idx = malloc((nnz + 1) * sizeof(uint32_t));
        uint32_t blk[GCOLL_WIRE_IDX_BLOCK];
        gcoll_idx_read(m, flags, nnz, idx);
        gcoll_idx_iter_t it;
        gcoll_idx_iter_init(&it, m, flags, nnz);
        size_t got = 0, k;
        while ((k = gcoll_idx_iter_next(&it, blk)) > 0) {
            if (k > GCOLL_WIRE_IDX_BLOCK || got + k > nnz || memcmp(blk, idx + got, k * 4) != 0)
                abort();
            got += k;
        }
        if (got != nnz)
            abort();
        for (size_t j = 0; j < nnz; j++)
            if (idx[j] >= count || ((flags & GCOLL_WIRE_F_SORTED) && j && idx[j] <= idx[j - 1]))
                abort();
        if (flags & GCOLL_WIRE_F_DELTA) {
            /* delta coding implies sorted indices: they re-encode to an equivalent section */
            size_t n2 = gcoll_idx_delta_size(idx, nnz);
            uint8_t *e = malloc(n2 ? n2 : 1);
            if (gcoll_idx_delta_write(idx, nnz, e) != n2)
                abort();
            size_t used2 = 0;
            uint32_t *idx2 = malloc((nnz + 1) * sizeof(uint32_t));
            if (gcoll_idx_check(e, n2, flags, nnz, count, &used2) != GCOLL_OK || used2 != n2)
                abort();
            gcoll_idx_read(e, flags, nnz, idx2);
            if (memcmp(idx, idx2, nnz * 4) != 0)
                abort();
            free(idx2);
            free(e);
        }
        if (flags & GCOLL_WIRE_F_ROWS) {
            /* whole rows of the section's dim: they re-encode to an equivalent section,
             * the same fixed fields, no longer (the reader accepts wider blocks than the
             * writer's narrowest) */
            uint32_t dim = get32(m);
            uint32_t *rows = malloc((nnz / dim + 1) * sizeof(uint32_t));
            size_t nrows = 0, n2 = gcoll_idx_rows_size(idx, nnz, count, dim, rows, &nrows);
            if (n2 == 0 || n2 > used)
                abort();
            uint8_t *e = malloc(n2);
            if (gcoll_idx_rows_write(rows, nrows, nnz, dim, e) != n2 || memcmp(e, m, 12) != 0)
                abort();
            uint32_t *idx2 = malloc((nnz + 1) * sizeof(uint32_t));
            size_t used2 = 0;
            if (gcoll_idx_check(e, n2, flags, nnz, count, &used2) != GCOLL_OK || used2 != n2)
                abort();
            gcoll_idx_read(e, flags, nnz, idx2);
            if (memcmp(idx, idx2, nnz * 4) != 0)
                abort();
            free(idx2);
            free(e);
            free(rows);
        }
        free(idx);
    }
    free(m);
    return 0;
}
