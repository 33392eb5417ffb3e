#!/bin/sh
# test-strangers.sh: strangers at the rendezvous port and at a rank's TCP data port are
# refused and logged while 3 ranks started by hand (GCOLL_RANK/SIZE/ROOT/JOB_KEY) complete
# their job on time.
#
#   tests/integration/test-strangers.sh [RUNS] [CASES]
# RUNS (default STRANGER_RUNS or 5) runs of every case; CASES among
#   spray   issue 25's case: one stranger writes ten 4 KiB random chunks 0.2 s apart while
#           the ranks start (reconnecting whenever it is dropped)
#   mixed   many strangers at once, before, during and after the ranks connect: a flood of
#           150 silent connections held to the job's end (more than the acceptor keeps
#           pending), stalled handshakes, garbage, early closes, sprays, a wrong key
#   data    the same kinds at rank 0's TCP data listener while it waits for rank 2
# STRANGER_VERBOSE=1 prints rank 0's log and the strangers' output of every run.
# Prints one line per failed run and a summary per case; exits 1 if any run failed.
. "$(dirname "$0")/lib.sh"

runs=${1:-${STRANGER_RUNS:-5}}
cases=${2:-spray mixed data}
# From the last rank's start, a run takes about a second without strangers; strangers may
# cost it half a second per 128 of them queued ahead of a rank, never their 5 s handshake
# deadline.
max_secs=${STRANGER_MAX_SECS:-8}

export GCOLL_SIZE=3 GCOLL_JOB_KEY=0123456789abcdef0123456789abcdef GCOLL_TIMEOUT_MS=30s
export GCOLL_TRANSPORT=tcp

# stranger MODE ADDR [seconds] [count]: one intruder in the background. It ends by itself,
# or when settle creates the stop file: never by a signal, since a process id this shell
# no longer waits for may belong to anyone by then.
stranger() {
    INTRUDER_STOP="$TMP/stop" timeout 40 "$INTRUDER" "$@" >>"$TMP/strangers.log" 2>&1 &
    run_pids="$run_pids $!"
}

# until_open N: waits (up to 10 s) until N strangers have said their connections are open.
until_open() {
    for _ in $(seq 200); do
        [ "$(grep -c 'connection(s) open' "$TMP/strangers.log")" -ge "$1" ] && return 0
        sleep 0.05
    done
    note "$case run $i: only $(grep -c 'connection(s) open' "$TMP/strangers.log") of $1 strangers got in"
    tail -n 5 "$TMP/strangers.log"
}

# rank R [extra env]: starts rank R of the job at $root in the background.
rank() {
    r=$1
    shift
    env GCOLL_RANK="$r" GCOLL_ROOT="$root" "$@" timeout 60 "$DEMO" 20000 >"$TMP/r$r.log" 2>&1 &
    eval "p$r=\$!"
}

# Waits for the ranks, stops this run's strangers, checks statuses, time and logs.
settle() {
    wait "$p0"; s0=$?
    wait "$p1"; s1=$?
    wait "$p2"; s2=$?
    took=$(( $(date +%s) - start ))
    touch "$TMP/stop"
    for p in $run_pids; do wait "$p" 2>/dev/null; done
    rm -f "$TMP/stop"
    run_pids=""
    [ -n "${STRANGER_VERBOSE:-}" ] && cat "$TMP/r0.log" "$TMP/strangers.log"
    if [ "$s0$s1$s2" != "000" ] || [ "$took" -gt "$max_secs" ]; then
        bad=$((bad + 1))
        fail "$case run $i: exit statuses $s0 $s1 $s2 after ${took} s"
        tail -n 8 "$TMP/r0.log" "$TMP/r1.log" "$TMP/r2.log"
        return 1
    fi
    if ! grep -q "$1" "$TMP/r0.log"; then
        bad=$((bad + 1))
        fail "$case run $i: rank 0 did not log the strangers ('$1')"
        tail -n 8 "$TMP/r0.log"
        return 1
    fi
    return 0
}

run_spray() {
    stranger spray "$root"
    rank 0
    sleep 0.5 # the stranger is in (and dropped, and back) when the others come up
    rank 1
    rank 2
    start=$(date +%s)
    settle "refused connection from .*bad handshake magic"
}

run_mixed() {
    # before rank 0 listens: they dial until it does
    stranger silent "$root" 30 150
    stranger stall "$root" 30 5
    stranger garbage "$root" 30 5
    stranger early "$root" 0 10
    stranger wrongkey "$root"
    stranger spray "$root"
    sleep 0.2
    rank 0
    until_open 3 # rank 0 meets the first strangers before the other ranks connect
    stranger spray "$root"
    stranger stall "$root" 30 3
    rank 1
    stranger early "$root" 0 10
    stranger garbage "$root" 30 3
    rank 2
    start=$(date +%s)
    # after: the rendezvous may be over already; they must change nothing either way
    sleep 0.3
    stranger silent "$root" 30 20
    stranger spray "$root"
    settle "refused connection from\\|dropped connection from"
}

run_data() {
    start=$(date +%s)
    rank 0 GCOLL_DEBUG=info GCOLL_DEBUG_SUBSYS=NET
    rank 1
    # rank 0's data listener is up once it waits at the rendezvous (for rank 2)
    dport=""
    for _ in $(seq 100); do
        dport=$(sed -n 's/.*tcp: listening on \([^ ]*\) port \([0-9]*\).*/\1:\2/p' "$TMP/r0.log")
        [ -n "$dport" ] && break
        sleep 0.05
    done
    if [ -z "$dport" ]; then
        bad=$((bad + 1))
        fail "$case run $i: rank 0 did not log its data port"
        rank 2
        settle "."
        return 1
    fi
    stranger silent "$dport" 30 150
    stranger stall "$dport" 30 5
    stranger garbage "$dport" 30 5
    stranger wrongkey "$dport"
    stranger spray "$dport"
    until_open 3 # queued at rank 0's data port before rank 2 lets the ranks connect
    rank 2
    start=$(date +%s)
    stranger early "$dport" 0 10
    settle "refused connection from\\|dropped connection from"
}

run_pids=""
for case in $cases; do
    bad=0
    t0=$(date +%s)
    for i in $(seq "$runs"); do
        root="127.0.0.1:$(free_port)"
        : >"$TMP/strangers.log"
        "run_$case"
    done
    note "$case: $runs run(s), $bad failed, $(( $(date +%s) - t0 )) s"
    [ "$bad" -eq 0 ] && pass "strangers ($case): $runs run(s) without a failure"
done
finish
