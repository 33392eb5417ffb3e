#!/bin/sh
# test-hier.sh: hosts and the hierarchical allreduce (GCOLL_HIER). 4 ranks started by hand
# on loopback, told apart by GCOLL_HOSTNAME into the layouts aabb, abab (hosts
# interleaved), aaab (uneven: the leaders' scheme) and aaaa (one host: flat), each with
# GCOLL_HIER=1 and aabb also with auto; hier_check checks the layout and every result
# against its own reference. Then: GCOLL_HIER differing between ranks fails init with
# GCOLL_ERR_MISMATCH naming it; counts differing by one element fail every rank in
# seconds; 2 network namespaces x 2 ranks (skipped without root or netns); gcoll-run
# (one host: flat).
. "$(dirname "$0")/lib.sh"
HIER="$top_builddir/tests/integration/hier_check"
ns0=gcoll-hier-t$$-0 ns1=gcoll-hier-t$$-1
trap 'ip netns del "$ns0" 2>/dev/null; ip netns del "$ns1" 2>/dev/null; cleanup' EXIT

# run_layout HOSTS MODE [env...]: one rank per comma-separated host name; rc.<r>, err.<r>.
run_layout() {
    hosts=$1 mode=$2
    shift 2
    port=$(free_port)
    r=0 pids=""
    n=$(echo "$hosts" | tr ',' '\n' | wc -l)
    for h in $(echo "$hosts" | tr ',' ' '); do
        (env "$@" HIER_HOSTS="$hosts" GCOLL_HOSTNAME="$h" GCOLL_RANK=$r GCOLL_SIZE="$n" \
            GCOLL_ROOT=127.0.0.1:$port GCOLL_TIMEOUT_MS=60s GCOLL_DEBUG=info \
            GCOLL_DEBUG_SUBSYS=COLL timeout -s KILL 120 "$HIER" "$mode" \
            >"$TMP/out.$r" 2>"$TMP/err.$r"
         echo $? >"$TMP/rc.$r") &
        pids="$pids $!"
        r=$((r + 1))
    done
    BG_PIDS="$BG_PIDS $pids"
    for p in $pids; do wait "$p" 2>/dev/null; done
}

# all_rc N WANT: every rank's exit status is WANT.
all_rc() {
    r=0
    while [ "$r" -lt "$1" ]; do
        [ "$(cat "$TMP/rc.$r" 2>/dev/null)" = "$2" ] || return 1
        r=$((r + 1))
    done
}

for layout in a,a,b,b a,b,a,b a,a,a,b a,a,a,a; do
    run_layout "$layout" ok GCOLL_HIER=1
    used=$(grep -c 'gcoll_allreduce of 12000004 bytes: hierarchical' "$TMP/err.0")
    want=1
    [ "$layout" = a,a,a,a ] && want=0
    if all_rc 4 0 && [ "$used" -ge "$want" ] && { [ "$want" -eq 1 ] || [ "$used" -eq 0 ]; }; then
        pass "GCOLL_HIER=1, hosts $layout: layout and results ($(grep -c hierarchical, "$TMP/err.0") hierarchical calls on rank 0)"
    else
        fail "GCOLL_HIER=1, hosts $layout (hierarchical log lines: $used)"
        tail -n 5 "$TMP"/err.*
    fi
done

run_layout a,a,b,b ok
if all_rc 4 0 && grep -q 'gcoll_allreduce of 12000004 bytes: hierarchical, because GCOLL_HIER=auto' "$TMP/err.0" &&
    ! grep -q 'gcoll_allreduce of 4 bytes: hierarchical' "$TMP/err.0"; then
    pass "GCOLL_HIER=auto, hosts a,a,b,b: hierarchical for 12 MB, flat for 4 bytes"
else
    fail "GCOLL_HIER=auto, hosts a,a,b,b"
    tail -n 5 "$TMP"/err.*
fi

# GCOLL_HIER=0 on one rank only: every rank's init fails, naming the setting
port=$(free_port)
pids=""
for r in 0 1 2 3; do
    h=1
    [ "$r" = 3 ] && h=0
    (GCOLL_HIER=$h GCOLL_HOSTNAME=h$((r / 2)) GCOLL_RANK=$r GCOLL_SIZE=4 \
        GCOLL_ROOT=127.0.0.1:$port GCOLL_TIMEOUT_MS=30s timeout -s KILL 60 "$HIER" \
        >/dev/null 2>"$TMP/err.$r"
     echo $? >"$TMP/rc.$r") &
    pids="$pids $!"
done
BG_PIDS="$BG_PIDS $pids"
for p in $pids; do wait "$p" 2>/dev/null; done
if all_rc 4 3 && grep -q 'GCOLL_ERR_MISMATCH.*GCOLL_HIER=' "$TMP/err.0" &&
    grep -q 'GCOLL_ERR_MISMATCH' "$TMP/err.3"; then
    pass "GCOLL_HIER differing between ranks: GCOLL_ERR_MISMATCH at init on every rank"
else
    fail "GCOLL_HIER differing between ranks"
    tail -n 3 "$TMP"/err.*
fi

# counts differing by one element (only in the tail no part covers): errors, not a hang
start=$(date +%s)
run_layout a,a,b,b badcount GCOLL_HIER=1
took=$(($(date +%s) - start))
if all_rc 4 0 && [ "$took" -lt 50 ] && grep -q 'mismatched counts: GCOLL_ERR_MISMATCH' "$TMP/err.0"; then
    pass "hierarchical allreduce with mismatched counts: every rank fails (${took} s)"
else
    fail "mismatched counts (${took} s)"
    tail -n 3 "$TMP"/err.*
fi

# 2 network namespaces ("hosts") x 2 ranks, linked by one veth pair
netns_test() {
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
        note "skip: the netns case needs root and iproute2"
        return
    fi
    if ! ip netns add "$ns0" 2>/dev/null || ! ip netns add "$ns1" 2>/dev/null; then
        ip netns del "$ns0" 2>/dev/null
        note "skip: cannot create network namespaces here"
        return
    fi
    ip link add gch$$a netns "$ns0" type veth peer name gch$$b netns "$ns1" &&
        ip -n "$ns0" addr add 10.79.0.1/24 dev gch$$a && ip -n "$ns1" addr add 10.79.0.2/24 dev gch$$b &&
        ip -n "$ns0" link set gch$$a up && ip -n "$ns1" link set gch$$b up &&
        ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for r in 0 1 2 3; do
        ns=$ns0
        [ "$r" -ge 2 ] && ns=$ns1
        (ip netns exec "$ns" env GCOLL_HIER=1 HIER_HOSTS=n0,n0,n1,n1 GCOLL_HOSTNAME=n$((r / 2)) \
            GCOLL_RANK=$r GCOLL_SIZE=4 GCOLL_ROOT=10.79.0.1:29611 GCOLL_JOB_KEY="$key" \
            GCOLL_TIMEOUT_MS=60s GCOLL_DEBUG=info GCOLL_DEBUG_SUBSYS=COLL,NET \
            timeout -s KILL 120 "$HIER" >"$TMP/out.$r" 2>"$TMP/err.$r"
         echo $? >"$TMP/rc.$r") &
        pids="$pids $!"
    done
    BG_PIDS="$BG_PIDS $pids"
    for p in $pids; do wait "$p" 2>/dev/null; done
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    if all_rc 4 0 && grep -q 'bytes: hierarchical' "$TMP/err.0"; then
        pass "2 network namespaces x 2 ranks, GCOLL_HIER=1"
    else
        fail "2 network namespaces x 2 ranks"
        tail -n 5 "$TMP"/err.*
    fi
    # tcp stripes large messages to the other namespace's ranks only: rank 0 finds rank 1
    # at its own address, ranks 2 and 3 at the other's
    if grep -q 'tcp: rank 1 is on this host' "$TMP/err.0" &&
        ! grep -q 'tcp: rank [23] is on this host' "$TMP/err.0" &&
        grep -q 'tcp: rank 2 is on this host' "$TMP/err.3"; then
        pass "tcp: peers at this rank's address unstriped, the other host's striped"
    else
        fail "tcp's same-host detection: $(grep -h 'is on this host' "$TMP"/err.* | head -4)"
    fi
}
netns_test

# gcoll-run: one host, so GCOLL_HIER=1 runs flat and the layout says one host
if GCOLL_HIER=1 timeout 120 "$gcoll_run" -n 4 "$HIER" >"$TMP/run.log" 2>&1; then
    pass "gcoll-run -n 4 with GCOLL_HIER=1 (one host)"
else
    fail "gcoll-run -n 4"
    tail -n 20 "$TMP/run.log"
fi
finish
