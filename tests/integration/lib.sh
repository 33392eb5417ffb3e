# lib.sh: shared helpers of the integration scripts (sourced). Every launch is bounded by
# timeout(1) and every background process is killed on exit.
set -u
: "${top_builddir:=$(pwd)}"
: "${gcoll_run:=$top_builddir/tools/gcoll-run}"
CHECK="$top_builddir/tests/integration/coll_check"
INTRUDER="$top_builddir/tests/integration/intruder"
DEMO="$top_builddir/tools/gcoll-demo"
# Keep the suite on loopback whatever the machine has.
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
unset GCOLL_RANK GCOLL_SIZE GCOLL_ROOT GCOLL_JOB_KEY
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-test.XXXXXX")
BG_PIDS=""
fails=0
failed=""

# Kills those of the given pids that are still this script's children (with their own
# children): a pid that exited long ago may be another process's by now.
kill_ours() {
    for p in "$@"; do
        [ "$(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' ')" = "$$" ] || continue
        pkill -9 -P "$p" 2>/dev/null
        kill -9 "$p" 2>/dev/null
    done
}

cleanup() {
    kill_ours $BG_PIDS
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

note() { printf '%s\n' "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*"
    fails=$((fails + 1))
    failed="$failed
  $*"
}
pass() { printf 'ok: %s\n' "$*"; }

# A free loopback port (bound and released by the intruder helper).
free_port() { "$INTRUDER" freeport; }

# Transports to run the suite on: every usable one but ucx (GCOLL_TEST_TRANSPORTS overrides).
# ucx runs in variants, one per UCX_TLS set: test-ucx.sh reruns every script that loops
# over transports() once per variant, with suite_transports=ucx (lower case: the ranks
# would warn about an unknown GCOLL_ variable) and the variant's environment.
transports() {
    if [ -n "${GCOLL_TEST_TRANSPORTS:-}" ]; then echo "$GCOLL_TEST_TRANSPORTS"; return; fi
    if [ -n "${suite_transports:-}" ]; then echo "$suite_transports"; return; fi
    "$top_builddir/tools/gcoll-info" -t | awk '$2 == "usable" && $1 != "ucx" {printf "%s ", $1}'
}

# UCX variants (names) and the environment of each: UCX's tcp on loopback only, and its
# shared-memory transports (UCX 1.13: posix fifo, cma zero-copy, self).
ucx_variants() { echo "ucx-tcp ucx-shm"; }
ucx_variant_env() {
    case "$1" in
    ucx-tcp) echo "UCX_TLS=tcp UCX_NET_DEVICES=lo" ;;
    ucx-shm) echo "UCX_TLS=posix,cma,self" ;;
    esac
}

finish() {
    if [ "$fails" -ne 0 ]; then
        # repeated last, where a log's tail (make check VERBOSE=1, CI) shows it
        printf '%d check(s) failed:%s\n' "$fails" "$failed"
        exit 1
    fi
    exit 0
}
