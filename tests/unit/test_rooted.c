/* test_rooted.c: the rooted collectives' schedule and choice (collectives/rooted.c): the
 * binomial tree's positions against a tree built here by brute force from its definition
 * (the parent of virtual rank v clears v's lowest set bit), and the cost model's choice:
 * forced by the setting, the tree for a few bytes, the large-message form for many, one
 * switch per rank count as the size grows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collectives/coll.h"

#define MAXP 80

/* Every virtual rank's parent, children and subtree size agree with the definition, and
 * the subtree of v is the contiguous range v .. v + size - 1. */
static void test_tree_positions(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++) {
        int parent[MAXP], nchild[MAXP] = {0}, sub[MAXP];
        parent[0] = -1;
        for (int v = 1; v < P; v++) {
            parent[v] = v & (v - 1);
            nchild[parent[v]]++;
        }
        /* subtree sizes, leaves first (a child is always above its parent) */
        for (int v = P - 1; v >= 0; v--) {
            sub[v] = 1;
            for (int c = v + 1; c < P; c++)
                if (parent[c] == v)
                    sub[v] += sub[c];
        }
        int covered = 0;
        for (int v = 0; v < P; v++) {
            gcoll_tree_pos_t t = gcoll_tree_pos(v, P);
            assert_int_equal(t.parent, parent[v]);
            assert_int_equal(t.nchild, nchild[v]);
            assert_int_equal(t.size, sub[v]);
            /* children are v + 2^c, c < nchild, each inside P with v as its parent */
            int span = 0;
            for (int c = 0; c < t.nchild; c++) {
                int ch = v + (1 << c);
                assert_true(ch < P);
                assert_int_equal(parent[ch], v);
                /* their subtrees tile v+1 .. v+size-1 in order */
                assert_int_equal(ch, v + 1 + span);
                span += gcoll_tree_pos(ch, P).size;
            }
            assert_int_equal(span + 1, t.size);
            covered += v ? 0 : t.size;
        }
        assert_int_equal(covered, P);
    }
}

static const char *transport = "ucx"; /* what the channel runs on */
static size_t mesh;                   /* what its mesh_max says */

static size_t fake_mesh_max(gcoll_transport_t *t)
{
    (void)t;
    return mesh;
}

static gcoll_rooted_algo_t pick(int algo, int P, int kind, size_t bytes)
{
    gcoll_coll_cfg_t cfg = {.rooted_algo = algo};
    gcoll_transport_ops_t ops = {.name = transport, .mesh_max = fake_mesh_max};
    gcoll_channel_t ch = {.ops = &ops, .tp = (gcoll_transport_t *)&ops};
    gcoll_coll_t ctx = {.rank = 0, .size = P, .cfg = &cfg, .ch = &ch};
    char why[256];
    gcoll_rooted_algo_t a = gcoll_rooted_select(&ctx, kind, bytes, why, sizeof(why));
    assert_int_equal(a, gcoll_rooted_select(&ctx, kind, bytes, NULL, 0)); /* why or not */
    assert_true(strlen(why) > 0);
    return a;
}

static void test_choice(void **state)
{
    (void)state;
    static const int kinds[] = {GCOLL_KIND_REDUCE, GCOLL_KIND_GATHER, GCOLL_KIND_SCATTER};
    for (int k = 0; k < 3; k++) {
        for (int P = 2; P <= 64; P++) {
            /* forced */
            assert_int_equal(pick(GCOLL_ROOTED_TREE, P, kinds[k], 1 << 30), GCOLL_ROOTED_TREE);
            assert_int_equal(pick(GCOLL_ROOTED_DIRECT, P, kinds[k], 8), GCOLL_ROOTED_DIRECT);
            /* as the size grows the choice only moves on, linear (reduce, below 64 KiB),
             * then the tree, then the direct form */
            int stage = 0;
            for (size_t b = 8; b <= ((size_t)1 << 32); b *= 2) {
                gcoll_rooted_algo_t a = pick(GCOLL_ROOTED_AUTO, P, kinds[k], b);
                int s = a == GCOLL_ROOTED_LINEAR ? 0 : a == GCOLL_ROOTED_TREE ? 1 : 2;
                assert_true(s >= stage);
                stage = s;
                if (a == GCOLL_ROOTED_LINEAR)
                    assert_true(kinds[k] == GCOLL_KIND_REDUCE && b < ((size_t)64 << 10));
            }
            /* a large reduce takes reduce-scatter then gather (not on 2 ranks over TCP or
             * mailboxes, below): it moves 2 (P-1)/P of the vector per rank where the tree's
             * root takes in log2 P of them */
            if (kinds[k] == GCOLL_KIND_REDUCE) {
                /* small: the linear form from 3 ranks (one message either way on 2) */
                assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, kinds[k], 8),
                                 P == 2 ? GCOLL_ROOTED_TREE : GCOLL_ROOTED_LINEAR);
                assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, kinds[k], (size_t)1 << 32),
                                 GCOLL_ROOTED_DIRECT);
            }
            /* 2 ranks: both forms of a gather or scatter are one message; the tree wins
             * the tie. From 4 ranks, the tree forwards blocks that direct sends once. */
            if (kinds[k] != GCOLL_KIND_REDUCE && P == 2)
                assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, kinds[k], (size_t)1 << 32),
                                 GCOLL_ROOTED_TREE);
            if (kinds[k] != GCOLL_KIND_REDUCE && P >= 4)
                assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, kinds[k], (size_t)1 << 32),
                                 GCOLL_ROOTED_DIRECT);
        }
    }
    /* a reduce on 2 ranks: the tree at every size over TCP (both sides copy every byte)
     * and through mailboxes (the copy of a segment overlaps the sum of the one before);
     * other memory or RDMA: reduce-scatter then gather from 512 KiB */
    for (int tp = 0; tp < 2; tp++) {
        transport = tp ? "tcp" : "ucx";
        mesh = tp ? 0 : 16384;
        for (size_t b = 8; b <= ((size_t)1 << 32); b *= 2)
            assert_int_equal(pick(GCOLL_ROOTED_AUTO, 2, GCOLL_KIND_REDUCE, b), GCOLL_ROOTED_TREE);
        assert_int_equal(pick(GCOLL_ROOTED_AUTO, 4, GCOLL_KIND_REDUCE, (size_t)1 << 32),
                         GCOLL_ROOTED_DIRECT);
    }
    transport = "ucx";
    mesh = 0;
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 2, GCOLL_KIND_REDUCE, (size_t)256 << 10),
                     GCOLL_ROOTED_TREE);
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 2, GCOLL_KIND_REDUCE, (size_t)512 << 10),
                     GCOLL_ROOTED_DIRECT);
    mesh = 1024; /* too small a record to cut segments to */
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 2, GCOLL_KIND_REDUCE, (size_t)512 << 10),
                     GCOLL_ROOTED_DIRECT);
    assert_int_not_equal(pick(GCOLL_ROOTED_AUTO, 4, GCOLL_KIND_REDUCE, (size_t)1 << 20),
                         GCOLL_ROOTED_CHAIN);
    /* with mailboxes, 3-8 ranks: the chain for a reduce of 512 KiB up to 4 MiB, and never
     * for gather or scatter; without them, never */
    mesh = 16384;
    for (int P = 3; P <= 16; P++)
        for (size_t b = 8; b <= ((size_t)1 << 30); b *= 2) {
            int want = P <= 8 && b >= ((size_t)512 << 10) && b < ((size_t)4 << 20);
            assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, GCOLL_KIND_REDUCE, b) == GCOLL_ROOTED_CHAIN,
                             want);
            assert_int_not_equal(pick(GCOLL_ROOTED_AUTO, P, GCOLL_KIND_GATHER, b),
                                 GCOLL_ROOTED_CHAIN);
            assert_int_not_equal(pick(GCOLL_ROOTED_AUTO, P, GCOLL_KIND_SCATTER, b),
                                 GCOLL_ROOTED_CHAIN);
        }
    /* linear through mailboxes below 2 KiB only (the tree's segments pay from there) */
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 4, GCOLL_KIND_REDUCE, 1024), GCOLL_ROOTED_LINEAR);
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 4, GCOLL_KIND_REDUCE, 4096), GCOLL_ROOTED_TREE);
    mesh = 0;
    assert_int_equal(pick(GCOLL_ROOTED_AUTO, 4, GCOLL_KIND_REDUCE, 4096), GCOLL_ROOTED_LINEAR);
    /* forced: linear for a reduce at any size; gather and scatter take the direct form */
    assert_int_equal(pick(GCOLL_ROOTED_LINEAR, 4, GCOLL_KIND_REDUCE, 1 << 30), GCOLL_ROOTED_LINEAR);
    assert_int_equal(pick(GCOLL_ROOTED_LINEAR, 4, GCOLL_KIND_GATHER, 8), GCOLL_ROOTED_DIRECT);
    assert_int_equal(pick(GCOLL_ROOTED_LINEAR, 4, GCOLL_KIND_SCATTER, 8), GCOLL_ROOTED_DIRECT);
    /* forced: the chain for a reduce; gather and scatter take the tree */
    assert_int_equal(pick(GCOLL_ROOTED_CHAIN, 4, GCOLL_KIND_REDUCE, 8), GCOLL_ROOTED_CHAIN);
    assert_int_equal(pick(GCOLL_ROOTED_CHAIN, 4, GCOLL_KIND_GATHER, 8), GCOLL_ROOTED_TREE);
    assert_int_equal(pick(GCOLL_ROOTED_CHAIN, 4, GCOLL_KIND_SCATTER, 1 << 20), GCOLL_ROOTED_TREE);
    /* gather and scatter from 3 ranks up to 64: direct at every size (a message more at
     * the root costs it far less than a tree step: docs/results/rooted.md) */
    for (int P = 3; P <= 64; P++)
        for (size_t b = 8; b <= ((size_t)1 << 32); b *= 4) {
            assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, GCOLL_KIND_GATHER, b), GCOLL_ROOTED_DIRECT);
            assert_int_equal(pick(GCOLL_ROOTED_AUTO, P, GCOLL_KIND_SCATTER, b),
                             GCOLL_ROOTED_DIRECT);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_positions),
        cmocka_unit_test(test_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
