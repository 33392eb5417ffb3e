/* test_launch.c: the rendezvous addresses derived from a launcher's job id (launch.c) are
 * the same for every rank of a job, differ between jobs and steps, and stay below Linux's
 * ephemeral ports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/launch.h"

static int port_of(const char *addr)
{
    const char *c = strrchr(addr, ':');
    assert_non_null(c);
    return atoi(c + 1);
}

static void in_range(int port)
{
    assert_true(port >= GCOLL_DERIVED_PORT_MIN);
    assert_true(port < GCOLL_DERIVED_PORT_MIN + GCOLL_DERIVED_PORTS);
    assert_true(port < 32768); /* the default ephemeral range starts there */
}

static void test_mpirun(void **state)
{
    (void)state;
    char a[64], b[64], job[64];
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    int distinct = 0, last = -1;
    for (int j = 0; j < 2000; j++) {
        snprintf(job, sizeof(job), "prterun-vm-%d@1", 1000 + j * 7);
        setenv("PMIX_NAMESPACE", job, 1);
        assert_int_equal(gcoll_launch_mpirun_root(a, sizeof(a)), 0);
        assert_int_equal(gcoll_launch_mpirun_root(b, sizeof(b)), 0);
        assert_string_equal(a, b); /* every rank derives the same */
        assert_true(strncmp(a, "127.0.0.1:", 10) == 0);
        in_range(port_of(a));
        distinct += port_of(a) != last;
        last = port_of(a);
    }
    assert_true(distinct > 1900);
    /* ranks on several hosts: no derived address */
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    assert_int_equal(gcoll_launch_mpirun_root(a, sizeof(a)), -1);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("PMIX_NAMESPACE");
}

static void test_slurm(void **state)
{
    (void)state;
    char a[256], jid[32], sid[32];
    setenv("SLURM_STEP_NODELIST", "node[03-05,9]-ib,other", 1);
    for (long j = 0; j < 5000; j += 3)
        for (int s = 0; s < 20; s += 7) {
            snprintf(jid, sizeof(jid), "%ld", j);
            snprintf(sid, sizeof(sid), "%d", s);
            setenv("SLURM_JOB_ID", jid, 1);
            setenv("SLURM_STEP_ID", sid, 1);
            assert_int_equal(gcoll_launch_slurm_root(a, sizeof(a)), 0);
            assert_true(strncmp(a, "node03-ib:", 10) == 0);
            in_range(port_of(a));
        }
    /* steps of one job, and neighbouring jobs, meet at different ports */
    setenv("SLURM_JOB_ID", "1234", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    assert_int_equal(gcoll_launch_slurm_root(a, sizeof(a)), 0);
    int p0 = port_of(a);
    setenv("SLURM_STEP_ID", "1", 1);
    assert_int_equal(gcoll_launch_slurm_root(a, sizeof(a)), 0);
    assert_int_not_equal(port_of(a), p0);
    setenv("SLURM_JOB_ID", "1235", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    assert_int_equal(gcoll_launch_slurm_root(a, sizeof(a)), 0);
    assert_int_not_equal(port_of(a), p0);
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_STEP_ID");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpirun),
        cmocka_unit_test(test_slurm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
