/* test_train_idx.c: gcoll-train's IDX loader and data set checks on small files written here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef GCOLL_TRAIN_HAVE_ZLIB
#include <zlib.h>
#endif

#include "train/data.h"
#include "train/idx.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "%s/gcoll-train-idx.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* An IDX image of n items of rows x cols bytes (ndims 3) or a label file (ndims 1). */
static size_t make_idx(uint8_t *buf, unsigned ndims, uint32_t n, uint32_t rows, uint32_t cols,
                       uint8_t first)
{
    size_t len = 0;
    buf[len++] = 0;
    buf[len++] = 0;
    buf[len++] = 0x08;
    buf[len++] = (uint8_t)ndims;
    uint32_t dims[3] = {n, rows, cols};
    for (unsigned i = 0; i < ndims; i++) {
        buf[len++] = (uint8_t)(dims[i] >> 24);
        buf[len++] = (uint8_t)(dims[i] >> 16);
        buf[len++] = (uint8_t)(dims[i] >> 8);
        buf[len++] = (uint8_t)dims[i];
    }
    size_t total = n;
    if (ndims == 3)
        total *= (size_t)rows * cols;
    for (size_t i = 0; i < total; i++)
        buf[len++] = (uint8_t)((first + i) % (ndims == 1 ? 10 : 256));
    return len;
}

static const char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return p;
}

static void write_plain(const char *name, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

#ifdef GCOLL_TRAIN_HAVE_ZLIB
static void write_gz(const char *name, const uint8_t *buf, size_t len)
{
    gzFile g = gzopen(path_of(name), "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(g), Z_OK);
}
#endif

/* Loading must fail with a message containing want (and the file's name). */
static void expect_error(const char *name, unsigned ndims, const char *want)
{
    train_idx_t idx = {0};
    char err[512] = "";
    assert_int_equal(train_idx_load(path_of(name), ndims, &idx, err, sizeof(err)), -1);
    assert_null(idx.data);
    if (!strstr(err, want) || !strstr(err, name))
        fail_msg("loading %s: message '%s' lacks '%s'", name, err, want);
}

static void test_valid_plain(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t len = make_idx(buf, 3, 3, 2, 5, 7);
    write_plain("img", buf, len);
    train_idx_t idx = {0};
    char err[256] = "";
    assert_int_equal(train_idx_load(path_of("img"), 3, &idx, err, sizeof(err)), 0);
    assert_int_equal(idx.items, 3);
    assert_int_equal(idx.item_size, 10);
    assert_int_equal(idx.dims[1], 2);
    assert_int_equal(idx.dims[2], 5);
    for (int i = 0; i < 30; i++)
        assert_int_equal(idx.data[i], 7 + i);
    train_idx_free(&idx);
}

static void test_gzipped(void **state)
{
    (void)state;
    uint8_t buf[70000];
    size_t len = make_idx(buf, 3, 100, 20, 30, 1); /* 60000 bytes: several gzip blocks */
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    write_gz("img.gz", buf, len);
    train_idx_t idx = {0};
    char err[256] = "";
    assert_int_equal(train_idx_load(path_of("img.gz"), 3, &idx, err, sizeof(err)), 0);
    assert_int_equal(idx.items, 100);
    assert_int_equal(idx.item_size, 600);
    assert_memory_equal(idx.data, buf + 16, 60000);
    train_idx_free(&idx);
    /* a gzip stream cut in the middle, and one with its trailer's CRC broken */
    FILE *f = fopen(path_of("img.gz"), "rb");
    assert_non_null(f);
    static uint8_t gz[80000];
    size_t glen = fread(gz, 1, sizeof(gz), f);
    fclose(f);
    assert_true(glen > 100);
    write_plain("cut.gz", gz, glen / 2);
    expect_error("cut.gz", 3, "");
    gz[glen - 6] ^= 0x55;
    write_plain("crc.gz", gz, glen);
    expect_error("crc.gz", 3, "corrupt gzip");
#else
    (void)len;
    uint8_t gz[16] = {0x1f, 0x8b, 8, 0};
    write_plain("img.gz", gz, sizeof(gz));
    expect_error("img.gz", 3, "without zlib");
#endif
}

static void test_truncated(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t len = make_idx(buf, 3, 3, 2, 5, 0);
    write_plain("short-data", buf, len - 1);
    expect_error("short-data", 3, "truncated: 29 of 30 data bytes");
    write_plain("short-hdr", buf, 9);
    expect_error("short-hdr", 3, "truncated header");
    write_plain("short-magic", buf, 2);
    expect_error("short-magic", 3, "truncated");
    write_plain("empty", buf, 0);
    expect_error("empty", 3, "truncated");
    write_plain("trailing", buf, len);
    FILE *f = fopen(path_of("trailing"), "ab");
    fputc(0, f);
    fclose(f);
    expect_error("trailing", 3, "trailing bytes");
#ifdef GCOLL_TRAIN_HAVE_ZLIB
    write_gz("short.gz", buf, len - 3);
    expect_error("short.gz", 3, "truncated");
#endif
}

static void test_bad_magic(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t len = make_idx(buf, 3, 3, 2, 5, 0);
    buf[0] = 0x12;
    write_plain("magic", buf, len);
    expect_error("magic", 3, "not an IDX file");
    buf[0] = 0;
    buf[2] = 0x0d; /* float elements: not ours */
    write_plain("type", buf, len);
    expect_error("type", 3, "not an IDX file");
    buf[2] = 0x08;
    write_plain("dims", buf, len);
    expect_error("dims", 1, "has 3 dimensions, expected 1");
    buf[7] = 0; /* zero items */
    write_plain("zero", buf, len);
    expect_error("zero", 3, "implausible");
    buf[4] = 0xff; /* 4 billion items: refused before any allocation */
    buf[7] = 3;
    write_plain("huge", buf, len);
    expect_error("huge", 3, "implausible");
    expect_error("no-such-file", 3, "No such file");
}

/* A whole data set directory: loads; then each kind of inconsistency is refused. */
static void write_set(int ntrain, int ntrain_labels, uint8_t bad_label)
{
    uint8_t buf[4096];
    size_t len = make_idx(buf, 3, (uint32_t)ntrain, 4, 4, 0);
    write_plain("train-images-idx3-ubyte", buf, len);
    len = make_idx(buf, 1, (uint32_t)ntrain_labels, 0, 0, 0);
    if (bad_label)
        buf[8] = bad_label;
    write_plain("train-labels-idx1-ubyte", buf, len);
    len = make_idx(buf, 3, 5, 4, 4, 3);
    write_plain("t10k-images-idx3-ubyte", buf, len);
    len = make_idx(buf, 1, 5, 0, 0, 3);
    write_plain("t10k-labels-idx1-ubyte", buf, len);
}

static void test_dataset(void **state)
{
    (void)state;
    train_data_t d;
    char err[512] = "";
    write_set(12, 12, 0);
    assert_int_equal(train_data_load(dir, &d, err, sizeof(err)), 0);
    assert_int_equal(d.train.n, 12);
    assert_int_equal(d.train.dim, 16);
    assert_int_equal(d.test.n, 5);
    assert_int_equal(d.test.y[0], 3);
    uint32_t idx[2] = {11, 0};
    float x[32];
    uint8_t y[2];
    train_gather(&d.train, idx, 2, x, y);
    assert_int_equal(y[0], 1);
    assert_true(x[0] == (float)(11 * 16 % 256) / 255.0f);
    train_data_free(&d);

    write_set(12, 11, 0);
    assert_int_equal(train_data_load(dir, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "12 images but"));
    write_set(12, 12, 10);
    assert_int_equal(train_data_load(dir, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "label 10"));
    char p[512];
    snprintf(p, sizeof(p), "%s/nowhere", dir);
    assert_int_equal(train_data_load(p, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "train-images-idx3-ubyte.gz: No such file"));
}

static void test_permutation(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint32_t a[N], b[N];
    int seen[N] = {0};
    train_permutation(a, N, 7, 0);
    train_permutation(b, N, 7, 0);
    assert_memory_equal(a, b, sizeof(a));
    for (int i = 0; i < N; i++)
        seen[a[i]]++;
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    train_permutation(b, N, 7, 1);
    assert_memory_not_equal(a, b, sizeof(a));
    train_permutation(b, N, 8, 0);
    assert_memory_not_equal(a, b, sizeof(a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_plain), cmocka_unit_test(test_gzipped),
        cmocka_unit_test(test_truncated),   cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_dataset),     cmocka_unit_test(test_permutation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
