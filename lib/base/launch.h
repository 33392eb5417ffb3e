/* launch.h: what a launcher tells a rank (launch.c). Internal. */
#ifndef GCOLL_LAUNCH_H
#define GCOLL_LAUNCH_H

#include <stddef.h>

#include "gcoll.h"

/* Rank and size: *size_p and *rank_p as given when both are >= 0, else from GCOLL_RANK/
 * GCOLL_SIZE, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS or PMI_RANK/PMI_SIZE.
 * GCOLL_ERR_INVALID with the reason in err when none is set or they do not fit. */
gcoll_status_t gcoll_launch_identity(int *size_p, int *rank_p, char *err, size_t errlen);

/* Rendezvous ports derived from a job id lie in [MIN, MIN + PORTS): below Linux's default
 * ephemeral range (32768-60999), where a port taken by any outgoing connection on the host
 * would make rank 0's listen fail (seen: 1 full test run in about 6, with mpirun). */
#define GCOLL_DERIVED_PORT_MIN 10000
#define GCOLL_DERIVED_PORTS 22400

/* Under srun without GCOLL_ROOT: "host:port" of the rendezvous on the step's first node, at
 * a port derived from the job and step ids. 0 on success, -1 when not under Slurm. */
int gcoll_launch_slurm_root(char *buf, size_t len);

/* Under Open MPI's mpirun without GCOLL_ROOT, every rank on this host (local size == world
 * size): "127.0.0.1:port", the port derived from the job id. 0 on success, -1 otherwise
 * (not under mpirun, or ranks on several hosts: GCOLL_ROOT must then be passed). */
int gcoll_launch_mpirun_root(char *buf, size_t len);

/* This process's place among its host's ranks where GCOLL_LOCAL_RANK/GCOLL_LOCAL_SIZE
 * (gcoll-run) left them unset (-1): from Open MPI's local rank and size, else torchrun's
 * LOCAL_RANK and LOCAL_WORLD_SIZE. */
void gcoll_launch_local(long *local_rank, long *local_size);

/* 1 when the launcher says every rank of the job runs on this host (gcoll-run, torchrun,
 * mpirun or srun: desc names the variables that say so), else 0. */
int gcoll_launch_one_host(char *desc, size_t len);

/* The IPv4 address of interface ifname (GCOLL_TCP_IFNAME) into ip. */
gcoll_status_t gcoll_launch_ifname_ip(const char *ifname, char *ip, size_t len, char *err,
                                      size_t errlen);

#endif /* GCOLL_LAUNCH_H */
