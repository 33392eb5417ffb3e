/* split_check: gcoll_comm_split and gcoll_comm_dup across processes, through the public
 * API only. Splits the job into halves (ranked in reverse by their key), into pairs, into
 * all but rank 0 (which passes GCOLL_SPLIT_NOCOLOR), and duplicates it; then interleaves
 * allreduce, broadcast and allgather on all of them and on the parent, each checked
 * against sums of known inputs computed here. "fail": afterwards one rank of the first
 * half aborts its half; the rest of that half must fail there, while the other half, the
 * pairs and the parent keep working.
 *   split_check [fail]      (an even number of ranks, at least 4)
 * Exit status 0 when every check passed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcoll.h"

static int rank, size, failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "split_check rank %d: FAIL: ", rank);                                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static int val(int parent_rank, int iter, int j, int which)
{
    return (parent_rank * 7 + iter * 3 + j * 5 + which * 11) % 13 - 6;
}

/* A split as the test sees it: the parent ranks of its members in new-rank order. */
typedef struct {
    const char *name;
    gcoll_comm_t *c;
    int which;
    int n, members[64];
} sub_t;

static void expect_members(sub_t *s, int color_of_me, int (*color)(int), int (*key)(int))
{
    s->n = 0;
    for (int r = 0; r < size; r++)
        if (color(r) == color_of_me && color_of_me >= 0)
            s->members[s->n++] = r;
    for (int i = 1; i < s->n; i++) /* insertion sort by (key, parent rank) */
        for (int j = i; j > 0; j--) {
            int a = s->members[j - 1], b = s->members[j];
            if (key(a) > key(b) || (key(a) == key(b) && a > b)) {
                s->members[j - 1] = b;
                s->members[j] = a;
            }
        }
}

static int half_color(int r)
{
    return r < size / 2 ? 0 : 1;
}
static int half_key(int r)
{
    return -r;
}
static int pair_color(int r)
{
    return r / 2;
}
static int pair_key(int r)
{
    return r;
}
static int rest_color(int r)
{
    return r == 0 ? GCOLL_SPLIT_NOCOLOR : 7;
}

#define N 257

static void allreduce_check(sub_t *s, int iter)
{
    float buf[N];
    for (int j = 0; j < N; j++)
        buf[j] = (float)val(rank, iter, j, s->which);
    gcoll_status_t st = gcoll_allreduce(s->c, buf, buf, N, GCOLL_FLOAT32, GCOLL_SUM);
    CHECK(st == GCOLL_OK, "%s allreduce %d: %s", s->name, iter, gcoll_status_string(st));
    if (st != GCOLL_OK)
        return;
    for (int j = 0; j < N; j++) {
        int want = 0;
        for (int i = 0; i < s->n; i++)
            want += val(s->members[i], iter, j, s->which);
        if (buf[j] != (float)want) {
            CHECK(0, "%s allreduce %d [%d]: %g, expected %d", s->name, iter, j, buf[j], want);
            return;
        }
    }
}

static void bcast_check(sub_t *s, int iter)
{
    int root = iter % s->n;
    int me = gcoll_comm_rank(s->c);
    CHECK(me >= 0 && me < s->n && s->members[me] == rank, "%s: rank %d is not member %d", s->name,
          me, rank);
    float buf[N];
    for (int j = 0; j < N; j++)
        buf[j] = me == root ? (float)val(rank, iter, j, s->which) : 99.0f;
    gcoll_status_t st = gcoll_broadcast(s->c, buf, N, GCOLL_FLOAT32, root);
    CHECK(st == GCOLL_OK, "%s broadcast %d: %s", s->name, iter, gcoll_status_string(st));
    for (int j = 0; j < N && st == GCOLL_OK; j++)
        if (buf[j] != (float)val(s->members[root], iter, j, s->which)) {
            CHECK(0, "%s broadcast %d [%d] wrong", s->name, iter, j);
            return;
        }
}

static void allgather_check(sub_t *s, int iter)
{
    int me = gcoll_comm_rank(s->c);
    float *all = calloc((size_t)s->n * 16, sizeof(float));
    for (int j = 0; j < 16; j++)
        all[me * 16 + j] = (float)val(rank, iter, j, s->which);
    gcoll_status_t st = gcoll_allgather(s->c, all + me * 16, all, 16, GCOLL_FLOAT32);
    CHECK(st == GCOLL_OK, "%s allgather %d: %s", s->name, iter, gcoll_status_string(st));
    for (int i = 0; i < s->n && st == GCOLL_OK; i++)
        for (int j = 0; j < 16; j++)
            if (all[i * 16 + j] != (float)val(s->members[i], iter, j, s->which)) {
                CHECK(0, "%s allgather %d: block %d wrong", s->name, iter, i);
                i = s->n;
                break;
            }
    free(all);
}

int main(int argc, char **argv)
{
    int fail_mode = argc > 1 && strcmp(argv[1], "fail") == 0;
    gcoll_comm_t *world;
    if (gcoll_comm_init(&world) != GCOLL_OK)
        return 3;
    rank = gcoll_comm_rank(world);
    size = gcoll_comm_size(world);
    if (size < 4 || size % 2 || size > 64) {
        fprintf(stderr, "split_check: needs an even number of ranks from 4 to 64\n");
        return 3;
    }
    sub_t parent = {"parent", world, 0, 0, {0}}, half = {"half", NULL, 1, 0, {0}},
          pair = {"pair", NULL, 2, 0, {0}}, rest = {"rest", NULL, 3, 0, {0}},
          dup = {"dup", NULL, 4, 0, {0}};
    for (int r = 0; r < size; r++)
        parent.members[parent.n++] = r;
    dup.n = parent.n;
    memcpy(dup.members, parent.members, sizeof(dup.members));
    gcoll_status_t st;
    st = gcoll_comm_split(world, half_color(rank), half_key(rank), &half.c);
    CHECK(st == GCOLL_OK && half.c, "split into halves: %s", gcoll_status_string(st));
    st = gcoll_comm_split(world, pair_color(rank), pair_key(rank), &pair.c);
    CHECK(st == GCOLL_OK && pair.c, "split into pairs: %s", gcoll_status_string(st));
    st = gcoll_comm_split(world, rest_color(rank), 0, &rest.c);
    CHECK(st == GCOLL_OK && (rank == 0) == (rest.c == NULL), "split without rank 0: %s",
          gcoll_status_string(st));
    st = gcoll_comm_dup(world, &dup.c);
    CHECK(st == GCOLL_OK && dup.c, "dup: %s", gcoll_status_string(st));
    if (failures)
        return 1;
    expect_members(&half, half_color(rank), half_color, half_key);
    expect_members(&pair, pair_color(rank), pair_color, pair_key);
    expect_members(&rest, rest_color(rank), rest_color, pair_key);
    CHECK(gcoll_comm_size(half.c) == size / 2 && gcoll_comm_size(pair.c) == 2 &&
              (!rest.c || gcoll_comm_size(rest.c) == size - 1) && gcoll_comm_size(dup.c) == size &&
              gcoll_comm_rank(dup.c) == rank,
          "sizes or ranks of the new communicators are wrong");
    sub_t *all[] = {&parent, &half, &pair, &rest, &dup};
    for (int iter = 0; iter < 6 && !failures; iter++)
        for (int k = 0; k < 5; k++) {
            sub_t *s = all[(k + iter) % 5]; /* a different interleaving every round */
            if (!s->c)
                continue;
            allreduce_check(s, iter);
            if (s != &parent)
                bcast_check(s, iter);
            allgather_check(s, iter);
        }
    if (fail_mode && !failures) {
        /* The member of rank 1 in the first half aborts it; the half's others must fail
         * there. Everything else goes on. */
        int first_half = half_color(rank) == 0;
        if (first_half && gcoll_comm_rank(half.c) == 1) {
            gcoll_comm_abort(half.c);
        } else if (first_half) {
            float x = 1;
            st = gcoll_allreduce(half.c, &x, &x, 1, GCOLL_FLOAT32, GCOLL_SUM);
            CHECK(st == GCOLL_ERR_PEER || st == GCOLL_ERR_ABORTED,
                  "allreduce on the aborted half returned %s", gcoll_status_string(st));
            if (st != GCOLL_OK)
                fprintf(stderr,
                        "split_check rank %d: failed as expected on the aborted half: "
                        "%s\n",
                        rank, gcoll_comm_last_error(half.c));
        } else {
            allreduce_check(&half, 100);
        }
        allreduce_check(&pair, 100);
        allreduce_check(&parent, 100);
        allreduce_check(&dup, 100);
    }
    gcoll_comm_destroy(half.c);
    gcoll_comm_destroy(pair.c);
    if (rest.c)
        gcoll_comm_destroy(rest.c);
    gcoll_comm_destroy(dup.c);
    st = gcoll_comm_destroy(world);
    CHECK(st == GCOLL_OK, "destroy: %s", gcoll_status_string(st));
    if (!failures)
        printf("split_check rank %d: ok\n", rank);
    return failures ? 1 : 0;
}
