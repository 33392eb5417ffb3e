/* test_group.c: who owns a group (gcoll_group_start/end) on a 1-rank communicator: calls
 * made by the thread that opened it are held until its end, nested groups are one group,
 * another thread's calls run at once and it can neither open nor end that group (until
 * it is closed), an end without a start is refused, and a grouped request cannot be
 * waited for before its group ends. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gcoll.h"

static int setup(void **state)
{
    gcoll_comm_t *comm = NULL;
    setenv("GCOLL_DEBUG", "none", 1); /* the refusals below warn */
    if (gcoll_comm_init_rank(1, 0, NULL, &comm) != GCOLL_OK)
        return -1;
    *state = comm;
    return 0;
}

static int teardown(void **state)
{
    return gcoll_comm_destroy(*state) == GCOLL_OK ? 0 : -1;
}

typedef struct {
    gcoll_comm_t *comm;
    gcoll_status_t start, end, allreduce;
    int32_t sum;
} other_t;

static void *other_thread(void *arg)
{
    other_t *o = arg;
    o->start = gcoll_group_start(o->comm);
    o->end = gcoll_group_end(o->comm);
    int32_t x = 21;
    o->allreduce = gcoll_allreduce(o->comm, &x, &o->sum, 1, GCOLL_INT32, GCOLL_SUM);
    return NULL;
}

static void test_owner(void **state)
{
    gcoll_comm_t *comm = *state;
    assert_int_equal(gcoll_group_end(comm), GCOLL_ERR_INVALID); /* none open */
    int32_t out[3] = {1, 2, 3}, in[3] = {0}, back[3] = {0};
    gcoll_request_t *s = NULL, *r = NULL;
    assert_int_equal(gcoll_group_start(comm), GCOLL_OK);
    assert_int_equal(gcoll_group_start(comm), GCOLL_OK); /* nested */
    assert_int_equal(gcoll_isend(comm, out, 3, GCOLL_INT32, 0, &s), GCOLL_OK);
    assert_int_equal(gcoll_irecv(comm, in, 3, GCOLL_INT32, 0, &r), GCOLL_OK);
    assert_int_equal(gcoll_wait(r), GCOLL_ERR_INVALID); /* its group has not run */
    /* another thread: its calls are not the group's, and the group is not its own */
    other_t o = {.comm = comm};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
    pthread_join(th, NULL);
    assert_int_equal(o.start, GCOLL_ERR_INVALID);
    assert_int_equal(o.end, GCOLL_ERR_INVALID);
    assert_int_equal(o.allreduce, GCOLL_OK);
    assert_int_equal(o.sum, 21);
    assert_int_equal(gcoll_group_end(comm), GCOLL_OK); /* the inner one: nothing runs */
    int done = 1;
    assert_int_equal(gcoll_test(r, &done), GCOLL_OK);
    assert_int_equal(done, 0);
    assert_int_equal(in[0], 0);
    /* blocking calls in the group: a send to itself then its receive complete at the end */
    assert_int_equal(gcoll_send(comm, in, 0, GCOLL_INT32, 0), GCOLL_OK);
    assert_int_equal(gcoll_recv(comm, back, 0, GCOLL_INT32, 0), GCOLL_OK);
    assert_int_equal(gcoll_group_end(comm), GCOLL_OK); /* the outer one: all run */
    assert_int_equal(gcoll_wait(s), GCOLL_OK);
    assert_int_equal(gcoll_wait(r), GCOLL_OK);
    assert_memory_equal(in, out, sizeof(out));
    assert_int_equal(gcoll_group_end(comm), GCOLL_ERR_INVALID); /* closed */
    /* closed: another thread may open one now */
    o = (other_t){.comm = comm};
    assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
    pthread_join(th, NULL);
    assert_int_equal(o.start, GCOLL_OK);
    assert_int_equal(o.end, GCOLL_OK);
    assert_int_equal(o.allreduce, GCOLL_OK);
}

/* Blocking send then blocking receive of a rank to itself inside a group, with data. */
static void test_self_blocking(void **state)
{
    gcoll_comm_t *comm = *state;
    double out[5] = {1.5, -2, 3, 4e10, 0.25}, in[5] = {0};
    for (int round = 0; round < 3; round++) {
        assert_int_equal(gcoll_group_start(comm), GCOLL_OK);
        assert_int_equal(gcoll_send(comm, out, 5, GCOLL_FLOAT64, 0), GCOLL_OK);
        assert_int_equal(gcoll_recv(comm, in, 5, GCOLL_FLOAT64, 0), GCOLL_OK);
        assert_int_equal(gcoll_group_end(comm), GCOLL_OK);
        assert_memory_equal(in, out, sizeof(out));
        out[0] += 1;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_self_blocking, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
