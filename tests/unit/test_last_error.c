/* test_last_error.c: gcoll_last_error(), the calling thread's last error message (issue 33,
 * item 6), after a failed init and a bad compressor spec, with the log silenced. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gcoll.h"

static void test_failed_init(void **state)
{
    (void)state;
    setenv("GCOLL_TIMEOUT_MS", "abc", 1);
    gcoll_comm_t *comm = NULL;
    assert_int_equal(gcoll_comm_init_rank(1, 0, NULL, &comm), GCOLL_ERR_INVALID);
    unsetenv("GCOLL_TIMEOUT_MS");
    assert_null(comm);
    const char *err = gcoll_last_error();
    assert_non_null(strstr(err, "gcoll_comm_init failed"));
    assert_non_null(strstr(err, "GCOLL_TIMEOUT_MS='abc' is invalid"));
    /* the communicator-less query answers the same */
    assert_string_equal(gcoll_comm_last_error(NULL), err);
}

static void test_bad_spec(void **state)
{
    (void)state;
    gcoll_compressor_t *c = NULL;
    assert_int_equal(gcoll_compressor_create("topk:density=2", &c), GCOLL_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(gcoll_last_error(), "compressor spec 'topk:density=2'"));
    assert_int_equal(gcoll_compressor_create("nosuchcodec", &c), GCOLL_ERR_INVALID);
    assert_non_null(strstr(gcoll_last_error(), "'nosuchcodec'"));
}

static void *other_thread(void *arg)
{
    *(const char **)arg = gcoll_last_error();
    return NULL;
}

/* Per thread: another thread's failure is not this one's. */
static void test_per_thread(void **state)
{
    (void)state;
    gcoll_compressor_t *c = NULL;
    assert_int_equal(gcoll_compressor_create("bogus", &c), GCOLL_ERR_INVALID);
    const char *seen = NULL;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &seen), 0);
    pthread_join(th, NULL);
    assert_non_null(seen);
    assert_string_equal(seen, "");
    assert_non_null(strstr(gcoll_last_error(), "bogus"));
}

int main(void)
{
    setenv("GCOLL_DEBUG", "none", 1); /* nothing logged: the message must not be lost */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_init),
        cmocka_unit_test(test_bad_spec),
        cmocka_unit_test(test_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
