/* test_config.c: typed parsers, the configuration table, status and dtype names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/config.h"
#include "base/util.h"

static void test_parse_size(void **state)
{
    (void)state;
    size_t v;
    assert_int_equal(gcoll_parse_size("123", &v), 0);
    assert_int_equal(v, 123);
    assert_int_equal(gcoll_parse_size("8kb", &v), 0);
    assert_int_equal(v, 8192);
    assert_int_equal(gcoll_parse_size("2MB", &v), 0);
    assert_int_equal(v, 2u << 20);
    assert_int_equal(gcoll_parse_size("1GiB", &v), 0);
    assert_int_equal(v, 1u << 30);
    assert_int_equal(gcoll_parse_size("1.5k", &v), 0);
    assert_int_equal(v, 1536);
    assert_int_equal(gcoll_parse_size(" 4 m", &v), 0);
    assert_int_equal(v, 4u << 20);
    const char *bad[] = {"", "kb", "-1", "12xb", "1.3", "99999999999tb", "nan", "0x10q"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(gcoll_parse_size(bad[i], &v), -1);
}

static void test_parse_duration(void **state)
{
    (void)state;
    int64_t v;
    assert_int_equal(gcoll_parse_duration_ms("500ms", &v), 0);
    assert_int_equal(v, 500);
    assert_int_equal(gcoll_parse_duration_ms("300", &v), 0);
    assert_int_equal(v, 300);
    assert_int_equal(gcoll_parse_duration_ms("2s", &v), 0);
    assert_int_equal(v, 2000);
    assert_int_equal(gcoll_parse_duration_ms("1.5m", &v), 0);
    assert_int_equal(v, 90000);
    assert_int_equal(gcoll_parse_duration_ms("1h", &v), 0);
    assert_int_equal(v, 3600000);
    assert_int_equal(gcoll_parse_duration_ms("soon", &v), -1);
    assert_int_equal(gcoll_parse_duration_ms("5 parsecs", &v), -1);
    assert_int_equal(gcoll_parse_duration_ms("-5s", &v), -1);
}

static void test_parse_misc(void **state)
{
    (void)state;
    long l;
    int b, e;
    assert_int_equal(gcoll_parse_long("42", 0, 100, &l), 0);
    assert_int_equal(l, 42);
    assert_int_equal(gcoll_parse_long("101", 0, 100, &l), -1);
    assert_int_equal(gcoll_parse_long("4x", 0, 100, &l), -1);
    assert_int_equal(gcoll_parse_bool("Yes", &b), 0);
    assert_int_equal(b, 1);
    assert_int_equal(gcoll_parse_bool("off", &b), 0);
    assert_int_equal(b, 0);
    assert_int_equal(gcoll_parse_bool("maybe", &b), -1);
    assert_int_equal(gcoll_parse_enum("ucx", "auto|tcp|ucx|verbs", &e), 0);
    assert_int_equal(e, 2);
    assert_int_equal(gcoll_parse_enum("uc", "auto|tcp|ucx|verbs", &e), -1);
    assert_int_equal(gcoll_parse_enum("verbsx", "auto|tcp|ucx|verbs", &e), -1);
}

static void test_config_load(void **state)
{
    (void)state;
    gcoll_config_t cfg;
    char err[512];
    unsetenv("GCOLL_TIMEOUT_MS");
    assert_int_equal(gcoll_config_load(&cfg, err, sizeof(err)), GCOLL_OK);
    assert_int_equal(cfg.timeout_ms, 1800000);
    assert_int_equal(cfg.tcp_nsocks, 2);
    assert_int_equal(cfg.rank, -1);
    gcoll_config_free(&cfg);

    setenv("GCOLL_TIMEOUT_MS", "2s", 1);
    setenv("GCOLL_TCP_NSOCKS", "4", 1);
    assert_int_equal(gcoll_config_load(&cfg, err, sizeof(err)), GCOLL_OK);
    assert_int_equal(cfg.timeout_ms, 2000);
    assert_int_equal(cfg.tcp_nsocks, 4);
    gcoll_config_free(&cfg);

    /* A bad value is an error that names the variable and what it expects. */
    setenv("GCOLL_TCP_NSOCKS", "99", 1);
    assert_int_equal(gcoll_config_load(&cfg, err, sizeof(err)), GCOLL_ERR_INVALID);
    assert_non_null(strstr(err, "GCOLL_TCP_NSOCKS='99' is invalid"));
    assert_non_null(strstr(err, "1:16"));
    unsetenv("GCOLL_TCP_NSOCKS");

    setenv("GCOLL_DEBUG_SUBSYS", "INIT,BOGUS", 1);
    assert_int_equal(gcoll_config_load(&cfg, err, sizeof(err)), GCOLL_ERR_INVALID);
    assert_non_null(strstr(err, "GCOLL_DEBUG_SUBSYS"));
    unsetenv("GCOLL_DEBUG_SUBSYS");

    /* The job key is never echoed. */
    setenv("GCOLL_JOB_KEY", "sekrit", 1);
    for (size_t i = 0; i < gcoll_param_count(); i++) {
        gcoll_param_info_t p;
        assert_int_equal(gcoll_param_get(i, &p), GCOLL_OK);
        assert_non_null(p.help);
        assert_true(strlen(p.help) > 10);
        if (strcmp(p.name, "GCOLL_JOB_KEY") == 0)
            assert_null(strstr(p.value, "sekrit"));
    }
    assert_int_equal(gcoll_param_get(gcoll_param_count(), &(gcoll_param_info_t){0}),
                     GCOLL_ERR_INVALID);
    unsetenv("GCOLL_JOB_KEY");
    unsetenv("GCOLL_TIMEOUT_MS");
}

static void test_match_hash(void **state)
{
    (void)state;
    gcoll_config_t a, b;
    char err[256];
    assert_int_equal(gcoll_config_load(&a, err, sizeof(err)), GCOLL_OK);
    setenv("GCOLL_TCP_IFNAME", "eth9", 1); /* not must-match */
    assert_int_equal(gcoll_config_load(&b, err, sizeof(err)), GCOLL_OK);
    assert_true(gcoll_config_match_hash(&a) == gcoll_config_match_hash(&b));
    gcoll_config_free(&b);
    setenv("GCOLL_RING_CHUNK", "1mb", 1); /* must-match */
    assert_int_equal(gcoll_config_load(&b, err, sizeof(err)), GCOLL_OK);
    assert_true(gcoll_config_match_hash(&a) != gcoll_config_match_hash(&b));
    char s[1024];
    gcoll_config_match_string(&b, s, sizeof(s));
    assert_non_null(strstr(s, "GCOLL_RING_CHUNK=1048576"));
    gcoll_config_free(&b);
    /* a choice shows as the word the user wrote, never its enum number */
    setenv("GCOLL_TRANSPORT", "ucx", 1);
    setenv("GCOLL_ALGO", "rhd", 1);
    assert_int_equal(gcoll_config_load(&b, err, sizeof(err)), GCOLL_OK);
    gcoll_config_match_string(&b, s, sizeof(s));
    assert_non_null(strstr(s, "GCOLL_TRANSPORT=ucx"));
    assert_non_null(strstr(s, "GCOLL_ALGO=rhd"));
    gcoll_config_match_string(&a, s, sizeof(s));
    assert_non_null(strstr(s, "GCOLL_TRANSPORT=auto"));
    gcoll_config_free(&a);
    gcoll_config_free(&b);
    unsetenv("GCOLL_TRANSPORT");
    unsetenv("GCOLL_ALGO");
    unsetenv("GCOLL_TCP_IFNAME");
    unsetenv("GCOLL_RING_CHUNK");
}

/* gcoll-info's check: a value init would refuse is reported invalid, as init words it. */
static void test_validate(void **state)
{
    (void)state;
    size_t timeout = gcoll_param_count();
    for (size_t i = 0; i < gcoll_param_count(); i++) {
        gcoll_param_info_t p;
        assert_int_equal(gcoll_param_get(i, &p), GCOLL_OK);
        if (strcmp(p.name, "GCOLL_TIMEOUT_MS") == 0)
            timeout = i;
    }
    assert_true(timeout < gcoll_param_count());
    char why[256];
    assert_int_equal(gcoll_param_validate(timeout, why, sizeof(why)), GCOLL_OK);
    setenv("GCOLL_TIMEOUT_MS", "abc", 1);
    assert_int_equal(gcoll_param_validate(timeout, why, sizeof(why)), GCOLL_ERR_INVALID);
    assert_non_null(strstr(why, "GCOLL_TIMEOUT_MS='abc' is invalid: expected"));
    setenv("GCOLL_TIMEOUT_MS", "30s", 1);
    assert_int_equal(gcoll_param_validate(timeout, why, sizeof(why)), GCOLL_OK);
    unsetenv("GCOLL_TIMEOUT_MS");
    assert_int_equal(gcoll_param_validate(gcoll_param_count(), why, sizeof(why)),
                     GCOLL_ERR_INVALID);
}

static void test_names(void **state)
{
    (void)state;
    for (int s = -9; s <= 1; s++) {
        const char *str = gcoll_status_string((gcoll_status_t)s);
        assert_non_null(str);
        assert_int_equal(strncmp(str, "GCOLL_", 6), 0);
        assert_null(strstr(str, "UNKNOWN"));
    }
    assert_non_null(strstr(gcoll_status_string(GCOLL_ERR_TIMEOUT), "TIMEOUT"));
    assert_non_null(strstr(gcoll_status_string((gcoll_status_t)-100), "UNKNOWN"));
    assert_int_equal(gcoll_dtype_size(GCOLL_FLOAT16), 2);
    assert_int_equal(gcoll_dtype_size(GCOLL_INT64), 8);
    assert_int_equal(gcoll_dtype_size((gcoll_dtype_t)77), 0);
    assert_string_equal(gcoll_dtype_name(GCOLL_BFLOAT16), "bfloat16");
    assert_string_equal(gcoll_op_name(GCOLL_PROD), "prod");
    assert_string_equal(gcoll_version(), "0.1.0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size), cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_parse_misc), cmocka_unit_test(test_config_load),
        cmocka_unit_test(test_match_hash), cmocka_unit_test(test_validate),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
