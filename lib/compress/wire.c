/* wire.c: codec message header, value-section sizes and the index section codec. */
#include "compress/wire.h"

#include <string.h>

void gcoll_wire_put_hdr(uint8_t *p, const gcoll_wire_hdr_t *h)
{
    uint64_t param = (uint64_t)(h->vs.fmt & 0xff) | ((uint64_t)(h->vs.bits & 0xff) << 8) |
                     ((uint64_t)h->vs.bucket << 32);
    gcoll_put_u32(p, GCOLL_WIRE_MAGIC);
    p[4] = GCOLL_WIRE_VERSION;
    p[5] = (uint8_t)h->codec;
    gcoll_put_u16(p + 6, (uint16_t)h->flags);
    gcoll_put_u64(p + 8, h->count);
    gcoll_put_u64(p + 16, h->nnz);
    gcoll_put_u64(p + 24, h->payload_len);
    gcoll_put_u64(p + 32, param);
    gcoll_put_u64(p + 40, h->key);
}

uint64_t gcoll_vsec_buckets(const gcoll_vspec_t *vs, uint64_t n)
{
    switch (vs->fmt) {
    case GCOLL_VF_Q8:
    case GCOLL_VF_QSGD:
    case GCOLL_VF_SIGN:
        if (n == 0)
            return 0;
        return vs->bucket == 0 ? 1 : (n + vs->bucket - 1) / vs->bucket;
    case GCOLL_VF_FP8: /* one scale per message */
        return n ? 1 : 0;
    case GCOLL_VF_MXFP8:
    case GCOLL_VF_MXFP4:
        return (n + GCOLL_MX_BLOCK - 1) / GCOLL_MX_BLOCK;
    default:
        return 0;
    }
}

size_t gcoll_vsec_size(const gcoll_vspec_t *vs, uint64_t n)
{
    /* n <= 2^32 - 1 on every path that reaches here, so nothing below overflows 64 bits;
     * the SIZE_MAX checks keep 32-bit hosts honest. */
    if (n > GCOLL_WIRE_MAX_COUNT)
        return SIZE_MAX;
    uint64_t nb = gcoll_vsec_buckets(vs, n), sz;
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        sz = 4 * n;
        break;
    case GCOLL_VF_F16:
    case GCOLL_VF_BF16:
        sz = 2 * n;
        break;
    case GCOLL_VF_Q8:
        sz = 4 * nb + n;
        break;
    case GCOLL_VF_QSGD:
        if (vs->bits < 2 || vs->bits > 8)
            return SIZE_MAX;
        sz = 4 * nb + (n * vs->bits + 7) / 8;
        break;
    case GCOLL_VF_SIGN:
        sz = 4 * nb + (n + 7) / 8;
        break;
    case GCOLL_VF_FP8:
        sz = 4 * nb + n;
        break;
    case GCOLL_VF_MXFP8: /* one E8M0 byte per block: 8.25 bits a value */
        sz = nb + n;
        break;
    case GCOLL_VF_MXFP4: /* 4.25 bits a value */
        sz = nb + (n + 1) / 2;
        break;
    case GCOLL_VF_VQ: /* the codebook, then B bits per vector of `bucket` values */
        if (vs->bits < 1 || vs->bits > 8 || vs->bucket < 1 || vs->bucket > 64)
            return SIZE_MAX;
        sz = n ? ((uint64_t)4 << vs->bits) * vs->bucket +
                     ((n + vs->bucket - 1) / vs->bucket * vs->bits + 7) / 8
               : 0;
        break;
    default:
        return SIZE_MAX;
    }
    return sz > SIZE_MAX - GCOLL_WIRE_HDR ? SIZE_MAX : (size_t)sz;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        GCOLL_WARN("compress: malformed message: " __VA_ARGS__);                                   \
        return GCOLL_ERR_INVALID;                                                                  \
    } while (0)

static gcoll_status_t check_vspec(const gcoll_vspec_t *vs)
{
    switch (vs->fmt) {
    case GCOLL_VF_F32:
    case GCOLL_VF_F16:
    case GCOLL_VF_BF16:
        if (vs->bits != 0 || vs->bucket != 0)
            BAD("value format %d takes no bits/bucket (got %u/%u)", (int)vs->fmt, vs->bits,
                vs->bucket);
        break;
    case GCOLL_VF_Q8:
        if (vs->bits != 0 || vs->bucket == 0)
            BAD("q8 needs bits 0 and a bucket > 0 (got %u/%u)", vs->bits, vs->bucket);
        break;
    case GCOLL_VF_QSGD:
        if (vs->bits < 2 || vs->bits > 8 || vs->bucket == 0)
            BAD("qsgd needs bits in 2..8 and a bucket > 0 (got %u/%u)", vs->bits, vs->bucket);
        break;
    case GCOLL_VF_SIGN:
        if (vs->bits != 0 || vs->bucket % 8 != 0)
            BAD("sign needs bits 0 and a chunk that is a multiple of 8 (got %u/%u)", vs->bits,
                vs->bucket);
        break;
    case GCOLL_VF_FP8:
        if ((vs->bits != GCOLL_FP8_E4M3 && vs->bits != GCOLL_FP8_E5M2) || vs->bucket != 0)
            BAD("fp8 needs element format 1 or 2 and bucket 0 (got %u/%u)", vs->bits, vs->bucket);
        break;
    case GCOLL_VF_MXFP8:
        if ((vs->bits != GCOLL_FP8_E4M3 && vs->bits != GCOLL_FP8_E5M2) ||
            vs->bucket != GCOLL_MX_BLOCK)
            BAD("mxfp8 needs element format 1 or 2 and blocks of %d (got %u/%u)", GCOLL_MX_BLOCK,
                vs->bits, vs->bucket);
        break;
    case GCOLL_VF_VQ:
        if (vs->bits < 1 || vs->bits > 8 || vs->bucket < 1 || vs->bucket > 64)
            BAD("vq needs bits 1..8 and dim 1..64 (got %u/%u)", vs->bits, vs->bucket);
        break;
    case GCOLL_VF_MXFP4:
        if (vs->bits != GCOLL_FP8_E2M1 || vs->bucket != GCOLL_MX_BLOCK)
            BAD("mxfp4 needs element format 3 and blocks of %d (got %u/%u)", GCOLL_MX_BLOCK,
                vs->bits, vs->bucket);
        break;
    default:
        BAD("unknown value format %d", (int)vs->fmt);
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_wire_parse_hdr(const void *in, size_t len, size_t count, gcoll_wire_hdr_t *h)
{
    const uint8_t *p = in;
    if (p == NULL || len < GCOLL_WIRE_HDR)
        BAD("%zu bytes is shorter than the %d-byte header", len, GCOLL_WIRE_HDR);
    uint32_t magic = gcoll_get_u32(p);
    if (magic != GCOLL_WIRE_MAGIC)
        BAD("bad magic 0x%08x", magic);
    if (p[4] != GCOLL_WIRE_VERSION)
        BAD("unsupported version %u (this library reads %d)", p[4], GCOLL_WIRE_VERSION);
    h->codec = p[5];
    h->flags = gcoll_get_u16(p + 6);
    h->count = gcoll_get_u64(p + 8);
    h->nnz = gcoll_get_u64(p + 16);
    h->payload_len = gcoll_get_u64(p + 24);
    uint64_t param = gcoll_get_u64(p + 32);
    h->key = gcoll_get_u64(p + 40);
    h->vs.fmt = (gcoll_vfmt_t)(param & 0xff);
    h->vs.bits = (unsigned)((param >> 8) & 0xff);
    h->vs.bucket = (uint32_t)(param >> 32);
    h->vs.sign_l2 = 0;
    if ((param >> 16) & 0xffff)
        BAD("reserved parameter bits set (0x%016llx)", (unsigned long long)param);
    if (h->flags & ~GCOLL_WIRE_F_ALL)
        BAD("unknown flags 0x%x", h->flags);
    if (h->count > GCOLL_WIRE_MAX_COUNT)
        BAD("absurd element count %llu", (unsigned long long)h->count);
    if (count != SIZE_MAX && h->count != (uint64_t)count)
        BAD("element count %llu, expected %zu", (unsigned long long)h->count, count);
    if (h->nnz > h->count)
        BAD("nnz %llu exceeds count %llu", (unsigned long long)h->nnz,
            (unsigned long long)h->count);
    if (h->payload_len != (uint64_t)(len - GCOLL_WIRE_HDR))
        BAD("payload length %llu but %zu bytes follow the header",
            (unsigned long long)h->payload_len, len - GCOLL_WIRE_HDR);
    GCOLL_CHECK(check_vspec(&h->vs));
    switch (h->codec) {
    case GCOLL_WIRE_DENSE:
        if (h->flags != 0 || h->nnz != h->count || h->key != 0)
            BAD("dense message with flags 0x%x, nnz %llu, key set %d", h->flags,
                (unsigned long long)h->nnz, h->key != 0);
        break;
    case GCOLL_WIRE_SPARSE:
        if (h->key != 0)
            BAD("sparse message carries a random-k key");
        if (h->flags & GCOLL_WIRE_F_DENSE) {
            if (h->flags != GCOLL_WIRE_F_DENSE || h->nnz != h->count)
                BAD("dense-fallback message with flags 0x%x, nnz %llu of %llu", h->flags,
                    (unsigned long long)h->nnz, (unsigned long long)h->count);
        } else if (!(h->flags & GCOLL_WIRE_F_SORTED)) {
            /* every encoder writes strictly ascending indices, and decoders that return
             * pairs promise them ascending: an unsorted message is malformed (a fuzzer
             * found one decoding to duplicate pairs) */
            BAD("sparse message without sorted indices (flags 0x%x)", h->flags);
        } else if ((h->flags & GCOLL_WIRE_F_ROWS) && (h->flags & GCOLL_WIRE_F_DELTA)) {
            BAD("row-coded sparse message with the delta flag (flags 0x%x)", h->flags);
        }
        break;
    case GCOLL_WIRE_RANDOMK:
        if (h->flags != 0)
            BAD("random-k message with flags 0x%x", h->flags);
        break;
    default:
        BAD("unknown codec id %u", h->codec);
    }
    return GCOLL_OK;
}

/* --- index section ------------------------------------------------------------------ */

static unsigned bit_width(uint32_t v)
{
    return v ? 32u - (unsigned)__builtin_clz(v) : 0u;
}

static unsigned block_width(const uint32_t *idx, size_t start, size_t m)
{
    uint32_t orv = 0;
    uint32_t prev1 = start ? idx[start - 1] + 1u : 0u;
    for (size_t i = 0; i < m; i++) {
        orv |= idx[start + i] - prev1;
        prev1 = idx[start + i] + 1u;
    }
    return bit_width(orv);
}

size_t gcoll_idx_delta_size(const uint32_t *idx, size_t nnz)
{
    size_t total = 0;
    for (size_t s = 0; s < nnz; s += GCOLL_WIRE_IDX_BLOCK) {
        size_t m = GCOLL_MIN(nnz - s, (size_t)GCOLL_WIRE_IDX_BLOCK);
        unsigned w = block_width(idx, s, m);
        total += 1 + (m * w + 7) / 8;
    }
    return total;
}

size_t gcoll_idx_delta_write(const uint32_t *idx, size_t nnz, uint8_t *out)
{
    uint8_t *p = out;
    for (size_t s = 0; s < nnz; s += GCOLL_WIRE_IDX_BLOCK) {
        size_t m = GCOLL_MIN(nnz - s, (size_t)GCOLL_WIRE_IDX_BLOCK);
        unsigned w = block_width(idx, s, m);
        *p++ = (uint8_t)w;
        uint64_t acc = 0;
        unsigned nbits = 0;
        uint32_t prev1 = s ? idx[s - 1] + 1u : 0u;
        for (size_t i = 0; i < m; i++) {
            acc |= (uint64_t)(idx[s + i] - prev1) << nbits;
            prev1 = idx[s + i] + 1u;
            nbits += w;
            while (nbits >= 8) {
                *p++ = (uint8_t)acc;
                acc >>= 8;
                nbits -= 8;
            }
        }
        if (nbits)
            *p++ = (uint8_t)acc;
    }
    return (size_t)(p - out);
}

/* Unpacks m gaps of width w from p (exactly ceil(m*w/8) bytes). */
static void unpack_gaps(const uint8_t *p, unsigned w, size_t m, uint32_t *gap)
{
    if (w == 0) {
        memset(gap, 0, m * sizeof(*gap));
        return;
    }
    uint64_t acc = 0, mask = (w == 32) ? 0xffffffffull : ((1ull << w) - 1);
    unsigned nbits = 0;
    for (size_t i = 0; i < m; i++) {
        while (nbits < w) {
            acc |= (uint64_t)*p++ << nbits;
            nbits += 8;
        }
        gap[i] = (uint32_t)(acc & mask);
        acc >>= w;
        nbits -= w;
    }
}

static gcoll_status_t rows_check(const uint8_t *p, size_t avail, uint64_t nnz, uint64_t count,
                                 size_t *used);

gcoll_status_t gcoll_idx_check(const uint8_t *p, size_t avail, unsigned flags, uint64_t nnz,
                               uint64_t count, size_t *used)
{
    if (flags & GCOLL_WIRE_F_ROWS)
        return rows_check(p, avail, nnz, count, used);
    if (!(flags & GCOLL_WIRE_F_DELTA)) {
        if (nnz > avail / 4)
            BAD("%llu indices do not fit in %zu bytes", (unsigned long long)nnz, avail);
        /* branch-free flags per block of 256 (a loop the compiler vectorizes); the
         * element loop below runs only to name the first offender */
        const int sorted = (flags & GCOLL_WIRE_F_SORTED) != 0;
        uint64_t i = 0;
        for (; i < nnz; i += 256) {
            size_t m = (size_t)GCOLL_MIN(nnz - i, (uint64_t)256);
            const uint8_t *q = p + 4 * i;
            uint32_t bad = 0;
            for (size_t j = 0; j < m; j++)
                bad |= (uint64_t)gcoll_get_u32(q + 4 * j) >= count;
            if (sorted) {
                if (i > 0)
                    bad |= gcoll_get_u32(q) <= gcoll_get_u32(q - 4);
                for (size_t j = 1; j < m; j++)
                    bad |= gcoll_get_u32(q + 4 * j) <= gcoll_get_u32(q + 4 * j - 4);
            }
            if (bad)
                break;
        }
        uint64_t prev = i > 0 && i < nnz ? gcoll_get_u32(p + 4 * i - 4) : 0;
        for (; i < nnz; i++) {
            uint32_t v = gcoll_get_u32(p + 4 * i);
            if (v >= count)
                BAD("index %u at position %llu out of range (count %llu)", v, (unsigned long long)i,
                    (unsigned long long)count);
            if (sorted && i > 0 && v <= prev)
                BAD("index %u at position %llu %s", v, (unsigned long long)i,
                    v == prev ? "duplicated" : "out of order");
            prev = v;
        }
        *used = (size_t)(4 * nnz);
        return GCOLL_OK;
    }
    size_t off = 0;
    uint64_t next = 0; /* smallest index the next entry may take */
    uint32_t gap[GCOLL_WIRE_IDX_BLOCK];
    for (uint64_t s = 0; s < nnz; s += GCOLL_WIRE_IDX_BLOCK) {
        size_t m = (size_t)GCOLL_MIN(nnz - s, (uint64_t)GCOLL_WIRE_IDX_BLOCK);
        if (off >= avail)
            BAD("index section truncated at block %llu", (unsigned long long)(s / 128));
        unsigned w = p[off++];
        if (w > 32)
            BAD("index block %llu has width %u > 32", (unsigned long long)(s / 128), w);
        size_t bytes = (m * w + 7) / 8;
        if (bytes > avail - off)
            BAD("index block %llu truncated", (unsigned long long)(s / 128));
        unpack_gaps(p + off, w, m, gap);
        off += bytes;
        /* indices rise within the block, so its last one, next + sum(gaps) + m - 1, is
         * its largest: only a block that ends out of range is walked */
        uint64_t sum = 0;
        for (size_t i = 0; i < m; i++)
            sum += gap[i];
        if (next + sum + m - 1 < count) {
            next += sum + m;
            continue;
        }
        for (size_t i = 0; i < m; i++) {
            uint64_t v = next + gap[i];
            if (v >= count)
                BAD("index %llu at position %llu out of range (count %llu)", (unsigned long long)v,
                    (unsigned long long)(s + i), (unsigned long long)count);
            next = v + 1;
        }
    }
    *used = off;
    return GCOLL_OK;
}

/* Reads the next delta block of up to 128 indices at *pp (a checked section). */
static size_t delta_block(const uint8_t **pp, uint64_t *left, uint64_t *prev_plus1, uint32_t *idx)
{
    size_t m = (size_t)GCOLL_MIN(*left, (uint64_t)GCOLL_WIRE_IDX_BLOCK);
    if (m == 0)
        return 0;
    unsigned w = *(*pp)++;
    unpack_gaps(*pp, w, m, idx);
    *pp += (m * w + 7) / 8;
    uint64_t next = *prev_plus1;
    for (size_t i = 0; i < m; i++) {
        next += idx[i];
        idx[i] = (uint32_t)next;
        next++;
    }
    *prev_plus1 = next;
    *left -= m;
    return m;
}

/* The row-coded section (wire.h): its fixed fields, the row indices' delta blocks (rows
 * ascending and below ceil(count / dim)), and the last row's length against count. count
 * may be a bound below the tensor's (a segment's end): a row then must end below it, and
 * only a row ending exactly at count may be short. */
static gcoll_status_t rows_check(const uint8_t *p, size_t avail, uint64_t nnz, uint64_t count,
                                 size_t *used)
{
    if (avail < 12)
        BAD("row-coded index section truncated (%zu bytes)", avail);
    uint32_t dim = gcoll_get_u32(p), nrows = gcoll_get_u32(p + 4), last = gcoll_get_u32(p + 8);
    if (dim == 0 || nrows == 0 || (uint64_t)nrows > nnz || last == 0 || last > dim)
        BAD("row-coded index section with dim %u, %u rows, last row %u values for %llu", dim, nrows,
            last, (unsigned long long)nnz);
    if ((uint64_t)(nrows - 1) * dim + last != nnz)
        BAD("%u rows of %u values (the last %u) are not %llu values", nrows, dim, last,
            (unsigned long long)nnz);
    size_t rused;
    GCOLL_CHECK(gcoll_idx_check(p + 12, avail - 12, GCOLL_WIRE_F_SORTED | GCOLL_WIRE_F_DELTA, nrows,
                                (count + dim - 1) / dim, &rused));
    const uint8_t *q = p + 12;
    uint64_t left = nrows, prev1 = 0;
    uint32_t rb[GCOLL_WIRE_IDX_BLOCK];
    size_t m = 0;
    while (left)
        m = delta_block(&q, &left, &prev1, rb);
    uint64_t end = (uint64_t)rb[m - 1] * dim + last;
    if (end > count || (last < dim && end != count))
        BAD("row %u of %u values ends at %llu (count %llu)", rb[m - 1], last,
            (unsigned long long)end, (unsigned long long)count);
    *used = 12 + rused;
    return GCOLL_OK;
}

size_t gcoll_idx_rows_size(const uint32_t *idx, size_t nnz, uint64_t count, uint32_t dim,
                           uint32_t *rows, size_t *nrows_p)
{
    if (!nnz || !dim)
        return 0;
    size_t j = 0, nr = 0;
    while (j < nnz) { /* ascending indices: a row's first and last place it whole */
        uint32_t r = idx[j] / dim;
        uint64_t base = (uint64_t)r * dim;
        uint64_t len = GCOLL_MIN((uint64_t)dim, count - base);
        if (idx[j] != base || len > nnz - j || idx[j + len - 1] != base + len - 1)
            return 0;
        rows[nr++] = r;
        j += (size_t)len;
    }
    *nrows_p = nr;
    return 12 + gcoll_idx_delta_size(rows, nr);
}

size_t gcoll_idx_rows_write(const uint32_t *rows, size_t nrows, size_t nnz, uint32_t dim,
                            uint8_t *out)
{
    gcoll_put_u32(out, dim);
    gcoll_put_u32(out + 4, (uint32_t)nrows);
    gcoll_put_u32(out + 8, (uint32_t)(nnz - (nrows - 1) * dim));
    return 12 + gcoll_idx_delta_write(rows, nrows, out + 12);
}

void gcoll_idx_iter_init(gcoll_idx_iter_t *it, const uint8_t *p, unsigned flags, uint64_t nnz)
{
    it->p = p;
    it->flags = flags;
    it->left = nnz;
    it->prev_plus1 = 0;
    it->rn = it->rpos = 0;
    it->in_row = 0;
    it->dim = it->last_len = 0;
    it->rows_left = 0;
    if ((flags & GCOLL_WIRE_F_ROWS) && nnz) {
        it->dim = gcoll_get_u32(p);
        it->rows_left = gcoll_get_u32(p + 4);
        it->last_len = gcoll_get_u32(p + 8);
        it->p = p + 12;
    }
}

/* Row-coded: expands the rows into element indices, up to 128 a call. */
static size_t rows_next(gcoll_idx_iter_t *it, uint32_t *idx)
{
    size_t m = 0;
    while (m < GCOLL_WIRE_IDX_BLOCK && it->left > 0) {
        if (it->rpos == it->rn) {
            it->rn = delta_block(&it->p, &it->rows_left, &it->prev_plus1, it->rbuf);
            it->rpos = 0;
            if (it->rn == 0)
                break; /* not on a checked section */
        }
        uint32_t len = it->rows_left == 0 && it->rpos + 1 == it->rn ? it->last_len : it->dim;
        uint64_t base = (uint64_t)it->rbuf[it->rpos] * it->dim + it->in_row;
        size_t take = (size_t)GCOLL_MIN(
            GCOLL_MIN((uint64_t)(len - it->in_row), (uint64_t)(GCOLL_WIRE_IDX_BLOCK - m)),
            it->left);
        for (size_t i = 0; i < take; i++)
            idx[m + i] = (uint32_t)(base + i);
        m += take;
        it->left -= take;
        it->in_row += (uint32_t)take;
        if (it->in_row == len) {
            it->in_row = 0;
            it->rpos++;
        }
    }
    return m;
}

size_t gcoll_idx_iter_next(gcoll_idx_iter_t *it, uint32_t *idx)
{
    if (it->flags & GCOLL_WIRE_F_ROWS)
        return rows_next(it, idx);
    if (it->flags & GCOLL_WIRE_F_DELTA)
        return delta_block(&it->p, &it->left, &it->prev_plus1, idx);
    size_t m = (size_t)GCOLL_MIN(it->left, (uint64_t)GCOLL_WIRE_IDX_BLOCK);
    for (size_t i = 0; i < m; i++)
        idx[i] = gcoll_get_u32(it->p + 4 * i);
    it->p += 4 * m;
    it->left -= m;
    return m;
}

void gcoll_idx_read(const uint8_t *p, unsigned flags, uint64_t nnz, uint32_t *idx)
{
    gcoll_idx_iter_t it;
    gcoll_idx_iter_init(&it, p, flags, nnz);
    size_t got;
    while ((got = gcoll_idx_iter_next(&it, idx)) > 0)
        idx += got;
}
