/* test_state_io.c: checkpoints of tensor states (gcoll_state_save/load): a round trip restores
 * every buffer and nested state (vq's codebook included, so that a restored vq state encodes
 * bit for bit like the uninterrupted one), a version-1 checkpoint still loads, and a
 * malformed, truncated or foreign checkpoint is refused with the state left as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "compress/compress.h"

#define N 777
#define NPART 300
#define NSRV 200

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)(seed >> 40) / 16777216.0f - 0.5f;
    }
}

static gcoll_compressor_t *mk(const char *spec)
{
    gcoll_compressor_t *c = NULL;
    if (gcoll_compressor_create(spec, &c) != GCOLL_OK)
        fail_msg("spec '%s' rejected", spec);
    return c;
}

/* Bytes of vq's codebook for c (2^bits vectors of dim floats), 0 for other codecs. */
static size_t book_bytes(const gcoll_compressor_t *c)
{
    return c->vs.fmt == GCOLL_VF_VQ ? ((size_t)1 << c->vs.bits) * c->vs.bucket * sizeof(float) : 0;
}

/* A warm codebook in s if its codec is vq (its values need not be a learned one's). */
static void fill_book(gcoll_tensor_state_t *s, uint64_t seed)
{
    size_t nb = book_bytes(s->c);
    if (!nb)
        return;
    s->vq_book = malloc(nb);
    assert_non_null(s->vq_book);
    fill(s->vq_book, nb / sizeof(float), seed);
}

/* A state with every part a checkpoint carries: residual, (DGC) velocity, a step, a server
 * state, and a hierarchical part with its own server state. */
static gcoll_tensor_state_t *full_state(gcoll_compressor_t *c, uint64_t seed)
{
    gcoll_tensor_state_t *s = NULL;
    assert_int_equal(gcoll_state_create(c, N, &s), GCOLL_OK);
    s->step = 41 + seed;
    if (s->e)
        fill(s->e, N, seed + 1);
    if (s->u)
        fill(s->u, N, seed + 2);
    fill_book(s, seed + 7);
    assert_int_equal(gcoll_state_create_mode(c, NSRV, GCOLL_STATE_SERVER, &s->server), GCOLL_OK);
    if (s->server->e)
        fill(s->server->e, NSRV, seed + 3);
    fill_book(s->server, seed + 8);
    assert_int_equal(gcoll_state_create_mode(c, NPART, s->mode, &s->hier_part), GCOLL_OK);
    s->hier_part->step = 40 + seed;
    if (s->hier_part->e)
        fill(s->hier_part->e, NPART, seed + 4);
    if (s->hier_part->u)
        fill(s->hier_part->u, NPART, seed + 5);
    assert_int_equal(
        gcoll_state_create_mode(c, NSRV / 2, GCOLL_STATE_SERVER, &s->hier_part->server), GCOLL_OK);
    if (s->hier_part->server->e)
        fill(s->hier_part->server->e, NSRV / 2, seed + 6);
    fill_book(s->hier_part->server, seed + 9); /* the part itself stays cold */
    return s;
}

static void same_state(const gcoll_tensor_state_t *a, const gcoll_tensor_state_t *b)
{
    if (!a || !b) {
        assert_true(!a && !b);
        return;
    }
    assert_int_equal(a->count, b->count);
    assert_int_equal(a->step, b->step);
    assert_int_equal(!!a->e, !!b->e);
    assert_int_equal(!!a->u, !!b->u);
    if (a->e)
        assert_memory_equal(a->e, b->e, a->count * sizeof(float));
    if (a->u)
        assert_memory_equal(a->u, b->u, a->count * sizeof(float));
    assert_int_equal(!!a->vq_book, !!b->vq_book);
    if (a->vq_book)
        assert_memory_equal(a->vq_book, b->vq_book, book_bytes(a->c));
    same_state(a->server, b->server);
    same_state(a->hier_part, b->hier_part);
}

static void *save(const gcoll_tensor_state_t *s, size_t *len)
{
    assert_int_equal(gcoll_state_save(s, NULL, 0, len), GCOLL_OK);
    void *buf = malloc(*len);
    assert_non_null(buf);
    assert_int_equal(gcoll_state_save(s, buf, *len, len), GCOLL_OK);
    return buf;
}

static void round_trip(const char *spec)
{
    gcoll_compressor_t *c = mk(spec);
    gcoll_tensor_state_t *a = full_state(c, 1), *b = NULL;
    assert_int_equal(gcoll_state_create(c, N, &b), GCOLL_OK);
    size_t len;
    void *buf = save(a, &len);
    assert_int_equal(gcoll_state_load(b, buf, len), GCOLL_OK);
    same_state(a, b);
    /* a loaded state saves to the same bytes */
    size_t len2;
    void *buf2 = save(b, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    /* a checkpoint without nested states removes them from the state it is loaded into */
    gcoll_tensor_state_t *plain = NULL;
    assert_int_equal(gcoll_state_create(c, N, &plain), GCOLL_OK);
    free(buf2);
    buf2 = save(plain, &len2);
    assert_int_equal(gcoll_state_load(b, buf2, len2), GCOLL_OK);
    assert_null(b->server);
    assert_null(b->hier_part);
    same_state(plain, b);
    free(buf);
    free(buf2);
    gcoll_state_destroy(plain);
    gcoll_state_destroy(a);
    gcoll_state_destroy(b);
    gcoll_compressor_destroy(c);
}

static void test_round_trip_topk(void **st)
{
    (void)st;
    round_trip("topk:density=0.1");
}

static void test_round_trip_dgc(void **st)
{
    (void)st;
    round_trip("dgc:density=0.1");
}

static void test_round_trip_q8(void **st)
{
    (void)st;
    round_trip("q8");
}

/* Every truncation and every single flipped byte of the header and flags is refused, or, if a
 * flipped byte only changes a value, loaded whole; never a crash, and a refused load leaves the
 * state exactly as it was. */
static void test_malformed(void **st)
{
    (void)st;
    gcoll_compressor_t *c = mk("dgc:density=0.1");
    gcoll_tensor_state_t *a = full_state(c, 2), *b = full_state(c, 9), *ref = full_state(c, 9);
    size_t len;
    uint8_t *buf = save(a, &len);
    for (size_t cut = 0; cut < len; cut++) {
        assert_int_not_equal(gcoll_state_load(b, buf, cut), GCOLL_OK);
        same_state(ref, b);
    }
    uint8_t *more = malloc(len + 1);
    memcpy(more, buf, len);
    more[len] = 0;
    assert_int_equal(gcoll_state_load(b, more, len + 1), GCOLL_ERR_INVALID);
    same_state(ref, b);
    /* the headers and flags of the three bodies: the first 64 bytes and each nested header */
    uint8_t *bad = malloc(len);
    for (size_t i = 0; i < len; i++) {
        if (i >= 64 && i % 97 != 0)
            continue;
        for (int bit = 0; bit < 8; bit++) {
            memcpy(bad, buf, len);
            bad[i] ^= (uint8_t)(1u << bit);
            gcoll_tensor_state_t *t = full_state(c, 9);
            if (gcoll_state_load(t, bad, len) != GCOLL_OK)
                same_state(ref, t);
            gcoll_state_destroy(t);
        }
    }
    free(bad);
    free(more);
    free(buf);
    gcoll_state_destroy(a);
    gcoll_state_destroy(b);
    gcoll_state_destroy(ref);
    gcoll_compressor_destroy(c);
}

static void test_foreign(void **st)
{
    (void)st;
    gcoll_compressor_t *c = mk("topk:density=0.1"), *other = mk("topk:density=0.2");
    gcoll_tensor_state_t *a = full_state(c, 3), *b = NULL, *small = NULL;
    assert_int_equal(gcoll_state_create(other, N, &b), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N - 1, &small), GCOLL_OK);
    size_t len;
    void *buf = save(a, &len);
    assert_int_equal(gcoll_state_load(b, buf, len), GCOLL_ERR_MISMATCH);
    assert_int_equal(gcoll_state_load(small, buf, len), GCOLL_ERR_MISMATCH);
    assert_null(small->hier_part);
    assert_int_equal(gcoll_state_load(NULL, buf, len), GCOLL_ERR_INVALID);
    assert_int_equal(gcoll_state_save(a, buf, len - 1, &len), GCOLL_ERR_INVALID);
    free(buf);
    gcoll_state_destroy(a);
    gcoll_state_destroy(b);
    gcoll_state_destroy(small);
    gcoll_compressor_destroy(c);
    gcoll_compressor_destroy(other);
}

static void test_round_trip_vq(void **st)
{
    (void)st;
    round_trip("vq:dim=4,bits=4");
}

/* Encodes x into a fresh buffer with s; returns it, its length in *len. */
static uint8_t *enc(gcoll_compressor_t *c, gcoll_tensor_state_t *s, const float *x, size_t *len)
{
    size_t cap = gcoll_compressor_bound(c, N);
    uint8_t *o = malloc(cap);
    assert_non_null(o);
    assert_int_equal(gcoll_encode(c, s, x, N, o, cap, len), GCOLL_OK);
    return o;
}

/* The layout of a plain vq state's checkpoint (no nested states): the header, the body's
 * fixed fields, e, then the codebook section (u32 count, floats) at the end. */
#define HDR(c) (12 + strlen(gcoll_compressor_spec(c)))
#define FLAGS_AT(c) (HDR(c) + 16)
#define BOOK_AT(c) (HDR(c) + 32 + N * sizeof(float))

/* vq with error feedback: 3 warm steps, save, load into a fresh state; the next 3 encodes
 * are bit-identical to the uninterrupted state's (the same operation sequence). The same
 * checkpoint without its codebook (the version-1 form, which still loads) starts cold and
 * encodes differently: the codebook is what carries the warm start. */
static void test_vq_continues(void **st)
{
    (void)st;
    gcoll_compressor_t *c = mk("vq:dim=4,bits=4");
    gcoll_tensor_state_t *a = NULL, *b = NULL, *cold = NULL;
    assert_int_equal(gcoll_state_create(c, N, &a), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N, &b), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N, &cold), GCOLL_OK);
    float x[N];
    size_t len, la, lb;
    for (uint64_t t = 0; t < 3; t++) {
        fill(x, N, 100 + t);
        free(enc(c, a, x, &la));
    }
    assert_non_null(a->vq_book);
    uint8_t *buf = save(a, &len);
    assert_int_equal(len, BOOK_AT(c) + 4 + book_bytes(c));
    assert_int_equal(gcoll_state_load(b, buf, len), GCOLL_OK);
    same_state(a, b);
    /* the version-1 form: no codebook flag, no section */
    uint8_t *v1 = malloc(len);
    memcpy(v1, buf, len);
    uint32_t one = 1, flags;
    memcpy(v1 + 4, &one, 4);
    memcpy(&flags, v1 + FLAGS_AT(c), 4);
    assert_int_equal(flags & 32u, 32u);
    flags &= ~32u;
    memcpy(v1 + FLAGS_AT(c), &flags, 4);
    assert_int_equal(gcoll_state_load(cold, v1, BOOK_AT(c)), GCOLL_OK);
    assert_null(cold->vq_book);
    assert_memory_equal(cold->e, a->e, N * sizeof(float));
    int cold_differs = 0;
    for (uint64_t t = 3; t < 6; t++) {
        fill(x, N, 100 + t);
        uint8_t *ma = enc(c, a, x, &la), *mb = enc(c, b, x, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(ma, mb, la);
        assert_memory_equal(a->e, b->e, N * sizeof(float));
        if (t == 3) {
            size_t lc;
            uint8_t *mc = enc(c, cold, x, &lc);
            cold_differs = lc != la || memcmp(ma, mc, la) != 0;
            free(mc);
        }
        free(ma);
        free(mb);
    }
    assert_true(cold_differs);
    free(v1);
    free(buf);
    gcoll_state_destroy(a);
    gcoll_state_destroy(b);
    gcoll_state_destroy(cold);
    gcoll_compressor_destroy(c);
}

/* Expects buf[0..len) refused with GCOLL_ERR_INVALID and t left equal to ref. */
static void refused(gcoll_tensor_state_t *t, const gcoll_tensor_state_t *ref, const void *buf,
                    size_t len)
{
    assert_int_equal(gcoll_state_load(t, buf, len), GCOLL_ERR_INVALID);
    same_state(ref, t);
}

/* A corrupted codebook section is GCOLL_ERR_INVALID and leaves the state as it was: a
 * non-finite value, a wrong count, every truncation, the flag in a version-1 checkpoint or
 * for a codec without a codebook. */
static void test_vq_malformed(void **st)
{
    (void)st;
    gcoll_compressor_t *c = mk("vq:dim=4,bits=4"), *tk = mk("topk:density=0.1");
    gcoll_tensor_state_t *a = NULL, *t = NULL, *ref = NULL;
    assert_int_equal(gcoll_state_create(c, N, &a), GCOLL_OK);
    fill_book(a, 5);
    fill(a->e, N, 6);
    assert_int_equal(gcoll_state_create(c, N, &t), GCOLL_OK);
    assert_int_equal(gcoll_state_create(c, N, &ref), GCOLL_OK);
    fill_book(t, 7);
    fill_book(ref, 7);
    size_t len;
    uint8_t *buf = save(a, &len), *bad = malloc(len);
    const size_t book = BOOK_AT(c), nb = book_bytes(c) / sizeof(float);
    const float nonfinite[3] = {NAN, INFINITY, -INFINITY};
    const size_t where[3] = {0, nb / 2, nb - 1};
    for (int i = 0; i < 3; i++) {
        memcpy(bad, buf, len);
        memcpy(bad + book + 4 + 4 * where[i], &nonfinite[i], 4);
        refused(t, ref, bad, len);
    }
    const uint32_t counts[4] = {0, (uint32_t)nb - 1, (uint32_t)nb + 1, 0xffffffffu};
    for (int i = 0; i < 4; i++) {
        memcpy(bad, buf, len);
        memcpy(bad + book, &counts[i], 4);
        refused(t, ref, bad, len);
    }
    for (size_t cut = book; cut < len; cut++)
        refused(t, ref, buf, cut);
    uint32_t one = 1;
    memcpy(bad, buf, len);
    memcpy(bad + 4, &one, 4);
    refused(t, ref, bad, len);
    /* the flag for top-k, with an empty section after its body */
    gcoll_tensor_state_t *k = NULL, *kref = NULL;
    assert_int_equal(gcoll_state_create(tk, N, &k), GCOLL_OK);
    assert_int_equal(gcoll_state_create(tk, N, &kref), GCOLL_OK);
    size_t klen;
    uint8_t *kbuf = save(k, &klen), *kbad = calloc(1, klen + 4);
    memcpy(kbad, kbuf, klen);
    uint32_t flags;
    memcpy(&flags, kbad + FLAGS_AT(tk), 4);
    flags |= 32u;
    memcpy(kbad + FLAGS_AT(tk), &flags, 4);
    refused(k, kref, kbad, klen + 4);
    /* and the intact checkpoint loads */
    assert_int_equal(gcoll_state_load(t, buf, len), GCOLL_OK);
    same_state(a, t);
    free(kbuf);
    free(kbad);
    free(bad);
    free(buf);
    gcoll_state_destroy(k);
    gcoll_state_destroy(kref);
    gcoll_state_destroy(a);
    gcoll_state_destroy(t);
    gcoll_state_destroy(ref);
    gcoll_compressor_destroy(c);
    gcoll_compressor_destroy(tk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_topk), cmocka_unit_test(test_round_trip_dgc),
        cmocka_unit_test(test_round_trip_q8),   cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_foreign),         cmocka_unit_test(test_round_trip_vq),
        cmocka_unit_test(test_vq_continues),    cmocka_unit_test(test_vq_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
