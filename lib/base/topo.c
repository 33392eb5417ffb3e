/* topo.c: progress-thread placement: a free core near the NIC, apart from the compute cores. */
#include "base/topo.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/config.h"
#include "base/util.h"

#ifdef HAVE_HWLOC
#include <hwloc.h>
#if HWLOC_API_VERSION >= 0x00020000 /* the I/O type filters are hwloc 2 API */
#define TOPO_HWLOC 1
#endif
#endif

static void why_add(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Appends to why (truncating). */
static void why_add(char *why, size_t len, const char *fmt, ...)
{
    size_t n = strnlen(why, len);
    if (n + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + n, len - n, fmt, ap);
    va_end(ap);
}

void gcoll_topo_cpulist(const cpu_set_t *set, char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
            e++;
        if (e == c)
            why_add(buf, len, "%s%d", buf[0] ? "," : "", c);
        else
            why_add(buf, len, "%s%d-%d", buf[0] ? "," : "", c, e);
        c = e;
    }
    if (!buf[0])
        snprintf(buf, len, "none");
}

/* ---------------------------------------------------------------------------------- */
/* The choice                                                                           */

/* One core with at least one allowed CPU, in the order of its first allowed CPU. */
typedef struct {
    int id;   /* core_of value, or -2 - cpu for a CPU of unknown core (a core of its own) */
    int cpu;  /* its first allowed CPU: where a progress thread put on it runs */
    int near; /* one of its allowed CPUs is near the NIC */
} core_t;

static int core_id(const gcoll_topo_machine_t *m, int cpu)
{
    if (cpu < m->ncore_of && m->core_of[cpu] >= 0)
        return m->core_of[cpu];
    return -2 - cpu;
}

/* Today's rule without a topology: the second half of the allowed CPUs, one per local rank. */
static int choose_flat(const gcoll_topo_machine_t *m, long lrank, long lsize, char *why,
                       size_t whylen)
{
    int ncpu = CPU_COUNT(&m->allowed);
    char cpus[256];
    gcoll_topo_cpulist(&m->allowed, cpus, sizeof(cpus));
    if (ncpu < 2 * lsize) {
        why_add(why, whylen,
                "%d CPU(s) (%s) for %ld local rank(s), fewer than two per rank: "
                "pinning would take a CPU from compute",
                ncpu, cpus, lsize);
        return -1;
    }
    long k = ncpu / 2 + lrank, seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &m->allowed) && seen++ == k) {
            why_add(why, whylen,
                    "no topology: the second half of the allowed CPUs (%s), one per "
                    "local rank (local rank %ld of %ld)",
                    cpus, lrank, lsize);
            return c;
        }
    }
    return -1; /* not reached: k < ncpu */
}

int gcoll_topo_choose(const gcoll_topo_machine_t *m, char *why, size_t whylen)
{
    if (whylen)
        why[0] = '\0';
    long lsize = m->local_size > 0 ? m->local_size : 1;
    long lrank = m->local_rank > 0 ? m->local_rank % lsize : 0;
    if (!m->core_of)
        return choose_flat(m, lrank, lsize, why, whylen);

    core_t cores[CPU_SETSIZE];
    short core_idx[CPU_SETSIZE]; /* allowed CPU -> index in cores */
    int ncores = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &m->allowed))
            continue;
        int id = core_id(m, c), j = 0;
        while (j < ncores && cores[j].id != id)
            j++;
        if (j == ncores)
            cores[ncores++] = (core_t){.id = id, .cpu = c, .near = 0};
        cores[j].near |= CPU_ISSET(c, &m->near) != 0;
        core_idx[c] = (short)j;
    }
    char allowed[256];
    gcoll_topo_cpulist(&m->allowed, allowed, sizeof(allowed));
    if (ncores < 2 * lsize) {
        why_add(why, whylen,
                "%d core(s) (CPUs %s) for %ld local rank(s), fewer than two per "
                "rank: pinning would take a core from compute",
                ncores, allowed, lsize);
        return -1;
    }
    /* Local rank k computes on core k; the rest are free, those near the NIC first. */
    cpu_set_t compute, near_allowed;
    CPU_ZERO(&compute);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &m->allowed) && core_idx[c] < lsize)
            CPU_SET(c, &compute);
    CPU_AND(&near_allowed, &m->near, &m->allowed);
    long nfree_near = 0, seen = 0;
    for (int j = (int)lsize; j < ncores; j++)
        nfree_near += cores[j].near;
    int pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; pass++)
        for (int j = (int)lsize; j < ncores && pick < 0; j++)
            if (cores[j].near == (pass == 0) && seen++ == lrank)
                pick = j;
    char near[256], comp[256];
    gcoll_topo_cpulist(&m->near, near, sizeof(near));
    gcoll_topo_cpulist(&compute, comp, sizeof(comp));
    if (cores[pick].near)
        why_add(why, whylen, "a free core near the NIC");
    else if (CPU_COUNT(&m->near) == 0)
        why_add(why, whylen, "no NIC locality: free core %ld of %d, in CPU order", lrank + 1,
                ncores - (int)lsize);
    else if (CPU_COUNT(&near_allowed) == 0)
        why_add(why, whylen, "a free core; the NIC's CPUs %s are not allowed here", near);
    else if (nfree_near == 0)
        why_add(why, whylen, "a free core, not near the NIC: its CPUs %s are compute cores", near);
    else
        why_add(why, whylen,
                "a free core, not near the NIC: its %ld free core(s) (CPUs %s) went "
                "to local ranks 0-%ld",
                nfree_near, near, nfree_near - 1);
    why_add(why, whylen,
            "; local rank %ld of %ld, compute cores on CPUs %s, %d core(s) allowed "
            "(CPUs %s)",
            lrank, lsize, comp, ncores, allowed);
    return cores[pick].cpu;
}

/* ---------------------------------------------------------------------------------- */
/* This machine                                                                         */

#ifdef TOPO_HWLOC
/* Discovery gcoll does not need: libpciaccess (hwloc's Linux backend reads the same PCI
 * tree from sysfs, and libpciaccess leaks a block at every load) and GPU runtimes. */
static const char *const skipped_components[] = {"pci",  "opencl", "gl",       "cuda",
                                                 "nvml", "rsmi",   "levelzero"};

static void bitmap_to_cpuset(hwloc_const_bitmap_t b, cpu_set_t *set)
{
    CPU_ZERO(set);
    for (int i = hwloc_bitmap_first(b); i >= 0 && i < CPU_SETSIZE; i = hwloc_bitmap_next(b, i))
        CPU_SET(i, set);
}

/* Fills core_of (CPU -> core) and near (the CPUs close to nic) from this machine's topology;
 * why says what hwloc knows of the NIC. Returns 0, or -1 when hwloc cannot load it. */
static int describe_machine(const char *nic, int *core_of, int ncore_of, cpu_set_t *near, char *why,
                            size_t whylen)
{
    hwloc_topology_t topo;
    CPU_ZERO(near);
    if (hwloc_topology_init(&topo) != 0) {
        why_add(why, whylen, "hwloc cannot start; ");
        return -1;
    }
    int rc = -1;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if HWLOC_API_VERSION >= 0x00020100
    for (size_t i = 0; i < GCOLL_ARRAY_SIZE(skipped_components); i++)
        hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                      skipped_components[i]); /* unknown names fail: fine */
#endif
    if (hwloc_topology_load(topo) != 0) {
        why_add(why, whylen, "hwloc cannot load the topology: %s; ", strerror(errno));
        goto out_destroy;
    }
    for (int c = 0; c < ncore_of; c++)
        core_of[c] = -1;
    hwloc_obj_t pu = NULL;
    while ((pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, pu)) != NULL) {
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
        if (pu->os_index < (unsigned)ncore_of)
            core_of[pu->os_index] = core ? (int)core->logical_index : -1;
    }
    rc = 0;
    if (!nic) {
        why_add(why, whylen, "NIC unknown; ");
        goto out_destroy;
    }
    hwloc_obj_t dev = NULL;
    while ((dev = hwloc_get_next_osdev(topo, dev)) != NULL)
        if (dev->name && strcmp(dev->name, nic) == 0)
            break;
    hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
    if (!dev) {
        why_add(why, whylen, "NIC %s: no device hwloc knows (a virtual or loopback interface); ",
                nic);
    } else if (!anc || !anc->cpuset ||
               hwloc_bitmap_isincluded(hwloc_topology_get_topology_cpuset(topo), anc->cpuset)) {
        why_add(why, whylen, "NIC %s: hwloc attaches it to the whole machine; ", nic);
    } else {
        char cpus[256];
        bitmap_to_cpuset(anc->cpuset, near);
        gcoll_topo_cpulist(near, cpus, sizeof(cpus));
        why_add(why, whylen, "NIC %s near %s %u (CPUs %s); ", nic, hwloc_obj_type_string(anc->type),
                anc->logical_index, cpus);
    }
out_destroy:
    hwloc_topology_destroy(topo);
    return rc;
}
#endif

int gcoll_topo_progress_cpu(const char *want, const char *nic, long local_rank, long local_size,
                            char *why, size_t whylen)
{
    if (whylen)
        why[0] = '\0';
    if (!want || !*want)
        want = "auto";
    if (strcmp(want, "none") == 0) {
        why_add(why, whylen, "GCOLL_PROGRESS_CPU=none");
        return -1;
    }
    gcoll_topo_machine_t m = {.local_rank = local_rank, .local_size = local_size};
    CPU_ZERO(&m.near);
    if (sched_getaffinity(0, sizeof(m.allowed), &m.allowed) != 0) {
        why_add(why, whylen, "cannot read the CPU affinity: %s", strerror(errno));
        return -1;
    }
    if (strcmp(want, "auto") != 0) {
        long v;
        char cpus[256];
        if (gcoll_parse_long(want, 0, CPU_SETSIZE - 1, &v) != 0 || !CPU_ISSET(v, &m.allowed)) {
            gcoll_topo_cpulist(&m.allowed, cpus, sizeof(cpus));
            GCOLL_WARN("GCOLL_PROGRESS_CPU='%s' is not an allowed CPU (allowed: %s); progress "
                       "thread not pinned",
                       want, cpus);
            why_add(why, whylen, "GCOLL_PROGRESS_CPU='%s' is not an allowed CPU (allowed: %s)",
                    want, cpus);
            return -1;
        }
        why_add(why, whylen, "GCOLL_PROGRESS_CPU=%ld", v);
        return (int)v;
    }
    int *core_of = NULL;
#ifdef TOPO_HWLOC
    /* Fewer CPUs than two per local rank are fewer cores too: no topology needed to decline. */
    if (CPU_COUNT(&m.allowed) < 2 * (local_size > 0 ? local_size : 1)) {
        why_add(why, whylen, "NIC %s; ", nic ? nic : "unknown");
    } else {
        uint64_t t0 = gcoll_time_ns();
        core_of = malloc(CPU_SETSIZE * sizeof(*core_of));
        if (core_of && describe_machine(nic, core_of, CPU_SETSIZE, &m.near, why, whylen) == 0) {
            m.core_of = core_of;
            m.ncore_of = CPU_SETSIZE;
        }
        GCOLL_DEBUG(GCOLL_SUBSYS_INIT, "hwloc topology read in %.1f ms",
                    (double)(gcoll_time_ns() - t0) / 1e6);
    }
#else
    why_add(why, whylen, "NIC %s, built without hwloc; ", nic ? nic : "unknown");
#endif
    size_t n = strnlen(why, whylen);
    int cpu = gcoll_topo_choose(&m, why + n, whylen - n);
    free(core_of);
    return cpu;
}

/* The interface holding address sa, or -1. */
static int ifname_of(const struct sockaddr *sa, char *ifname, size_t len)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0)
        return -1;
    int rc = -1;
    for (struct ifaddrs *i = ifa; i && rc != 0; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family)
            continue;
        int same = sa->sa_family == AF_INET
                       ? memcmp(&((const struct sockaddr_in *)sa)->sin_addr,
                                &((const struct sockaddr_in *)i->ifa_addr)->sin_addr,
                                sizeof(struct in_addr)) == 0
                       : memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr,
                                &((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                                sizeof(struct in6_addr)) == 0;
        if (same && strlen(i->ifa_name) < len) {
            snprintf(ifname, len, "%s", i->ifa_name);
            rc = 0;
        }
    }
    freeifaddrs(ifa);
    return rc;
}

int gcoll_topo_route_ifname(const char *hostport, char *ifname, size_t len)
{
    char host[256], port[16];
    if (!hostport || len == 0 ||
        gcoll_split_hostport(hostport, host, sizeof(host), port, sizeof(port)) != 0)
        return -1;
    /* A connected UDP socket has the source address the route gives, and sends nothing. */
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    int rc = -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        rc = ifname_of((struct sockaddr *)&ss, ifname, len);
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return rc;
}
