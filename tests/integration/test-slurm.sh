#!/bin/sh
# test-slurm.sh: a one-node Slurm cluster of this machine (Debian's slurm-wlm, started here
# under a temporary directory with auth/none, and stopped at the end), then `srun -n 4` of
# gcoll-demo and of every collective's exit check. The ranks read SLURM_PROCID and
# SLURM_NTASKS, and find the rendezvous from SLURM_STEP_NODELIST and the job id: no
# GCOLL_ROOT. Also `mpirun -np 4` when Open MPI is installed. Skips (77) with a reason
# when slurm-wlm is not installed.
. "$(dirname "$0")/lib.sh"
EXIT_CHECK="$top_builddir/tests/integration/exit_check"
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1; then
    echo "SKIP: slurm-wlm is not installed (apt-get install slurm-wlm)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: a test Slurm cluster needs root (slurmd)"
    exit 77
fi
host=$(hostname -s)
S="$TMP/slurm"
mkdir -p "$S/state" "$S/spool"
ctlport=$(free_port)
dport=$(free_port)
cat >"$S/slurm.conf" <<CONF
ClusterName=gcolltest
SlurmctldHost=$host
SlurmctldPort=$ctlport
SlurmdPort=$dport
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES State=UP OverSubscribe=YES MaxTime=10
CONF
export SLURM_CONF="$S/slurm.conf"
stop_slurm() {
    for f in "$S/slurmd.pid" "$S/slurmctld.pid"; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    sleep 1
    for f in "$S/slurmd.pid" "$S/slurmctld.pid"; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    done
    cleanup
}
trap stop_slurm EXIT INT TERM
slurmctld -i -f "$SLURM_CONF" >"$S/ctld.out" 2>&1
slurmd -f "$SLURM_CONF" >"$S/d.out" 2>&1
up=0
for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then up=1; break; fi
    sleep 0.5
done
if [ "$up" -ne 1 ]; then
    echo "SKIP: the test Slurm cluster did not come up"
    tail -n 20 "$S/slurmctld.log" "$S/slurmd.log" 2>/dev/null
    exit 77
fi
export GCOLL_JOB_KEY=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
out="$TMP/srun-demo.log"
if timeout 120 srun -O -n 4 -t 2 "$DEMO" >"$out" 2>&1 &&
    [ "$(grep -c 'verified (0 wrong)' "$out")" -eq 4 ]; then
    pass "srun -n 4 gcoll-demo: 4 ranks verified, rendezvous from Slurm's variables"
else
    fail "srun -n 4 gcoll-demo"
    tail -n 20 "$out"
fi
for mode in bcast allreduce allgather reduce_scatter alltoall sparse topk q8 mixed; do
    if timeout 120 srun -O -n 4 -t 2 "$EXIT_CHECK" "$mode" 5 1001 >"$TMP/srun-$mode.log" 2>&1; then
        pass "srun -n 4 exit_check $mode"
    else
        fail "srun -n 4 exit_check $mode"
        tail -n 10 "$TMP/srun-$mode.log"
    fi
done
if command -v mpirun >/dev/null 2>&1; then
    port=$(free_port)
    if timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 -x GCOLL_ROOT=127.0.0.1:$port \
        -x GCOLL_JOB_KEY "$EXIT_CHECK" mixed 5 1001 >"$TMP/mpirun.log" 2>&1; then
        pass "mpirun -np 4 exit_check mixed"
    else
        fail "mpirun -np 4 exit_check mixed"
        tail -n 10 "$TMP/mpirun.log"
    fi
else
    note "mpirun not installed: its case skipped"
fi
finish
