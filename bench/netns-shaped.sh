#!/bin/sh
# netns-shaped.sh: 4 ranks, one per network namespace, joined through a bridge by veth
# links shaped with tc tbf (1 Gbit/s, then 10 Gbit/s), timing one allreduce of a 25M-float
# gradient: dense gcoll ring, Gloo's dense allreduce (when bench/gloo_allreduce is built),
# and gcoll compressed with several codecs. For each compressed row it prints the time its
# wire bytes need at the link rate and its compression time, and which bound it is at.
#
#   sudo bench/netns-shaped.sh [BUILD_DIR]      (BUILD_DIR: where tools/ were built, default .)
# Environment: RATES ("1gbit 10gbit"), COUNT (25000000 floats), ITERS (3), RANKS (4), SPECS (codecs;
# SPEC@ring or SPEC@alltoall forces GCOLL_COMPRESSED_ALGO for that row). GCOLL_* tuning
# variables set by the caller reach every rank.
# MODE=overlap runs tools/gcoll-overlap-bench instead (ResNet-50's backward pass with
# COMPUTE_MS of compute, through the bucketer) for dense and each of SPECS.
# COMPUTE_CPU pins the overlap benchmark's compute loops (see below).
# Needs root, iproute2 and tc; skips with a message where namespaces cannot be made.
# Everything it creates (namespaces gcoll-ns0..3, gcoll-br, temp files) is removed on exit.
set -u
BUILD=${1:-.}
BENCH="$BUILD/tools/gcoll-bench"
GLOO="${GLOO_DRIVER:-$BUILD/bench/gloo_allreduce}"
# build the Gloo driver if it is not there (libgloo-dev)
if [ ! -x "$GLOO" ] && [ -f /usr/include/gloo/allreduce_ring_chunked.h ]; then
    mkdir -p "$(dirname "$GLOO")"
    g++ -O2 -std=c++17 -o "$GLOO" "$(dirname "$0")/gloo_allreduce.cc" -lgloo -lpthread 2>/dev/null ||
        echo "netns-shaped: could not build the Gloo driver"
fi
RATES=${RATES:-"1gbit 10gbit"}
COUNT=${COUNT:-25000000}
ITERS=${ITERS:-3}
SPECS=${SPECS:-"topk:density=0.01 topk:density=0.001+q8 sign qsgd:bits=4 randomk:density=0.01"}
N=${RANKS:-4}
PORT=29731
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-netns.XXXXXX")
BR=gcoll-br

skip() { echo "netns-shaped: SKIP: $*"; rm -rf "$TMP"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "ip and tc (iproute2) not found"
[ -x "$BENCH" ] || { echo "netns-shaped: $BENCH not built" >&2; exit 1; }

cleanup() {
    for i in $(seq 0 $((N - 1))); do ip netns del "gcoll-ns$i" 2>/dev/null; done
    ip netns del "$BR" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
cleanup_quiet() { for i in $(seq 0 $((N - 1))); do ip netns del "gcoll-ns$i" 2>/dev/null; done; ip netns del "$BR" 2>/dev/null; }
cleanup_quiet

# A bridge in its own namespace, each rank's namespace hanging off it by a veth pair with
# private addresses that exist only inside the namespaces.
ip netns add "$BR" || skip "cannot create network namespaces here"
ip -n "$BR" link add br0 type bridge && ip -n "$BR" link set br0 up && ip -n "$BR" link set lo up ||
    skip "cannot create a bridge"
for i in $(seq 0 $((N - 1))); do
    ns=gcoll-ns$i
    ip netns add "$ns" || skip "cannot create namespace $ns"
    ip link add "gc$i" netns "$ns" type veth peer name "gcb$i" netns "$BR" || skip "cannot create veth"
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "gc$i"
    ip -n "$ns" link set "gc$i" up
    ip -n "$ns" link set lo up
    ip -n "$BR" link set "gcb$i" master br0
    ip -n "$BR" link set "gcb$i" up
done

shape() { # rate: tbf on both ends of every link, so each direction is limited
    for i in $(seq 0 $((N - 1))); do
        for where in "-n gcoll-ns$i gc$i" "-n $BR gcb$i"; do
            set -- $where
            tc "$1" "$2" qdisc replace dev "$3" root tbf rate "$rate" burst 512kb latency 100ms ||
                skip "tc tbf is not available"
        done
    done
}

# The caller's GCOLL_* settings (tuning knobs) reach every rank; identity ones do not.
passenv() { env | grep '^GCOLL_' | grep -v '^GCOLL_\(RANK\|SIZE\|ROOT\|JOB_KEY\|LOCAL_[A-Z]*\)=' || true; }

# run_gcoll OUT [gcoll-bench args]: one rank per namespace; rank 0's CSV goes to OUT.
run_gcoll() {
    out=$1
    shift
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for i in $(seq 0 $((N - 1))); do
        ip netns exec "gcoll-ns$i" env $(passenv) GCOLL_RANK="$i" GCOLL_SIZE=$N \
            GCOLL_ROOT="10.77.0.1:$PORT" GCOLL_JOB_KEY="$key" GCOLL_TIMEOUT_MS=120s \
            ${ALGO_ENV:-} timeout 600 "$BENCH" -a 3 -z 2 -c 0 "$@" --csv \
            >"$TMP/rank$i.csv" 2>"$TMP/rank$i.err" &
        pids="$pids $!"
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    PORT=$((PORT + 1))
    cp "$TMP/rank0.csv" "$out"
    [ "$ok" -eq 0 ] || { echo "netns-shaped: gcoll-bench failed:"; cat "$TMP"/rank*.err; }
    return $ok
}

run_gloo() {
    [ -x "$GLOO" ] || return 1
    store="$TMP/gloo-store"
    rm -rf "$store"
    mkdir -p "$store"
    pids=""
    for i in $(seq 0 $((N - 1))); do
        ip netns exec "gcoll-ns$i" env GCOLL_RANK="$i" GCOLL_SIZE=$N \
            GLOO_HOSTNAME="10.77.0.$((i + 1))" timeout 600 "$GLOO" -s "$store" -a ring_chunked \
            -b $((COUNT * 4)) -e $((COUNT * 4)) -n "$ITERS" -w 1 --csv \
            >"$TMP/gloo$i.csv" 2>"$TMP/gloo$i.err" &
        pids="$pids $!"
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    [ "$ok" -eq 0 ] && cp "$TMP/gloo0.csv" "$1"
    return $ok
}

# COMPUTE_CPU=N pins every rank's compute loop to CPU N (gcoll-overlap-bench -C): with
# GCOLL_PROGRESS_CPU set to another CPU, compute stands for GPU kernels and communication
# has a core of its own, as on a GPU node.
CPIN=""
[ -n "${COMPUTE_CPU:-}" ] && CPIN="-C $COMPUTE_CPU"

if [ "${MODE:-}" = adapt ]; then
    # GCOLL_ADAPT=bandwidth while the links change rate: 10 Gbit/s -> 1 Gbit/s ->
    # 200 Mbit/s -> 10 Gbit/s, PHASE_S seconds each; rank 0 prints one line per step,
    # after the time of a step of compute alone. ADAPT=off SPEC=topk:density=D runs a fixed
    # density for comparison; ADAPT_DAT=FILE writes the data of bench/plot-adapt.gp. The
    # estimate starts from the init probe (GCOLL_PROBE=1 unless the caller sets it).
    OVERLAP="$BUILD/tools/gcoll-overlap-bench"
    PHASES=${PHASES:-"10gbit 1gbit 200mbit 10gbit"}
    PHASE_S=${PHASE_S:-15}
    nph=$(echo $PHASES | wc -w)
    steps=$(( (nph * PHASE_S * 1000) / (${COMPUTE_MS:-1500} + 200) ))
    rate=$(echo $PHASES | awk '{print $1}')
    shape
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for i in $(seq 0 $((N - 1))); do
        ip netns exec "gcoll-ns$i" env $(passenv) GCOLL_RANK="$i" GCOLL_SIZE=$N GCOLL_ROOT="10.77.0.1:$PORT" \
            GCOLL_JOB_KEY="$key" GCOLL_TIMEOUT_MS=120s GCOLL_ADAPT="${ADAPT:-bandwidth}" \
            GCOLL_DENSITY_MIN="${DMIN:-0.0001}" GCOLL_DENSITY_MAX="${DMAX:-0.1}" \
            GCOLL_PROBE="${GCOLL_PROBE:-1}" \
            GCOLL_DEBUG="${ADAPT_DEBUG:-warn}" GCOLL_DEBUG_SUBSYS=ADAPT \
            timeout 900 "$OVERLAP" -c "${COMPUTE_MS:-1500}" -s "$steps" $CPIN \
            -z "${SPEC:-topk:density=0.01}" >"$TMP/ad$i.out" 2>"$TMP/ad$i.err" &
        pids="$pids $!"
    done
    start=$(date +%s.%N)
    for rate in $PHASES; do
        shape
        echo "# $(echo "$(date +%s.%N) $start" | awk '{printf "%.1f", $1 - $2}') s: links now $rate"
        sleep "$PHASE_S"
    done
    for p in $pids; do wait "$p"; done
    cat "$TMP/ad0.out"
    [ -s "$TMP/ad0.err" ] && cat "$TMP/ad0.err"
    # ADAPT_DAT=FILE: "time_s iteration_ms density" per step, time on this script's clock
    # (the one the phases above are on), for bench/plot-adapt.gp
    if [ -n "${ADAPT_DAT:-}" ]; then
        awk -v s0="$start" '/^# steps start at/ {off = $5 - s0}
            /^step / {printf "%.2f %s %s\n", $4 + off, $7, $13}' "$TMP/ad0.out" >"$ADAPT_DAT"
    fi
    exit 0
fi

if [ "${MODE:-}" = overlap ]; then
    OVERLAP="$BUILD/tools/gcoll-overlap-bench"
    for rate in $RATES; do
        shape
        printf '\n## link %s per direction: overlap of ResNet-50 gradients with %s ms of compute\n' \
            "$rate" "${COMPUTE_MS:-1000}"
        for spec in none $SPECS; do
            key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
            pids=""
            for i in $(seq 0 $((N - 1))); do
                ip netns exec "gcoll-ns$i" env $(passenv) GCOLL_RANK="$i" GCOLL_SIZE=$N \
                    GCOLL_ROOT="10.77.0.1:$PORT" GCOLL_JOB_KEY="$key" GCOLL_TIMEOUT_MS=120s \
                    timeout 900 "$OVERLAP" -c "${COMPUTE_MS:-1000}" -n "$ITERS" -z "$spec" $CPIN \
                    >"$TMP/ov$i.out" 2>"$TMP/ov$i.err" &
                pids="$pids $!"
            done
            for p in $pids; do wait "$p"; done
            PORT=$((PORT + 1))
            echo "### $spec"
            cat "$TMP/ov0.out"
        done
    done
    exit 0
fi

bytes=$((COUNT * 4))
printf '# netns-shaped: %d ranks, one allreduce of %d floats (%d MB), %d iterations\n' $N "$COUNT" $((bytes / 1000000)) "$ITERS"
for rate in $RATES; do
    shape
    bps=$(echo "$rate" | awk '/gbit/ {print $0 * 1e9} /mbit/ {print $0 * 1e6}')
    printf '\n## link %s per direction (tc tbf on both ends of every veth)\n' "$rate"
    printf '%-28s %10s %12s %10s %10s %10s %s\n' "method" "time(s)" "wire(MB)" "wire(s)" "comp(s)" "vs gloo" "bound"
    run_gcoll "$TMP/dense.csv" -b $bytes -e $bytes -n "$ITERS" -w 1 --algo ring >/dev/null 2>&1
    dense=$(awk -F, '/^[0-9]/ {print $5 / 1e6}' "$TMP/dense.csv")
    dwire=$(awk -v n=$N -v b=$bytes 'BEGIN {print 2 * (n - 1) / n * b}')
    dmb=$(awk -v w="$dwire" 'BEGIN {print w / 1e6}')
    dsec=$(awk -v w="$dwire" -v r="$bps" 'BEGIN {print w * 8 / r}')
    printf '%-28s %10.3f %12.1f %10.3f %10s %10s %s\n' "gcoll dense ring" "$dense" "$dmb" "$dsec" "-" "" "wire"
    gloo=""
    if run_gloo "$TMP/gloo.csv"; then
        gloo=$(awk -F, '/^[0-9]/ {print $5 / 1e6}' "$TMP/gloo.csv")
        printf '%-28s %10.3f %12.1f %10.3f %10s %10s %s\n' "gloo dense (ring_chunked)" "$gloo" \
            "$dmb" "$dsec" "-" "1.0x" "wire"
    else
        echo "(gloo driver not available: build it with bench/compare-dense.sh; comparing with gcoll's dense ring)"
    fi
    base=${gloo:-$dense}
    for spec in $SPECS; do
        # SPEC@ALGO forces the compressed allreduce's scheme (GCOLL_COMPRESSED_ALGO) for a row
        ALGO_ENV=""
        case "$spec" in *@*) ALGO_ENV="GCOLL_COMPRESSED_ALGO=${spec#*@}" ;; esac
        run_gcoll "$TMP/z.csv" --compressor "${spec%@*}" -b $bytes -e $bytes -n "$ITERS" -w 1 >/dev/null 2>&1 || continue
        awk -F, -v spec="$spec" -v bps="$bps" -v base="$base" '/^[0-9]/ {
            t = $3 / 1e6; wire = $6; ws = wire * 8 / bps; cs = $8 / 1e6;
            bound = ws > cs ? "wire" : "compression";
            lim = ws > cs ? ws : cs;
            printf "%-28s %10.3f %12.1f %10.3f %10.3f %9.1fx %s (%.2fx of it)\n", "gcoll " spec, t,
                   wire / 1e6, ws, cs, base / t, bound, t / lim }' "$TMP/z.csv"
    done
done
