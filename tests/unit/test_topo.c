/* test_topo.c: progress-thread placement on synthetic machines (sockets, SMT numberings, NIC
 * locality known or not, oversubscription, random machines against invariants), and once on
 * this machine through hwloc. */
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <setjmp.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/topo.h"

/* A synthetic machine of ncores cores with smt CPUs each, numbered as Linux does on Intel
 * (CPU c and c + ncores are SMT siblings) or, with adjacent, as on many AMD machines (siblings
 * next to each other). Every CPU is allowed, no NIC locality. */
typedef struct {
    gcoll_topo_machine_t m;
    int core_of[CPU_SETSIZE];
} synth_t;

static void synth(synth_t *s, int ncores, int smt, int adjacent)
{
    memset(s, 0, sizeof(*s));
    CPU_ZERO(&s->m.allowed);
    CPU_ZERO(&s->m.near);
    for (int c = 0; c < CPU_SETSIZE; c++)
        s->core_of[c] = -1;
    for (int c = 0; c < ncores * smt; c++) {
        s->core_of[c] = adjacent ? c / smt : c % ncores;
        CPU_SET(c, &s->m.allowed);
    }
    s->m.core_of = s->core_of;
    s->m.ncore_of = CPU_SETSIZE;
    s->m.local_rank = 0;
    s->m.local_size = 1;
}

static void set_range(cpu_set_t *set, int lo, int hi)
{
    for (int c = lo; c <= hi; c++)
        CPU_SET(c, set);
}

static char why[2048];

static int choose(synth_t *s, long lrank, long lsize)
{
    s->m.local_rank = lrank;
    s->m.local_size = lsize;
    int cpu = gcoll_topo_choose(&s->m, why, sizeof(why));
    assert_true(why[0] != '\0');
    return cpu;
}

static void assert_why(const char *part)
{
    if (!strstr(why, part))
        fail_msg("reason '%s' does not say '%s'", why, part);
}

static void test_two_sockets_nic_on_socket1(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 16, 1, 0); /* socket 0: cores 0-7, socket 1: cores 8-15 */
    set_range(&s.m.near, 8, 15);
    assert_int_equal(choose(&s, 0, 1), 8);
    assert_why("near the NIC");
    assert_int_equal(choose(&s, 0, 2), 8);
    assert_int_equal(choose(&s, 1, 2), 9);
    for (int r = 0; r < 8; r++) /* eight ranks compute on socket 0, progress on socket 1 */
        assert_int_equal(choose(&s, r, 8), 8 + r);
}

static void test_nic_on_socket0(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 16, 1, 0);
    set_range(&s.m.near, 0, 7);
    /* ranks 0 and 1 compute on cores 0 and 1: the progress threads take 2 and 3 */
    assert_int_equal(choose(&s, 0, 2), 2);
    assert_int_equal(choose(&s, 1, 2), 3);
    assert_why("near the NIC");
    /* eight ranks fill socket 0 with compute: progress goes to socket 1 and says why */
    assert_int_equal(choose(&s, 0, 8), 8);
    assert_why("are compute cores");
}

static void test_smt_siblings(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 4, 2, 0);                    /* Intel numbering: 0/4, 1/5, 2/6, 3/7 are siblings */
    assert_int_equal(choose(&s, 0, 1), 1); /* not 4, the caller's sibling */
    assert_int_equal(choose(&s, 0, 2), 2);
    assert_int_equal(choose(&s, 1, 2), 3);
    synth(&s, 4, 2, 1); /* adjacent numbering: 0/1, 2/3, ... */
    assert_int_equal(choose(&s, 0, 1), 2);
    assert_int_equal(choose(&s, 0, 2), 4);
    assert_int_equal(choose(&s, 1, 2), 6);
    /* two sockets of 4 cores, SMT, NIC on socket 1 (cores 4-7: CPUs 4-7 and 12-15) */
    synth(&s, 8, 2, 0);
    set_range(&s.m.near, 4, 7);
    set_range(&s.m.near, 12, 15);
    assert_int_equal(choose(&s, 0, 2), 4);
    assert_int_equal(choose(&s, 1, 2), 5);
    /* one core's two threads are not a spare core */
    synth(&s, 4, 2, 0);
    CPU_ZERO(&s.m.allowed);
    CPU_SET(0, &s.m.allowed);
    CPU_SET(4, &s.m.allowed);
    assert_int_equal(choose(&s, 0, 1), -1);
    assert_why("1 core(s)");
}

static void test_nic_unknown(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 8, 1, 0);
    assert_int_equal(choose(&s, 0, 2), 2);
    assert_why("no NIC locality");
    assert_int_equal(choose(&s, 1, 2), 3);
    assert_int_equal(choose(&s, 0, 1), 1); /* what gcoll chose before on a 2-core machine too */
}

static void test_oversubscribed(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 2, 1, 0); /* this VM: 2 cores, gcoll-run -n 2 */
    assert_int_equal(choose(&s, 0, 2), -1);
    assert_why("fewer than two per rank");
    assert_int_equal(choose(&s, 1, 2), -1);
    assert_int_equal(choose(&s, 0, 1), 1);
    synth(&s, 4, 2, 0); /* 8 CPUs but 4 cores for 3 ranks */
    for (int r = 0; r < 3; r++)
        assert_int_equal(choose(&s, r, 3), -1);
    assert_int_equal(choose(&s, 1, 2), 3);
}

static void test_more_ranks_than_nic_cores(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 16, 1, 0);
    set_range(&s.m.near, 14, 15); /* e.g. a sub-NUMA cluster of two cores */
    assert_int_equal(choose(&s, 0, 4), 14);
    assert_int_equal(choose(&s, 1, 4), 15);
    assert_int_equal(choose(&s, 2, 4), 4);
    assert_why("went to local ranks 0-1");
    assert_int_equal(choose(&s, 3, 4), 5);
}

static void test_affinity_limits(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 16, 1, 0);
    set_range(&s.m.near, 8, 15);
    CPU_ZERO(&s.m.allowed);
    set_range(&s.m.allowed, 0, 7); /* bound to socket 0 by the launcher */
    assert_int_equal(choose(&s, 0, 1), 1);
    assert_why("not allowed here");
    CPU_ZERO(&s.m.allowed); /* holes: every other CPU */
    for (int c = 0; c < 16; c += 2)
        CPU_SET(c, &s.m.allowed);
    assert_int_equal(choose(&s, 0, 2), 8);
    assert_int_equal(choose(&s, 1, 2), 10);
}

static void test_partial_core_map(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 4, 1, 0);
    s.core_of[2] = -1; /* a CPU of unknown core counts as a core of its own */
    s.m.ncore_of = 3;  /* and so does CPU 3, beyond the map */
    assert_int_equal(choose(&s, 0, 2), 2);
    assert_int_equal(choose(&s, 1, 2), 3);
}

static void test_rank_unset(void **state)
{
    (void)state;
    synth_t s;
    synth(&s, 8, 1, 0);
    assert_int_equal(choose(&s, -1, -1), 1);              /* unset: one rank */
    assert_int_equal(choose(&s, 5, 2), choose(&s, 1, 2)); /* out of range: wraps */
}

static void test_no_topology(void **state)
{
    (void)state;
    synth_t s; /* without hwloc: the second half of the allowed CPUs, as before */
    synth(&s, 8, 1, 0);
    s.m.core_of = NULL;
    assert_int_equal(choose(&s, 0, 2), 4);
    assert_int_equal(choose(&s, 1, 2), 5);
    assert_why("no topology");
    assert_int_equal(choose(&s, 0, 1), 4);
    synth(&s, 3, 1, 0);
    s.m.core_of = NULL;
    assert_int_equal(choose(&s, 0, 2), -1);
    assert_why("fewer than two per rank");
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Random machines against what the choice promises, checked by a plain recount. */
static void test_random_machines(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int iter = 0; iter < 3000; iter++) {
        synth_t s;
        int sockets = 1 + (int)(rnd(&x) % 4), per = 1 + (int)(rnd(&x) % 16);
        int smt = 1 + (int)(rnd(&x) % 2), ncores = sockets * per;
        synth(&s, ncores, smt, (int)(rnd(&x) % 2));
        int nsock = (int)(rnd(&x) % (sockets + 1)); /* == sockets: NIC unknown */
        for (int c = 0; c < ncores * smt; c++) {
            if (rnd(&x) % 5 == 0)
                CPU_CLR(c, &s.m.allowed);
            if (nsock < sockets && s.core_of[c] / per == nsock)
                CPU_SET(c, &s.m.near);
        }
        if (CPU_COUNT(&s.m.allowed) == 0)
            CPU_SET(0, &s.m.allowed);
        /* the allowed cores in the order of their first allowed CPU */
        int order[CPU_SETSIZE], first[CPU_SETSIZE], n = 0;
        for (int c = 0; c < ncores * smt; c++) {
            if (!CPU_ISSET(c, &s.m.allowed))
                continue;
            int k = 0;
            while (k < n && order[k] != s.core_of[c])
                k++;
            if (k == n) {
                order[n] = s.core_of[c];
                first[n++] = c;
            }
        }
        long lsize = 1 + (long)(rnd(&x) % 8);
        int near_free = 0;
        for (int k = (int)lsize; k < n; k++)
            near_free += CPU_ISSET(first[k], &s.m.near) ? 1 : 0;
        int used[CPU_SETSIZE] = {0}, nnear = 0;
        for (long r = 0; r < lsize; r++) {
            int cpu = choose(&s, r, lsize);
            if (n < 2 * lsize) {
                assert_int_equal(cpu, -1);
                continue;
            }
            assert_true(cpu >= 0 && CPU_ISSET(cpu, &s.m.allowed));
            int k = 0;
            while (first[k] != cpu) /* the first allowed CPU of its core */
                k++;
            assert_true(k < n);
            assert_true(k >= lsize);      /* not a compute core nor its sibling */
            assert_int_equal(used[k], 0); /* a core of its own */
            used[k] = 1;
            nnear += CPU_ISSET(cpu, &s.m.near) ? 1 : 0;
        }
        if (n >= 2 * lsize) /* as many near the NIC as there are free cores there */
            assert_int_equal(nnear, near_free < lsize ? near_free : (int)lsize);
    }
}

static void test_cpulist(void **state)
{
    (void)state;
    cpu_set_t set;
    char buf[64];
    CPU_ZERO(&set);
    gcoll_topo_cpulist(&set, buf, sizeof(buf));
    assert_string_equal(buf, "none");
    set_range(&set, 0, 3);
    CPU_SET(8, &set);
    set_range(&set, 10, 11);
    CPU_SET(CPU_SETSIZE - 1, &set);
    gcoll_topo_cpulist(&set, buf, sizeof(buf));
    assert_string_equal(buf, "0-3,8,10-11,1023");
    gcoll_topo_cpulist(&set, buf, 6); /* truncated, terminated */
    assert_true(strlen(buf) < 6);
}

static void test_route_ifname(void **state)
{
    (void)state;
    char ifname[IF_NAMESIZE + 1];
    assert_int_equal(gcoll_topo_route_ifname("127.0.0.1:29500", ifname, sizeof(ifname)), 0);
    assert_string_equal(ifname, "lo");
    if (gcoll_topo_route_ifname("[::1]:29500", ifname, sizeof(ifname)) == 0) /* IPv6 may be off */
        assert_string_equal(ifname, "lo");
    assert_int_equal(gcoll_topo_route_ifname("no-port", ifname, sizeof(ifname)), -1);
    assert_int_equal(gcoll_topo_route_ifname(NULL, ifname, sizeof(ifname)), -1);
}

/* The real path: hwloc (when built with it) on this machine, whatever it knows of the NICs. */
static void test_this_machine(void **state)
{
    (void)state;
    cpu_set_t allowed;
    assert_int_equal(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    int ncpu = CPU_COUNT(&allowed), first = 0;
    while (!CPU_ISSET(first, &allowed))
        first++;
    char nic[IF_NAMESIZE + 1] = "";
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *i = ifa; i && !nic[0]; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
                !(i->ifa_flags & IFF_LOOPBACK) && strlen(i->ifa_name) <= IF_NAMESIZE)
                snprintf(nic, sizeof(nic), "%s", i->ifa_name);
        freeifaddrs(ifa);
    }
    const char *nics[] = {nic[0] ? nic : NULL, "lo", "no-such-nic0", NULL};
    for (size_t k = 0; k < sizeof(nics) / sizeof(nics[0]); k++) {
        int cpu = gcoll_topo_progress_cpu("auto", nics[k], 0, 1, why, sizeof(why));
        print_message("NIC %s: CPU %d: %s\n", nics[k] ? nics[k] : "(none)", cpu, why);
        assert_true(why[0] != '\0');
        if (ncpu >= 2)
            assert_true(cpu >= 0 && CPU_ISSET(cpu, &allowed));
        else
            assert_int_equal(cpu, -1);
    }
    /* as many local ranks as CPUs: never pinned */
    assert_int_equal(gcoll_topo_progress_cpu("auto", nics[0], 0, ncpu, why, sizeof(why)), -1);
    assert_why("fewer than two per rank");
    assert_int_equal(gcoll_topo_progress_cpu("none", NULL, 0, 1, why, sizeof(why)), -1);
    char want[16];
    snprintf(want, sizeof(want), "%d", first);
    assert_int_equal(gcoll_topo_progress_cpu(want, NULL, 0, 1, why, sizeof(why)), first);
    assert_int_equal(gcoll_topo_progress_cpu("1023", NULL, 0, 1, why, sizeof(why)),
                     CPU_ISSET(1023, &allowed) ? 1023 : -1);
    assert_int_equal(gcoll_topo_progress_cpu("core7", NULL, 0, 1, why, sizeof(why)), -1);
    assert_why("not an allowed CPU");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_sockets_nic_on_socket1),
        cmocka_unit_test(test_nic_on_socket0),
        cmocka_unit_test(test_smt_siblings),
        cmocka_unit_test(test_nic_unknown),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_more_ranks_than_nic_cores),
        cmocka_unit_test(test_affinity_limits),
        cmocka_unit_test(test_partial_core_map),
        cmocka_unit_test(test_rank_unset),
        cmocka_unit_test(test_no_topology),
        cmocka_unit_test(test_random_machines),
        cmocka_unit_test(test_cpulist),
        cmocka_unit_test(test_route_ifname),
        cmocka_unit_test(test_this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
