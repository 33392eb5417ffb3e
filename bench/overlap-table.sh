#!/bin/sh
# overlap-table.sh: the table of docs/results/overlap.md. Ranks in network namespaces joined through
# a bridge by veth links shaped with tc tbf (RATE per direction); for each model
# tools/gcoll-overlap-bench runs a backward pass whose compute takes as long as the dense
# communication alone (-c match on the dense run, the same compute for the compressed
# runs), at the bucketer's defaults, with priorities on and off (GCOLL_BUCKET_PRIORITY),
# and once with the fixed 25 MiB buckets (GCOLL_BUCKET_BYTES=25mb) for comparison.
#
#   sudo bench/overlap-table.sh [BUILD_DIR]      (BUILD_DIR: where tools/ were built, default .)
# Environment: RANKS_LIST ("2 4"), RATE (1gbit), ITERS (3), MODELS ("8x125000 24x250000
# resnet50": 4 MB in 8 layers, 24 MB in 24 layers, ResNet-50's 161 tensors), SPECS ("none
# topk:density=0.01"). GCOLL_* tuning variables set by the caller reach every rank; with
# ERR_DIR=DIR each run's rank-0 stderr (its GCOLL_DEBUG log) is kept there.
# PIPE_ROUNDS=N (N > 0) prints the other table of docs/results/overlap.md instead: each compressed
# spec with the codec worker on and off (GCOLL_BUCKET_PIPELINE=1 / 0), the two alternating
# N times at the same compute (the first run's -c match) and the same buckets (the automatic
# first layout, GCOLL_BUCKET_REBUILD=0: a rebuild from measured times would cut each run's
# differently), each column the best over rounds.
# Needs root, iproute2 and tc; skips with a message where namespaces cannot be made.
# Everything it creates (namespaces gcov-ns*, gcov-br, temp files) is removed on exit.
set -u
BUILD=${1:-.}
OVERLAP="$BUILD/tools/gcoll-overlap-bench"
RANKS_LIST=${RANKS_LIST:-"2 4"}
RATE=${RATE:-1gbit}
ITERS=${ITERS:-3}
MODELS=${MODELS:-"8x125000 24x250000 resnet50"}
SPECS=${SPECS:-"none topk:density=0.01"}
PORT=29831
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-ovt.XXXXXX")
BR=gcov-br
NMAX=0
skip() { echo "overlap-table: SKIP: $*"; rm -rf "$TMP"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "ip and tc (iproute2) not found"
[ -x "$OVERLAP" ] || { echo "overlap-table: $OVERLAP not built" >&2; exit 1; }
teardown() {
    i=0
    while [ "$i" -lt "$NMAX" ]; do ip netns del "gcov-ns$i" 2>/dev/null; i=$((i + 1)); done
    ip netns del "$BR" 2>/dev/null
}
trap 'teardown; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

# setup N: N namespaces on a bridge, each link shaped to RATE in both directions
setup() {
    teardown
    NMAX=$1
    ip netns add "$BR" || skip "cannot create network namespaces here"
    ip -n "$BR" link add br0 type bridge && ip -n "$BR" link set br0 up || skip "cannot create a bridge"
    for i in $(seq 0 $(($1 - 1))); do
        ns=gcov-ns$i
        ip netns add "$ns" || skip "cannot create namespace $ns"
        ip link add "gv$i" netns "$ns" type veth peer name "gvb$i" netns "$BR" || skip "cannot create veth"
        ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev "gv$i"
        ip -n "$ns" link set "gv$i" up
        ip -n "$ns" link set lo up
        ip -n "$BR" link set "gvb$i" master br0
        ip -n "$BR" link set "gvb$i" up
        tc -n "$ns" qdisc replace dev "gv$i" root tbf rate "$RATE" burst 512kb latency 100ms &&
            tc -n "$BR" qdisc replace dev "gvb$i" root tbf rate "$RATE" burst 512kb latency 100ms ||
            skip "tc tbf is not available"
    done
}

passenv() { env | grep '^GCOLL_' | grep -v '^GCOLL_\(RANK\|SIZE\|ROOT\|JOB_KEY\|LOCAL_[A-Z]*\)=' || true; }

# run N OUT ENV... -- ARGS: one rank per namespace, rank 0's output to OUT
run() {
    n=$1 out=$2
    shift 2
    extra=""
    while [ "$1" != "--" ]; do extra="$extra $1"; shift; done
    shift
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for i in $(seq 0 $((n - 1))); do
        ip netns exec "gcov-ns$i" env $(passenv) $extra GCOLL_RANK="$i" GCOLL_SIZE="$n" \
            GCOLL_ROOT="10.78.0.1:$PORT" GCOLL_JOB_KEY="$key" GCOLL_TIMEOUT_MS=120s \
            timeout 900 "$OVERLAP" -n "$ITERS" "$@" >"$TMP/r$i.out" 2>"$TMP/r$i.err" &
        pids="$pids $!"
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    PORT=$((PORT + 1))
    cp "$TMP/r0.out" "$out"
    [ -z "${ERR_DIR:-}" ] || cp "$TMP/r0.err" "$ERR_DIR/run$PORT.err"
    [ "$ok" -eq 0 ] || { echo "overlap-table: gcoll-overlap-bench failed:" >&2; cat "$TMP"/r*.err >&2; }
    return $ok
}

val() { awk -v k="$2" 'index($0, k) == 1 { sub(k, ""); print $1 + 0; exit }' "$1"; }

# pipe_table: the codec worker on and off, alternating PIPE_ROUNDS times per row
pipe_table() {
    printf '# overlap-table: links %s per direction, %s iterations (best), %s rounds of pipelining on/off, load %s\n' \
        "$RATE" "$ITERS" "$PIPE_ROUNDS" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '%-5s %-10s %-20s %-7s %9s %9s %9s %6s %9s %9s %6s %7s\n' ranks model codec buckets \
        compute comm-p1 overlap-p1 eff-p1 comm-p0 overlap-p0 eff-p0 p0/p1
    for n in $RANKS_LIST; do
        setup "$n"
        for model in $MODELS; do
            for spec in $SPECS; do
                [ "$spec" != none ] || continue
                compute=""
                : >"$TMP/best1"
                : >"$TMP/best0"
                nb="" good=1
                for round in $(seq "$PIPE_ROUNDS"); do
                    for pipe in 1 0; do
                        run "$n" "$TMP/pp" GCOLL_BUCKET_PIPELINE=$pipe GCOLL_BUCKET_REBUILD=0 -- -m "$model" -z "$spec" \
                            -c "${compute:-match}" || { good=0; continue; }
                        [ -n "$compute" ] || compute=$(val "$TMP/pp" "# compute loops")
                        [ -n "$nb" ] || nb=$(sed -n 's/.* in \([0-9]*\) buckets.*/\1/p' "$TMP/pp")
                        printf '%s %s %s\n' "$(val "$TMP/pp" "compute alone")" \
                            "$(val "$TMP/pp" "communication alone")" \
                            "$(val "$TMP/pp" "bucketer, overlapped")" >>"$TMP/best$pipe"
                    done
                done
                [ "$good" = 1 ] || continue
                # each column's best over the rounds (compute alone over both settings)
                awk -v n="$n" -v m="$model" -v z="$spec" -v nb="$nb" '
                    function lo(a, b) { return a == "" || b < a ? b : a }
                    FNR == 1 { f++ }
                    { c = lo(c, $1); cm[f] = lo(cm[f], $2); ov[f] = lo(ov[f], $3) }
                    END {
                        for (i = 1; i <= 2; i++) {
                            mn = c < cm[i] ? c : cm[i]
                            e[i] = mn > 0 ? (c + cm[i] - ov[i]) / mn : 0
                        }
                        printf "%-5s %-10s %-20s %-7s %9.1f %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f %7.2f\n",
                            n, m, z, nb, c, cm[1], ov[1], e[1], cm[2], ov[2], e[2], ov[2] / ov[1]
                    }' "$TMP/best1" "$TMP/best0"
            done
        done
    done
    printf '# load at the end %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
}
if [ "${PIPE_ROUNDS:-0}" -gt 0 ]; then
    pipe_table
    exit 0
fi

printf '# overlap-table: links %s per direction, %s iterations (best), load %s\n' "$RATE" "$ITERS" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-10s %-20s %-12s %9s %9s %9s %6s %6s %9s %9s %9s\n' ranks model codec buckets \
    compute comm overlap eff eff-p0 first-p1 first-p0 all-p1
for n in $RANKS_LIST; do
    setup "$n"
    for model in $MODELS; do
        compute=""
        for spec in $SPECS; do
            c=${compute:-match}
            run "$n" "$TMP/p1" -- -m "$model" -z "$spec" -c "$c" || continue
            [ -n "$compute" ] || compute=$(val "$TMP/p1" "# compute loops")
            run "$n" "$TMP/p0" GCOLL_BUCKET_PRIORITY=0 -- -m "$model" -z "$spec" -c "$compute" || continue
            nb=$(sed -n 's/.* in \([0-9]*\) buckets.*/\1/p' "$TMP/p1")
            printf '%-5s %-10s %-20s %-12s %9.1f %9.1f %9.1f %6.2f %6.2f %9.1f %9.1f %9.1f\n' "$n" \
                "$model" "$spec" "$nb" "$(val "$TMP/p1" "compute alone")" \
                "$(val "$TMP/p1" "communication alone")" "$(val "$TMP/p1" "bucketer, overlapped")" \
                "$(val "$TMP/p1" "overlap efficiency")" "$(val "$TMP/p0" "overlap efficiency")" \
                "$(val "$TMP/p1" "first layer ready")" "$(val "$TMP/p0" "first layer ready")" \
                "$(val "$TMP/p1" "all buckets reduced")"
        done
        # the fixed 25 MiB buckets in launch order, for comparison (dense, same compute)
        if [ "$model" = 24x250000 ] && [ -n "$compute" ] &&
            run "$n" "$TMP/old" GCOLL_BUCKET_BYTES=25mb GCOLL_BUCKET_PRIORITY=0 -- -m "$model" \
                -z none -c "$compute"; then
            nb=$(sed -n 's/.* in \([0-9]*\) buckets.*/\1/p' "$TMP/old")
            printf '%-5s %-10s %-20s %-12s %9.1f %9.1f %9.1f %6s %6.2f %9s %9.1f %9s\n' "$n" "$model" \
                "none, 25mb fixed" "$nb" "$(val "$TMP/old" "compute alone")" \
                "$(val "$TMP/old" "communication alone")" "$(val "$TMP/old" "bucketer, overlapped")" \
                "-" "$(val "$TMP/old" "overlap efficiency")" "-" "$(val "$TMP/old" "first layer ready")" "-"
        fi
    done
done
printf '# load at the end %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
