/* rooted_check.c: gcoll_reduce, gcoll_gather and gcoll_scatter (and their nonblocking
 * twins) on every root, dtype, op and count, checked against references computed here
 * from every rank's inputs, which every rank generates from (rank, index, call).
 *
 * References: integer and bool results are exact in any order (sums and products wrap
 * modulo 2^bits), so they are compared bit for bit whatever the algorithm, and so are
 * MIN and MAX. Float SUM, AVG and PROD are compared bit for bit with a reference that
 * combines in the binomial tree's order, rounding to the dtype after every operation, when
 * the tree runs (GCOLL_ROOTED_ALGO=tree), or in the chain's (=chain). Otherwise (reduce-scatter
 * then gather: each block is summed in another ring order) the result must lie within the rounding
 * bound of the exact value: P-1 operations, each rounding to nearest with unit roundoff u = 2^-p (p
 * significant bits of the dtype: 24, 53, 11, 8, 4, 3) an intermediate no larger than
 * S = sum |x_r|, give |got - exact| <= (P-1) u S for SUM; AVG adds one rounding of the
 * quotient, u |exact/P|; PROD's relative error is at most (1+u)^(P-1) - 1. The inputs
 * keep every exact intermediate representable in double and fp32 (multiples of a power of
 * two, few significant bits, products away from underflow and overflow), so the exact
 * value is computed in double and the library's fp32 steps are exact before their one
 * rounding. gather and scatter move bytes: compared bit for bit.
 *
 * Modes: "all" (the sweep, interleaved with allreduce and compressed allreduce on the
 * same communicator), "invalid" (a root out of range), "mismatch KIND" (rank 0 names
 * another root in a reduce, gather or scatter; KIND "kind": rank 0 scatters where the
 * others gather; "count": rank 0 gathers 8 elements where the others gather 16), "die
 * VICTIM" (rank VICTIM exits in the middle of a large gather; test-failures.sh). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcoll.h"

static int rank, size, failures, checks;
static gcoll_comm_t *comm;
/* Float results in the order of GCOLL_ROOTED_ALGO=tree (1) or =chain (2); 0: within the
 * rounding bound */
static int tree_exact;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (failures < 30) {                                                                       \
            fprintf(stderr, "rank %d: FAIL: ", rank);                                              \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
        failures++;                                                                                \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

#include "rooted_ref.h"

/* ---- the reference ---------------------------------------------------------------------- */

/* An integer value sign- or zero-extended to 64 bits. */
static uint64_t widen(gcoll_dtype_t d, uint64_t raw)
{
    size_t bits = 8 * gcoll_dtype_size(d);
    if (bits == 64 || !is_signed(d) || !(raw >> (bits - 1) & 1))
        return raw;
    return raw | ~((1ull << bits) - 1);
}

static uint64_t int_op(gcoll_dtype_t d, gcoll_op_t op, uint64_t a, uint64_t b)
{
    if (d == GCOLL_BOOL) {
        int x = a != 0, y = b != 0;
        if (op == GCOLL_PROD || op == GCOLL_MIN || op == GCOLL_BAND)
            return (uint64_t)(x && y);
        return op == GCOLL_BXOR ? (uint64_t)(x != y) : (uint64_t)(x || y);
    }
    int lt = is_signed(d) ? (int64_t)b < (int64_t)a : b < a;
    switch (op) {
    case GCOLL_PROD:
        return a * b;
    case GCOLL_MIN:
        return lt ? b : a;
    case GCOLL_MAX:
        return lt ? a : b;
    case GCOLL_BAND:
        return a & b;
    case GCOLL_BOR:
        return a | b;
    case GCOLL_BXOR:
        return a ^ b;
    default:
        return a + b;
    }
}

static double float_op(gcoll_dtype_t d, gcoll_op_t op, double a, double b)
{
    switch (op) {
    case GCOLL_PROD:
        return round_to(d, a * b);
    case GCOLL_MIN:
        return b < a ? b : a;
    case GCOLL_MAX:
        return b > a ? b : a;
    default:
        return round_to(d, a + b);
    }
}

typedef struct {
    gcoll_dtype_t d;
    gcoll_op_t op;
    int root;
    const double *x;
} tree_t;

/* The binomial tree's combination of virtual ranks v.. (rank (v + root) % P): a rank's
 * own value, then each child's subtree in order of distance (collectives/rooted.c). */
static double tree_combine(const tree_t *t, int v)
{
    double acc = t->x[(v + t->root) % size];
    int span = v ? v & -v : size;
    for (int m = 1; m < span && v + m < size; m <<= 1)
        acc = float_op(t->d, t->op, acc, tree_combine(t, v + m));
    return acc;
}

/* The chain's combination: virtual rank v's own value, then the partial result of the
 * ranks after it (v + 1 .. P - 1), which v + 1 sent (collectives/rooted.c). */
static double chain_combine(const tree_t *t, int v)
{
    double acc = t->x[(v + t->root) % size];
    return v + 1 < size ? float_op(t->d, t->op, acc, chain_combine(t, v + 1)) : acc;
}

/* The linear reduce's combination: the root's own value, then rank root + 1's, root + 2's
 * and so on (collectives/rooted.c). */
static double linear_combine(const tree_t *t)
{
    double acc = t->x[t->root];
    for (int k = 1; k < size; k++)
        acc = float_op(t->d, t->op, acc, t->x[(t->root + k) % size]);
    return acc;
}

/* Checks element i of root's result: got (raw bits). */
static int check_reduce_elem(gcoll_dtype_t d, gcoll_op_t op, int root, size_t i, uint64_t call,
                             uint64_t got, int exact_order)
{
    int P = size;
    if (!is_float(d)) {
        uint64_t acc = widen(d, input(d, op, 0, i, call));
        for (int r = 1; r < P; r++)
            acc = int_op(d, op, acc, widen(d, input(d, op, r, i, call)));
        size_t bits = 8 * gcoll_dtype_size(d);
        uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        if (op == GCOLL_AVG && P > 1) {
            acc = widen(d, acc & mask);
            acc = is_signed(d) ? (uint64_t)((int64_t)acc / P) : acc / (uint64_t)P;
        }
        if ((acc & mask) == got)
            return 0;
        FAIL("reduce %s %s root %d elem %zu: got %#llx, expected %#llx", gcoll_dtype_name(d),
             op_names[op], root, i, (unsigned long long)got, (unsigned long long)(acc & mask));
        return 1;
    }
    double x[64];
    double exact = 0, mag = 0, prod = 1;
    for (int r = 0; r < P; r++) {
        x[r] = float_input(d, op, r, i, call);
        exact += x[r];
        mag += fabs(x[r]);
        prod *= x[r];
    }
    double g = float_value(d, got), want;
    double u = ldexp(1.0, -precision(d));
    if (op == GCOLL_MIN || op == GCOLL_MAX || exact_order) {
        tree_t t = {d, op, root, x};
        want = P == 1             ? x[root]
               : exact_order == 2 ? chain_combine(&t, 0)
               : exact_order == 3 ? linear_combine(&t)
                                  : tree_combine(&t, 0);
        if (op == GCOLL_AVG)
            want = round_to(d, want / P);
        /* the sign of a zero too, in the tree's order; in another order MIN and MAX may
         * keep the other of -0 and +0 (they keep the first operand of equal ones) */
        if (g == want && (signbit(g) == signbit(want) || !exact_order))
            return 0;
        if (g == want && want == 0 && op != GCOLL_MIN && op != GCOLL_MAX)
            return 0; /* the sign of an exact zero sum */
        FAIL("reduce %s %s root %d elem %zu: got %.17g, expected %.17g (%s order)",
             gcoll_dtype_name(d), op_names[op], root, i, g, want,
             exact_order == 2   ? "chain"
             : exact_order == 3 ? "linear"
                                : "tree");
        return 1;
    }
    double bound;
    if (op == GCOLL_PROD) {
        want = prod;
        /* plus the rounding of the double product itself */
        bound = ((pow(1 + u, P - 1) - 1) + (P - 1) * 0x1p-52) * fabs(prod) * 1.0001;
    } else if (op == GCOLL_AVG) {
        want = exact / P;
        bound = ((P - 1) * u * mag / P + u * fabs(want)) * 1.0001;
    } else {
        want = exact;
        bound = (P - 1) * u * mag * 1.0001;
    }
    if (fabs(g - want) <= bound)
        return 0;
    FAIL("reduce %s %s root %d elem %zu: got %.17g, exact %.17g, off by more than %.3g",
         gcoll_dtype_name(d), op_names[op], root, i, g, want, bound);
    return 1;
}

/* ---- the sweep ------------------------------------------------------------------------- */

static uint64_t ncall;

static void fill_input(void *buf, gcoll_dtype_t d, gcoll_op_t op, size_t n, uint64_t call)
{
    for (size_t i = 0; i < n; i++)
        store(buf, d, i, input(d, op, rank, i, call));
}

/* A sentinel byte a call must leave alone. */
#define POISON 0xA5

/* One reduce; variant 0: out of place, non-root ranks pass a poisoned recvbuf (left
 * untouched); 1: in place at the root, NULL recvbuf elsewhere; 2: nonblocking. */
static void one_reduce(gcoll_dtype_t d, gcoll_op_t op, size_t n, int root, int variant)
{
    size_t esz = gcoll_dtype_size(d), bytes = n * esz;
    uint64_t call = ++ncall;
    uint8_t *send = malloc(bytes + 1), *recv = malloc(bytes + 1);
    fill_input(send, d, op, n, call);
    memset(recv, POISON, bytes + 1);
    const void *sb = send;
    void *rb = recv;
    if (variant == 1) {
        if (rank == root) {
            memcpy(recv, send, bytes);
            sb = recv;
        } else {
            rb = NULL;
        }
    }
    gcoll_status_t st;
    if (variant == 2) {
        gcoll_request_t *req;
        st = gcoll_ireduce(comm, sb, rb, n, d, op, root, &req);
        if (st == GCOLL_OK)
            st = gcoll_wait(req);
    } else {
        st = gcoll_reduce(comm, sb, rb, n, d, op, root);
    }
    checks++;
    if (st != GCOLL_OK) {
        FAIL("reduce %s %s n %zu root %d variant %d: %s (%s)", gcoll_dtype_name(d), op_names[op], n,
             root, variant, gcoll_status_string(st), gcoll_comm_last_error(comm));
    } else if (rank == root) {
        int bad = 0;
        for (size_t i = 0; i < n && bad < 3; i++)
            bad += check_reduce_elem(d, op, root, i, call, load(recv, d, i), tree_exact);
        if (recv[bytes] != POISON)
            FAIL("reduce wrote past recvbuf");
    } else {
        for (size_t i = 0; i <= bytes; i++)
            if (recv[i] != POISON) {
                FAIL("reduce %s n %zu: a non-root rank's recvbuf was written at byte %zu",
                     gcoll_dtype_name(d), n, i);
                break;
            }
    }
    free(send);
    free(recv);
}

/* Byte j of rank r's block in a gather or scatter: every dtype is moved as bytes, NaN
 * codes included. */
static uint8_t byte_of(int r, size_t j, uint64_t call)
{
    return (uint8_t)hash4(call, (uint64_t)r, j, 3);
}

/* One gather (scatter: is_scatter); variant 0: out of place with poisoned buffers off the
 * root, 1: in place at the root and NULL buffers elsewhere, 2: nonblocking. */
static void one_move(int is_scatter, gcoll_dtype_t d, size_t n, int root, int variant)
{
    size_t block = n * gcoll_dtype_size(d), all = block * (size_t)size;
    uint64_t call = ++ncall;
    uint8_t *big = malloc(all + 1), *small = malloc(block + 1);
    memset(big, POISON, all + 1);
    memset(small, POISON, block + 1);
    const char *name = is_scatter ? "scatter" : "gather";
    if (is_scatter) {
        if (rank == root)
            for (int r = 0; r < size; r++)
                for (size_t j = 0; j < block; j++)
                    big[(size_t)r * block + j] = byte_of(r, j, call);
    } else {
        for (size_t j = 0; j < block; j++)
            small[j] = byte_of(rank, j, call);
    }
    const void *sb = is_scatter ? (const void *)big : small;
    void *rb = is_scatter ? (void *)small : big;
    if (variant == 1) {
        if (rank == root) {
            uint8_t *mine = big + (size_t)root * block;
            if (is_scatter) {
                rb = mine;
            } else {
                memcpy(mine, small, block);
                sb = mine;
            }
        } else if (is_scatter) {
            sb = NULL;
        } else {
            rb = NULL;
        }
    }
    gcoll_status_t st;
    gcoll_request_t *req = NULL;
    if (variant == 2) {
        st = is_scatter ? gcoll_iscatter(comm, sb, rb, n, d, root, &req)
                        : gcoll_igather(comm, sb, rb, n, d, root, &req);
        if (st == GCOLL_OK)
            st = gcoll_wait(req);
    } else {
        st = is_scatter ? gcoll_scatter(comm, sb, rb, n, d, root)
                        : gcoll_gather(comm, sb, rb, n, d, root);
    }
    checks++;
    if (st != GCOLL_OK) {
        FAIL("%s %s n %zu root %d variant %d: %s (%s)", name, gcoll_dtype_name(d), n, root, variant,
             gcoll_status_string(st), gcoll_comm_last_error(comm));
    } else if (is_scatter) {
        const uint8_t *mine = (const uint8_t *)rb;
        for (size_t j = 0; j < block; j++)
            if (mine[j] != byte_of(rank, j, call)) {
                FAIL("scatter %s n %zu root %d variant %d: byte %zu wrong", gcoll_dtype_name(d), n,
                     root, variant, j);
                break;
            }
        if (small[block] != POISON)
            FAIL("scatter wrote past recvbuf");
    } else if (rank == root) {
        for (size_t j = 0; j < all; j++)
            if (big[j] != byte_of((int)(j / block), j % block, call)) {
                FAIL("gather %s n %zu root %d variant %d: byte %zu (rank %zu's block) wrong",
                     gcoll_dtype_name(d), n, root, variant, j, j / block);
                break;
            }
        if (big[all] != POISON)
            FAIL("gather wrote past recvbuf");
    } else {
        for (size_t j = 0; j <= all; j++)
            if (big[j] != POISON) {
                FAIL("gather: a non-root rank's recvbuf was written");
                break;
            }
    }
    free(big);
    free(small);
}

/* An allreduce and a compressed allreduce on the same communicator between rooted calls,
 * queued together with a reduce and a gather (nonblocking) and waited for after. Integer
 * inputs that fp16 carries exactly, so both sums are exact. */
static void interleave(int root)
{
    enum { N = 1001 };
    float a[N], b[N], c[N], cout[N], s[N], g[N * 8];
    uint64_t call = ++ncall;
    for (int i = 0; i < N; i++) {
        a[i] = (float)((int)(hash4(call, (uint64_t)rank, (uint64_t)i, 1) % 201) - 100);
        c[i] = a[i] + 1;
        s[i] = a[i];
    }
    gcoll_compressor_t *cmp = NULL;
    gcoll_tensor_state_t *state = NULL;
    gcoll_request_t *rq[4] = {0};
    gcoll_status_t st = gcoll_compressor_create("fp16", &cmp);
    if (st == GCOLL_OK)
        st = gcoll_state_create(cmp, N, &state);
    if (st == GCOLL_OK)
        st = gcoll_ireduce(comm, s, rank == root ? b : NULL, N, GCOLL_FLOAT32, GCOLL_SUM, root,
                           &rq[0]);
    if (st == GCOLL_OK)
        st = gcoll_iallreduce(comm, a, a, N, GCOLL_FLOAT32, GCOLL_SUM, &rq[1]);
    if (st == GCOLL_OK)
        st = gcoll_icompressed_allreduce(comm, state, c, cout, N, GCOLL_SUM, &rq[2]);
    if (st == GCOLL_OK)
        st = gcoll_igather(comm, s, rank == root ? g : NULL, 1, GCOLL_FLOAT32, root, &rq[3]);
    for (int k = 0; k < 4; k++) {
        gcoll_status_t w = rq[k] ? gcoll_wait(rq[k]) : GCOLL_OK;
        if (st == GCOLL_OK)
            st = w;
    }
    checks++;
    if (st != GCOLL_OK) {
        FAIL("interleaved calls, root %d: %s (%s)", root, gcoll_status_string(st),
             gcoll_comm_last_error(comm));
    } else {
        for (int i = 0; i < N; i++) {
            double sum = 0;
            for (int r = 0; r < size; r++)
                sum += (double)((int)(hash4(call, (uint64_t)r, (uint64_t)i, 1) % 201) - 100);
            if (a[i] != sum || cout[i] != sum + size || (rank == root && b[i] != sum)) {
                FAIL("interleaved, root %d, elem %d: allreduce %g, compressed %g, reduce %g, "
                     "expected %g and %g",
                     root, i, a[i], cout[i], rank == root ? b[i] : sum, sum, sum + size);
                break;
            }
        }
        for (int r = 0; rank == root && r < size; r++)
            if (g[r] != (float)((int)(hash4(call, (uint64_t)r, 0, 1) % 201) - 100))
                FAIL("interleaved gather, root %d: rank %d's element wrong", root, r);
    }
    gcoll_state_destroy(state);
    gcoll_compressor_destroy(cmp);
}

static int run_all(void)
{
    static const size_t counts[] = {0, 1, 7, 1001};
    const char *large_env = getenv("ROOTED_CHECK_LARGE");
    size_t large = large_env ? strtoul(large_env, NULL, 10) : 0;
    for (int root = 0; root < size; root++) {
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            size_t n = counts[k];
            for (size_t di = 0; di < NDT; di++) {
                gcoll_dtype_t d = all_dtypes[di];
                for (size_t oi = 0; oi < 8; oi++)
                    if (valid_pair(d, all_ops[oi]))
                        one_reduce(d, all_ops[oi], n, root, (int)((k + di + oi) % 3));
                one_move(0, d, n, root, (int)((k + di) % 3));
                one_move(1, d, n, root, (int)((k + di + 1) % 3));
            }
        }
        interleave(root);
        /* large: every variant on a few dtypes and ops (many ring chunks and slices when
         * the script makes GCOLL_RING_CHUNK and GCOLL_RING_SLICE small) */
        if (large) {
            static const gcoll_dtype_t ld[] = {GCOLL_FLOAT32, GCOLL_BFLOAT16, GCOLL_INT32,
                                               GCOLL_FLOAT8_E4M3, GCOLL_FLOAT64};
            for (int v = 0; v < 3; v++) {
                gcoll_dtype_t d = ld[(root + v) % 5];
                one_reduce(d, v == 1 ? GCOLL_MAX : GCOLL_SUM, large, root, v);
                one_reduce(GCOLL_FLOAT32, GCOLL_AVG, large + 2, root, v);
                one_move(0, d, large / (size_t)size + 1, root, v);
                one_move(1, d, large / (size_t)size + 3, root, v);
            }
        }
    }
    return failures;
}

/* A late receiver: with GCOLL_UNEXPECTED_BYTES below the blocks (the script sets 1mb), a
 * transfer sent before its receive is posted would be held as unexpected past the bound
 * and fail the sender; large transfers wait for their receive instead (rooted.c). The
 * receiving side of each call (the root of a reduce and a gather, the other ranks of a
 * scatter) comes 300 ms late; 2 MiB per rank. */
static int run_late(void)
{
    const size_t n = (size_t)1 << 19; /* floats: 2 MiB */
    float *a = malloc(n * sizeof(float) * (size_t)size),
          *b = malloc(n * sizeof(float) * (size_t)size);
    int root = 1 % size;
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n * (size_t)size; i++)
            a[i] = (float)((i + (size_t)rank) % 1000);
        int late = k == 2 ? rank != root : rank == root;
        if (late)
            nanosleep(&(struct timespec){0, 300000000}, NULL);
        gcoll_status_t st = k == 0   ? gcoll_reduce(comm, a, b, n, GCOLL_FLOAT32, GCOLL_MAX, root)
                            : k == 1 ? gcoll_gather(comm, a, b, n, GCOLL_FLOAT32, root)
                                     : gcoll_scatter(comm, a, b, n, GCOLL_FLOAT32, root);
        checks++;
        if (st != GCOLL_OK) {
            FAIL("late %s: %s (%s)",
                 k == 0   ? "reduce"
                 : k == 1 ? "gather"
                          : "scatter",
                 gcoll_status_string(st), gcoll_comm_last_error(comm));
            break;
        }
        size_t bad = 0;
        if (k == 0 && rank == root)
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int r = 0; r < size; r++)
                    want = fmaxf(want, (float)((i + (size_t)r) % 1000));
                bad += b[i] != want;
            }
        if (k == 1 && rank == root)
            for (size_t i = 0; i < n * (size_t)size; i++)
                bad += b[i] != (float)((i % n + i / n) % 1000);
        if (k == 2)
            for (size_t i = 0; i < n; i++)
                bad += b[i] != (float)((i + (size_t)rank * n + (size_t)root) % 1000);
        if (bad)
            FAIL("late call %d: %zu elements wrong", k, bad);
    }
    free(a);
    free(b);
    return failures;
}

/* ---- errors --------------------------------------------------------------------------- */

/* Roots out of range: GCOLL_ERR_INVALID at once, on this rank alone, with a reason; the
 * communicator stays usable (a reduce afterwards works). */
static int run_invalid(void)
{
    float x[4] = {1, 2, 3, 4}, y[4 * 8];
    int bad_roots[] = {size, -1, 1 << 20};
    for (int k = 0; k < 3; k++) {
        int root = bad_roots[k];
        gcoll_status_t s[3] = {gcoll_reduce(comm, x, y, 4, GCOLL_FLOAT32, GCOLL_SUM, root),
                               gcoll_gather(comm, x, y, 4, GCOLL_FLOAT32, root),
                               gcoll_scatter(comm, y, x, 4, GCOLL_FLOAT32, root)};
        for (int i = 0; i < 3; i++) {
            checks++;
            if (s[i] != GCOLL_ERR_INVALID)
                FAIL("root %d: call %d gave %s, expected GCOLL_ERR_INVALID", root, i,
                     gcoll_status_string(s[i]));
        }
        if (!strstr(gcoll_comm_last_error(comm), "root"))
            FAIL("root %d: the error does not say why: '%s'", root, gcoll_comm_last_error(comm));
    }
    checks++;
    gcoll_status_t st = gcoll_reduce(comm, NULL, y, 4, GCOLL_FLOAT32, GCOLL_SUM, 0);
    if (st != GCOLL_ERR_INVALID)
        FAIL("NULL sendbuf gave %s", gcoll_status_string(st));
    checks++;
    st = gcoll_reduce(comm, x, NULL, 4, GCOLL_FLOAT32, GCOLL_BAND, 0);
    if (st != GCOLL_ERR_INVALID)
        FAIL("band on float32 gave %s", gcoll_status_string(st));
    checks++;
    st = gcoll_reduce(comm, x, y, 4, GCOLL_FLOAT32, GCOLL_SUM, 0);
    if (st != GCOLL_OK || (rank == 0 && y[3] != 4.0f * (float)size))
        FAIL("reduce after the refused calls: %s", gcoll_status_string(st));
    return failures;
}

/* Rank 0 names root 1, the others root 0: every rank's call (or, where the call ended
 * before the disagreement reached it, its next one) fails with GCOLL_ERR_MISMATCH, well
 * within the timeout. */
static int run_mismatch(const char *kind)
{
    float x[16 * 8] = {0}, y[16 * 8];
    int root = rank == 0 ? 1 : 0;
    double t0 = now();
    gcoll_status_t st;
    if (strcmp(kind, "kind") == 0)
        st = rank == 0 ? gcoll_scatter(comm, x, y, 16, GCOLL_FLOAT32, 0)
                       : gcoll_gather(comm, x, y, 16, GCOLL_FLOAT32, 0);
    else if (strcmp(kind, "count") == 0)
        st = gcoll_gather(comm, x, y, rank == 0 ? 8 : 16, GCOLL_FLOAT32, 0);
    else if (strcmp(kind, "reduce") == 0)
        st = gcoll_reduce(comm, x, y, 16, GCOLL_FLOAT32, GCOLL_SUM, root);
    else if (strcmp(kind, "gather") == 0)
        st = gcoll_gather(comm, x, y, 16, GCOLL_FLOAT32, root);
    else
        st = gcoll_scatter(comm, x, y, 16, GCOLL_FLOAT32, root);
    const char *how = "the call";
    if (st == GCOLL_OK) {
        how = "the next call";
        st = gcoll_barrier(comm);
    }
    checks++;
    if (st != GCOLL_ERR_MISMATCH)
        FAIL("mismatch %s: %s gave %s (%s), expected GCOLL_ERR_MISMATCH", kind, how,
             gcoll_status_string(st), gcoll_comm_last_error(comm));
    else
        printf("rank %d: mismatch %s: %s failed as expected after %.2f s: %s (%s)\n", rank, kind,
               how, now() - t0, gcoll_status_string(st), gcoll_comm_last_error(comm));
    return failures;
}

/* ---- timing (not a test: docs/results/rooted.md) ------------------------------------- */

/* Time per call of each rooted collective (or the one named), root 0, bytes per rank from 8 B to
 * `max` in steps of 4x: the slowest rank's mean over enough calls to fill about 0.2 s, after 3
 * warm-up calls. Rank 0 prints "kind bytes us". */
static int run_time(size_t max, const char *only)
{
    static const char *const kinds[] = {"reduce", "gather", "scatter"};
    uint8_t *a = calloc(max * (size_t)size, 1), *b = calloc(max * (size_t)size, 1);
    for (int k = 0; k < 3; k++) {
        if (only && strcmp(only, kinds[k]) != 0)
            continue;
        for (size_t bytes = 8; bytes <= max; bytes *= 4) {
            size_t n = bytes / 4;
            int iters = 3;
            double per = 0;
            for (int round = 0; round < 2; round++) { /* warm-up, then the measurement */
                gcoll_barrier(comm);
                double t0 = now();
                for (int i = 0; i < iters; i++) {
                    gcoll_status_t st =
                        k == 0   ? gcoll_reduce(comm, a, b, n, GCOLL_FLOAT32, GCOLL_SUM, 0)
                        : k == 1 ? gcoll_gather(comm, a, b, n, GCOLL_FLOAT32, 0)
                                 : gcoll_scatter(comm, a, b, n, GCOLL_FLOAT32, 0);
                    if (st != GCOLL_OK) {
                        FAIL("%s of %zu bytes: %s", kinds[k], bytes, gcoll_status_string(st));
                        return failures;
                    }
                }
                double t = (now() - t0) / iters;
                gcoll_allreduce(comm, &t, &per, 1, GCOLL_FLOAT64, GCOLL_MAX);
                iters = (int)(0.2 / per) + 1;
                if (iters > 2000)
                    iters = 2000;
            }
            if (rank == 0)
                printf("%s %zu %.1f\n", kinds[k], bytes, per * 1e6);
        }
    }
    free(a);
    free(b);
    return failures;
}

/* Rank `victim` exits while its 64 MiB block of a gather is on its way to root 0 (over
 * UCX between ranks of one host: being written into the root's recvbuf, or read by it);
 * the root must fail fast, within the timeout. The other senders only wait for the root:
 * their sends may complete or fail with its abort, in time either way. The victim's exit
 * status is 3. */
static int run_die(int victim)
{
    const char *tm = getenv("GCOLL_TIMEOUT_MS");
    const double limit = (tm ? atof(tm) / 1000.0 : 300.0) + 5;
    size_t count = 16 << 20;
    float *x = calloc(count, sizeof(float));
    float *g = rank == 0 ? calloc(count * (size_t)size, sizeof(float)) : NULL;
    if (!x || (rank == 0 && !g)) {
        FAIL("out of memory");
        return failures;
    }
    if (gcoll_gather(comm, x, g, 1000, GCOLL_FLOAT32, 0) != GCOLL_OK)
        FAIL("warm-up gather");
    if (rank == victim) {
        gcoll_request_t *req;
        gcoll_igather(comm, x, NULL, count, GCOLL_FLOAT32, 0, &req);
        usleep(2000);
        printf("rank %d: exiting in the middle of a gather\n", rank);
        fflush(stdout);
        _exit(3);
    }
    double t0 = now();
    gcoll_status_t st = gcoll_gather(comm, x, g, count, GCOLL_FLOAT32, 0);
    double dt = now() - t0;
    free(x);
    free(g);
    checks++;
    if (dt > limit)
        FAIL("the gather took %.1f s to end (limit %.1f s)", dt, limit);
    else if (rank == 0 && st == GCOLL_OK)
        FAIL("the root's gather from a dead peer succeeded");
    else if (rank == 0)
        printf("rank 0: gather from a dead peer failed as expected after %.2f s: %s | %s\n", dt,
               gcoll_status_string(st), gcoll_comm_last_error(comm));
    else
        printf("rank %d: its part of the gather ended: %s\n", rank, gcoll_status_string(st));
    return failures;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "all";
    const char *algo = getenv("GCOLL_ROOTED_ALGO");
    tree_exact = !algo                         ? 0
                 : strcmp(algo, "tree") == 0   ? 1
                 : strcmp(algo, "chain") == 0  ? 2
                 : strcmp(algo, "linear") == 0 ? 3
                                               : 0;
    if (getenv("ROOTED_CHECK_TREE_ORDER")) /* the script's control: claim it anyway */
        tree_exact = atoi(getenv("ROOTED_CHECK_TREE_ORDER"));
    gcoll_status_t st = gcoll_comm_init(&comm);
    if (st != GCOLL_OK) {
        fprintf(stderr, "rooted_check: gcoll_comm_init: %s\n", gcoll_status_string(st));
        return 1;
    }
    rank = gcoll_comm_rank(comm);
    size = gcoll_comm_size(comm);
    double t0 = now();
    int bad;
    if (strcmp(mode, "all") == 0)
        bad = run_all();
    else if (strcmp(mode, "late") == 0)
        bad = run_late();
    else if (strcmp(mode, "invalid") == 0)
        bad = run_invalid();
    else if (strcmp(mode, "time") == 0)
        bad =
            run_time(argc > 2 ? strtoul(argv[2], NULL, 10) : 16u << 20, argc > 3 ? argv[3] : NULL);
    else if (strcmp(mode, "mismatch") == 0)
        bad = run_mismatch(argc > 2 ? argv[2] : "reduce");
    else if (strcmp(mode, "die") == 0)
        bad = run_die(argc > 2 ? atoi(argv[2]) : 1);
    else {
        fprintf(stderr, "rooted_check: unknown mode '%s'\n", mode);
        return 2;
    }
    gcoll_comm_destroy(comm);
    if (bad) {
        fprintf(stderr, "rank %d: %d of %d checks FAILED\n", rank, failures, checks);
        return 1;
    }
    printf("rank %d/%d: %s: %d checks passed in %.2f s\n", rank, size, mode, checks, now() - t0);
    return 0;
}
