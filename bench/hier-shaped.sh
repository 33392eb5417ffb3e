#!/bin/sh
# hier-shaped.sh: hierarchical against flat allreduce on two "hosts": 2 network namespaces
# of RANKS_PER_HOST ranks each (told apart by GCOLL_HOSTNAME), joined by one veth pair
# shaped with tc tbf at RATE in each direction; inside a namespace the ranks talk over its
# own loopback. For dense and each of SPECS, one gcoll-bench allreduce of COUNT floats
# with GCOLL_HIER=0 (flat), GCOLL_HIER=1 (hierarchical) and GCOLL_HIER=auto (the cost
# model's choice, read from rank 0's GCOLL_DEBUG=info line), their ratio, and whether auto
# chose the faster form.
#
#   sudo bench/hier-shaped.sh [BUILD_DIR]      (BUILD_DIR: where tools/ were built, default .)
# Environment: RATE (1gbit), COUNT (25000000), ITERS (3), RANKS_PER_HOST (2),
# SPECS ("topk:density=0.01"). GCOLL_* tuning variables set by the caller reach every rank.
# Needs root, iproute2 and tc; skips with a message where namespaces cannot be made.
# Everything it creates (namespaces gcoll-hns0/1, temp files) is removed on exit.
set -u
BUILD=${1:-.}
BENCH="$BUILD/tools/gcoll-bench"
RATE=${RATE:-1gbit}
COUNT=${COUNT:-25000000}
ITERS=${ITERS:-3}
L=${RANKS_PER_HOST:-2}
SPECS=${SPECS:-"topk:density=0.01"}
PORT=29831
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-hier.XXXXXX")

skip() { echo "hier-shaped: SKIP: $*"; rm -rf "$TMP"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "ip and tc (iproute2) not found"
[ -x "$BENCH" ] || { echo "hier-shaped: $BENCH not built" >&2; exit 1; }

cleanup() {
    ip netns del gcoll-hns0 2>/dev/null
    ip netns del gcoll-hns1 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
ip netns del gcoll-hns0 2>/dev/null
ip netns del gcoll-hns1 2>/dev/null
ip netns add gcoll-hns0 && ip netns add gcoll-hns1 || skip "cannot create network namespaces here"
ip link add gch0 netns gcoll-hns0 type veth peer name gch1 netns gcoll-hns1 || skip "cannot create veth"
for i in 0 1; do
    ip -n gcoll-hns$i addr add "10.78.0.$((i + 1))/24" dev gch$i
    ip -n gcoll-hns$i link set gch$i up
    ip -n gcoll-hns$i link set lo up
    # tbf on both ends: each direction of the host link is limited to RATE
    tc -n gcoll-hns$i qdisc replace dev gch$i root tbf rate "$RATE" burst 512kb latency 100ms ||
        skip "tc tbf is not available"
done

passenv() { env | grep '^GCOLL_' | grep -v '^GCOLL_\(RANK\|SIZE\|ROOT\|JOB_KEY\|HIER\|HOSTNAME\|LOCAL_[A-Z]*\)=' || true; }

# run HIER OUT [gcoll-bench args]: 2 x L ranks; rank 0's CSV goes to OUT.
run() {
    hier=$1 out=$2
    shift 2
    n=$((2 * L))
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    r=0
    while [ "$r" -lt "$n" ]; do
        h=$((r / L))
        dbg=""
        [ "$hier" = auto ] && dbg="GCOLL_DEBUG=info GCOLL_DEBUG_SUBSYS=coll"
        # shellcheck disable=SC2086
        ip netns exec gcoll-hns$h env $(passenv) $dbg GCOLL_HIER="$hier" GCOLL_HOSTNAME="host$h" \
            GCOLL_RANK=$r GCOLL_SIZE=$n GCOLL_ROOT="10.78.0.1:$PORT" GCOLL_JOB_KEY="$key" \
            GCOLL_TIMEOUT_MS=120s timeout 600 "$BENCH" -a 3 -z 2 -c 0 "$@" --csv \
            >"$TMP/rank$r.csv" 2>"$TMP/rank$r.err" &
        pids="$pids $!"
        r=$((r + 1))
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    PORT=$((PORT + 1))
    cp "$TMP/rank0.csv" "$out"
    cp "$TMP/rank0.err" "$out.err"
    [ "$ok" -eq 0 ] || { echo "hier-shaped: gcoll-bench failed:"; cat "$TMP"/rank*.err; }
    return $ok
}

bytes=$((COUNT * 4))
printf '# hier-shaped: 2 hosts x %d ranks, %s per direction between them, one allreduce of %d floats (%d MB), %d iterations; load: %s\n' \
    "$L" "$RATE" "$COUNT" $((bytes / 1000000)) "$ITERS" "$(uptime | sed 's/.*load average: //')"
printf '%-26s %10s %10s %10s %10s %8s %s\n' "allreduce" "flat(s)" "hier(s)" "speedup" "auto(s)" "auto" "right"
# gcoll-bench's CSV: the dense rows carry the time in column 5 (us), compressed in column 3
for spec in dense $SPECS; do
    if [ "$spec" = dense ]; then
        args="-b $bytes -e $bytes -n $ITERS -w 1"
        col=5
    else
        args="--compressor $spec -b $bytes -e $bytes -n $ITERS -w 1"
        col=3
    fi
    # shellcheck disable=SC2086
    run 0 "$TMP/flat.csv" $args >/dev/null 2>&1 || continue
    # shellcheck disable=SC2086
    run 1 "$TMP/hier.csv" $args >/dev/null 2>&1 || continue
    # shellcheck disable=SC2086
    run auto "$TMP/auto.csv" $args >/dev/null 2>&1 || continue
    f=$(awk -F, -v c=$col '/^[0-9]/ {print $c / 1e6}' "$TMP/flat.csv")
    h=$(awk -F, -v c=$col '/^[0-9]/ {print $c / 1e6}' "$TMP/hier.csv")
    a=$(awk -F, -v c=$col '/^[0-9]/ {print $c / 1e6}' "$TMP/auto.csv")
    # the choice logged for this size ("... of N bytes: hierarchical, because ...")
    choice=$(grep -o "of $bytes bytes: [a-z]*" "$TMP/auto.csv.err" | tail -n 1 | sed 's/.*: //')
    awk -v s="$spec" -v f="$f" -v h="$h" -v a="$a" -v ch="${choice:-?}" 'BEGIN {
        best = (h < f) ? "hierarchical" : "flat"
        printf "%-26s %10.3f %10.3f %9.2fx %10.3f %8s %s\n", s, f, h, f / h, a, ch, (ch == best) ? "yes" : "no"}'
done
