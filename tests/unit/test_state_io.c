/* test_state_io.c: checkpoints of tensor states (gcoll_state_save/load): a round trip restores
 * every buffer and nested state, and a malformed, truncated or foreign checkpoint is refused
 * with the state left as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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
    assert_int_equal(gcoll_state_create_mode(c, NSRV, GCOLL_STATE_SERVER, &s->server), GCOLL_OK);
    if (s->server->e)
        fill(s->server->e, NSRV, seed + 3);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_topk), cmocka_unit_test(test_round_trip_dgc),
        cmocka_unit_test(test_round_trip_q8),   cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_foreign),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
