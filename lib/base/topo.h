/* topo.h: where the progress thread runs: the choice, a pure function of a described machine
 * (unit-tested on synthetic topologies), and the description of this machine (hwloc). */
#ifndef GCOLL_TOPO_H
#define GCOLL_TOPO_H

#include <sched.h>
#include <stddef.h>

/* What the choice knows about the machine and the job. */
typedef struct {
    cpu_set_t allowed;  /* CPUs the caller may run on (its affinity) */
    cpu_set_t near;     /* CPUs close to the NIC; empty when unknown */
    const int *core_of; /* core_of[cpu]: the physical core of each CPU, SMT siblings share it,
                           -1 when unknown; NULL when the topology is unknown altogether */
    int ncore_of;       /* entries in core_of */
    long local_rank;    /* this process among the local_size ranks on the host (-1: unset) */
    long local_size;
} gcoll_topo_machine_t;

/* The CPU for the progress thread of GCOLL_PROGRESS_CPU=auto, or -1 to leave it unpinned;
 * why says which cores the choice saw and why it chose or declined.
 * With a core map: nothing when there are fewer than two allowed cores per local rank
 * (pinning would take a core from compute); otherwise the first local_size cores are the
 * compute cores (local rank k computes on core k, where launchers binding by core put it),
 * and local rank r gets the r-th free core, free cores near the NIC first, so every local
 * rank has a core of its own, apart from every compute core and its SMT siblings.
 * Without one (no hwloc): the (n/2 + local_rank)-th of the n allowed CPUs when n is at least
 * twice local_size, as gcoll did before it read the topology. */
int gcoll_topo_choose(const gcoll_topo_machine_t *m, char *why, size_t whylen);

/* The CPU for the progress thread given GCOLL_PROGRESS_CPU=want ("auto", "none" or a CPU
 * number) and the network interface the transport uses (nic, NULL when unknown), or -1 to
 * leave it unpinned; why names the NIC, the CPUs near it and the reason. A CPU number the
 * caller may not run on is refused with a warning. For auto, loads the topology with hwloc
 * when built with it (some ms); the affinity read is the calling thread's. */
int gcoll_topo_progress_cpu(const char *want, const char *nic, long local_rank, long local_size,
                            char *why, size_t whylen);

/* The name of the interface whose address routes to hostport ("host:port", "[v6]:port"),
 * e.g. "lo" for 127.0.0.1: the one the bootstrap and TCP transport use when GCOLL_TCP_IFNAME
 * is unset. Sends nothing. Returns 0, or -1 when it cannot tell. */
int gcoll_topo_route_ifname(const char *hostport, char *ifname, size_t len);

/* "0-3,8,10-11" ("none" when empty) into buf. */
void gcoll_topo_cpulist(const cpu_set_t *set, char *buf, size_t len);

#endif /* GCOLL_TOPO_H */
