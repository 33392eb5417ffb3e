# common.sh: what the chaos campaigns share (sourced): ranks started by hand, the way srun
# or a framework's launcher starts them, through GCOLL_RANK/GCOLL_SIZE/GCOLL_ROOT/
# GCOLL_JOB_KEY, each under timeout(1), all killed when the script ends.
set -u
: "${top_builddir:=$(cd "$(dirname "$0")/../.." && pwd)}"
# lib.sh: TMP, the cleanup of what the script started (kill_ours), free_port, loopback.
. "$(cd "$(dirname "$0")/../integration" && pwd)/lib.sh"
EXIT_CHECK="$top_builddir/tests/integration/exit_check"
RANK_PIDS=""

# Transport variants: name and environment. TCP, UCX over its tcp transport, UCX over
# shared memory (skipped when this build has no UCX).
variants() {
    if [ -n "${CHAOS_VARIANTS:-}" ]; then echo "$CHAOS_VARIANTS"; return; fi
    v="tcp"
    "$top_builddir/tools/gcoll-info" -t 2>/dev/null | grep -q '^ucx *usable' && v="$v ucx-tcp ucx-shm"
    echo "$v"
}
variant_env() {
    case "$1" in
    tcp) echo "GCOLL_TRANSPORT=tcp" ;;
    ucx-tcp) echo "GCOLL_TRANSPORT=ucx UCX_TLS=tcp" ;;
    ucx-shm) echo "GCOLL_TRANSPORT=ucx UCX_TLS=posix,cma,self" ;;
    esac
}

# start_ranks N VARIANT LIMIT_S CMD...: starts N ranks of CMD; their pids in RANK_PIDS (rank
# order), stdout in $TMP/out.<rank>, stderr in $TMP/err.<rank>, exit status later in
# $TMP/rc.<rank>.
start_ranks() {
    n=$1 var=$2 limit=$3
    shift 3
    port=$(free_port)
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    RANK_PIDS=""
    rm -f "$TMP"/rc.* "$TMP"/err.* "$TMP"/out.* "$TMP"/pid.*
    r=0
    while [ "$r" -lt "$n" ]; do
        # shellcheck disable=SC2046
        (env $(variant_env "$var") GCOLL_RANK=$r GCOLL_SIZE=$n GCOLL_ROOT=127.0.0.1:$port \
            GCOLL_JOB_KEY=$key timeout -s KILL "$limit" \
            sh -c 'echo $$ >"$0"; exec "$@"' "$TMP/pid.$r" "$@" 2>"$TMP/err.$r" >"$TMP/out.$r"
         echo $? >"$TMP/rc.$r") &
        RANK_PIDS="$RANK_PIDS $!"
        BG_PIDS="$BG_PIDS $!"
        r=$((r + 1))
    done
}

# wait_ready N LIMIT_S: waits until each of the N ranks started last has printed its
# "ready" line (exit_check does once its init returned); fails, naming the first rank that
# is not ready, when one exited first or LIMIT_S passed.
wait_ready() {
    end=$(( $(date +%s) + $2 ))
    r=0
    while [ "$r" -lt "$1" ]; do
        if grep -q ': ready$' "$TMP/out.$r" 2>/dev/null; then
            r=$((r + 1))
        elif [ -f "$TMP/rc.$r" ] || [ "$(date +%s)" -ge "$end" ]; then
            NOT_READY=$r
            return 1
        else
            sleep 0.02
        fi
    done
}

# wait_ranks: waits for the ranks started last.
wait_ranks() {
    for p in $RANK_PIDS; do wait "$p" 2>/dev/null; done
}

# The process of rank r (it wrote its pid before it exec'ed the command).
rank_pid() { cat "$TMP/pid.$1" 2>/dev/null; }
