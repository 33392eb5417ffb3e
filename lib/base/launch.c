/* launch.c: what a launcher tells a rank: its rank and size (gcoll's variables, Open MPI's,
 * Slurm's, PMI's), the rendezvous under srun, the address of GCOLL_TCP_IFNAME. */
#include "base/launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/log.h"
#include "base/util.h"

/* First variable of a launcher's family that is set, or NULL. */
static const char *first_env(const char *const *names, const char **which)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

gcoll_status_t gcoll_launch_identity(int *size_p, int *rank_p, char *err, size_t errlen)
{
    int size = *size_p, rank = *rank_p;
    static const char *const rank_vars[] = {"GCOLL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                                            "PMI_RANK", NULL};
    static const char *const size_vars[] = {"GCOLL_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS",
                                            "PMI_SIZE", NULL};
    if (size < 0 || rank < 0) {
        const char *rv, *sv, *rname = NULL, *sname = NULL;
        long r, s;
        rv = first_env(rank_vars, &rname);
        sv = first_env(size_vars, &sname);
        if (!rv || !sv) {
            snprintf(err, errlen,
                     "cannot tell this process's rank and size: set GCOLL_RANK and "
                     "GCOLL_SIZE (gcoll-run does), or run under mpirun or srun");
            return GCOLL_ERR_INVALID;
        }
        if (gcoll_parse_long(rv, 0, 1 << 20, &r) || gcoll_parse_long(sv, 1, 1 << 20, &s)) {
            snprintf(err, errlen, "%s='%s' / %s='%s' are not a valid rank and size", rname, rv,
                     sname, sv);
            return GCOLL_ERR_INVALID;
        }
        rank = (int)r;
        size = (int)s;
        GCOLL_INFO(GCOLL_SUBSYS_INIT, "rank %d of %d from %s/%s", rank, size, rname, sname);
    }
    if (size < 1 || rank < 0 || rank >= size) {
        snprintf(err, errlen, "rank %d is not within size %d", rank, size);
        return GCOLL_ERR_INVALID;
    }
    *rank_p = rank;
    *size_p = size;
    return GCOLL_OK;
}

/* IPv4 address of GCOLL_TCP_IFNAME, which overrides the route to the root. */
gcoll_status_t gcoll_launch_ifname_ip(const char *ifname, char *ip, size_t len, char *err,
                                      size_t errlen)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0) {
        snprintf(err, errlen, "getifaddrs: %s", strerror(errno));
        return GCOLL_ERR_TRANSPORT;
    }
    gcoll_status_t st = GCOLL_ERR_INVALID;
    for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || strcmp(i->ifa_name, ifname) != 0)
            continue;
        if (i->ifa_addr->sa_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, (socklen_t)len);
            st = GCOLL_OK;
            break;
        }
    }
    freeifaddrs(ifa);
    if (st != GCOLL_OK)
        snprintf(err, errlen, "GCOLL_TCP_IFNAME='%s' names no interface with an IPv4 address",
                 ifname);
    return st;
}

/* Under srun without GCOLL_ROOT: task 0 runs on the step's first node, so the rendezvous
 * is there, at a port derived from the job and step ids (the same on every task; steps of
 * one job differ, and so do jobs unless their ids are 1400 apart and run at once on the same
 * node). Writes "host:port" into buf; 0 on success. */
int gcoll_launch_slurm_root(char *buf, size_t len)
{
    const char *list = getenv("SLURM_STEP_NODELIST");
    if (!list || !*list)
        list = getenv("SLURM_JOB_NODELIST");
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    long jobid, stepid = 0;
    if (!list || !*list || !job || gcoll_parse_long(job, 0, LONG_MAX, &jobid) != 0)
        return -1;
    if (step && gcoll_parse_long(step, 0, LONG_MAX, &stepid) != 0)
        stepid = 0;
    /* the first host of a list such as "node[03-05,9]-ib,other": prefix, first number,
     * suffix */
    char host[256];
    size_t n = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[' && n + 1 < sizeof(host))
        host[n++] = *p++;
    if (*p == '[') {
        for (p++; *p && *p != '-' && *p != ',' && *p != ']' && n + 1 < sizeof(host); p++)
            host[n++] = *p;
        while (*p && *p != ']')
            p++;
        if (*p == ']')
            p++;
        while (*p && *p != ',' && *p != '[' && n + 1 < sizeof(host))
            host[n++] = *p++;
    }
    host[n] = '\0';
    if (n == 0)
        return -1;
    int port = GCOLL_DERIVED_PORT_MIN + (int)((jobid % 1400) * 16 + stepid % 16);
    snprintf(buf, len, "%s:%d", host, port);
    return 0;
}

/* mpirun exports the job id (PMIx's namespace) and the local size to every rank: with all
 * ranks on one host the rendezvous can be on loopback at a port only this job derives.
 * Across hosts rank 0's host is not in the environment (the head node's address is
 * mpirun's, not rank 0's), so GCOLL_ROOT stays required there. */
int gcoll_launch_mpirun_root(char *buf, size_t len)
{
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char *job = getenv("PMIX_NAMESPACE");
    if (!job || !*job)
        job = getenv("OMPI_MCA_ess_base_jobid");
    long world, local;
    if (!ws || !ls || !job || !*job || gcoll_parse_long(ws, 1, LONG_MAX, &world) != 0 ||
        gcoll_parse_long(ls, 1, LONG_MAX, &local) != 0 || local != world)
        return -1;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the job id */
    for (const char *p = job; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    snprintf(buf, len, "127.0.0.1:%d", GCOLL_DERIVED_PORT_MIN + (int)(h % GCOLL_DERIVED_PORTS));
    return 0;
}

void gcoll_launch_local(long *local_rank, long *local_size)
{
    static const char *const pairs[][2] = {
        {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}};
    if (*local_rank >= 0 && *local_size > 0)
        return;
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        const char *rv = getenv(pairs[i][0]), *sv = getenv(pairs[i][1]);
        long r, s;
        if (!rv || !sv || gcoll_parse_long(sv, 1, 1 << 20, &s) != 0 ||
            gcoll_parse_long(rv, 0, s - 1, &r) != 0)
            continue;
        if (*local_rank < 0)
            *local_rank = r;
        if (*local_size <= 0)
            *local_size = s;
        return;
    }
}

/* The launcher's word that every rank of its job is on this host: gcoll-run's
 * GCOLL_LOCAL_SIZE = GCOLL_SIZE, torchrun's LOCAL_WORLD_SIZE = WORLD_SIZE, Open MPI's
 * local size = world size, or a Slurm step on one node. Ranks a launcher started in
 * network namespaces of their own (the shaped-link benches) carry none of these. */
int gcoll_launch_one_host(char *desc, size_t len)
{
    static const char *const pairs[][2] = {{"GCOLL_LOCAL_SIZE", "GCOLL_SIZE"},
                                           {"LOCAL_WORLD_SIZE", "WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"},
                                           {"SLURM_STEP_NUM_NODES", NULL}};
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        const char *lv = getenv(pairs[i][0]), *wv = pairs[i][1] ? getenv(pairs[i][1]) : "1";
        long local, world;
        if (!lv || !*lv || !wv || !*wv || gcoll_parse_long(lv, 1, LONG_MAX, &local) != 0 ||
            gcoll_parse_long(wv, 1, LONG_MAX, &world) != 0)
            continue;
        if (local != world)
            return 0; /* the first launcher found speaks for the job */
        if (pairs[i][1])
            snprintf(desc, len, "%s=%s of %s=%s", pairs[i][0], lv, pairs[i][1], wv);
        else
            snprintf(desc, len, "%s=%s", pairs[i][0], lv);
        return 1;
    }
    return 0;
}
