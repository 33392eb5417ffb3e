#!/bin/sh
# test-gcoll-run.sh: checks gcoll-run's output tagging, environment, failure handling and cleanup.
#
# Runs the launcher named by $gcoll_run (default ./tools/gcoll-run) on small shell programs.
# Exits 0 if every check passes, 1 otherwise, naming each failed check on stderr. Each
# command that could hang runs under timeout(1), so a broken launcher fails instead.

# The rank programs are in single quotes so that the ranks, not this script, expand them.
# shellcheck disable=SC2016

set -u

gcoll_run=${gcoll_run:-./tools/gcoll-run}
# Bound on one launcher run; the slowest check needs about 3 s.
limit=${GCOLL_RUN_TEST_LIMIT:-30}

case $gcoll_run in
/*) ;;
*) gcoll_run=$(pwd)/$gcoll_run ;;
esac
if [ ! -x "$gcoll_run" ]; then
    echo "test-gcoll-run: FAIL: $gcoll_run is not an executable" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-gcoll-run.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
# The crash checks must not leave core files behind (-c is XSI, so tolerate its absence).
# shellcheck disable=SC3045
ulimit -c 0 2>/dev/null
cd "$tmp" || exit 1

# Sleeps the ranks run carry this unusual duration so leftovers can be told from others'.
marker="31$$"
failures=0

fail()
{
    echo "test-gcoll-run: FAIL: $*" >&2
    failures=$((failures + 1))
}

# run ARGS...: runs the launcher; sets rc and elapsed (whole seconds), output in out and err.
run()
{
    t0=$(date +%s)
    timeout -k 5 "$limit" "$gcoll_run" "$@" >out 2>err
    rc=$?
    elapsed=$(($(date +%s) - t0))
    if [ "$rc" -eq 124 ] && [ "$elapsed" -ge "$limit" ]; then
        echo "test-gcoll-run: launcher still running after $limit s: $*" >&2
    fi
}

# expect_rc NAME CODE
expect_rc()
{
    [ "$rc" -eq "$2" ] || fail "$1: exit status $rc, expected $2 (stderr: $(head -c 600 err))"
}

# expect_sorted NAME FILE EXPECTED: FILE's lines, sorted, must equal EXPECTED.
expect_sorted()
{
    got=$(LC_ALL=C sort "$2")
    [ "$got" = "$3" ] || fail "$1: $2 was '$got', expected '$3'"
}

# expect_grep NAME FILE REGEX (basic regular expression)
expect_grep()
{
    grep -q -e "$3" "$2" || fail "$1: no line matching '$3' in $2: $(head -c 600 "$2")"
}

# expect_fast NAME SECONDS
expect_fast()
{
    [ "$elapsed" -le "$2" ] || fail "$1: took $elapsed s, expected at most $2 s"
}

list_processes()
{
    if command -v ps >/dev/null 2>&1; then
        timeout 10 ps -eo pid=,args= >procs 2>/dev/null
    else
        for f in /proc/[0-9]*/cmdline; do
            pid=${f#/proc/}
            printf '%s ' "${pid%/cmdline}"
            tr '\0' ' ' <"$f" 2>/dev/null
            echo
        done >procs
    fi
    # "PID sleep MARKER" exactly: the shells around the sleeps do not count.
    awk -v want="sleep $marker" '{ pid = $1; $1 = ""; sub(/^ +/, ""); sub(/ +$/, "") }
        $0 == want { print pid }' procs >leftovers
}

# expect_no_leftovers NAME: no process started by the check may survive the launcher.
expect_no_leftovers()
{
    list_processes
    if [ -s leftovers ]; then
        fail "$1: 'sleep $marker' left running, pids $(tr '\n' ' ' <leftovers)"
        # Only the pids just found, so later checks start clean.
        # shellcheck disable=SC2046
        kill -KILL $(cat leftovers) 2>/dev/null
    fi
}

# wait_for_file FILE: polls for at most 10 s.
wait_for_file()
{
    i=0
    while [ ! -s "$1" ] && [ "$i" -lt 10 ]; do
        sleep 1
        i=$((i + 1))
    done
}

# --- usage -----------------------------------------------------------------------------
run --version
expect_rc version 0
expect_grep version out '^gcoll-run (gcoll) [0-9]'

run --help
expect_rc help 0
expect_grep help out '^Usage: gcoll-run -n N'

for args in "-n 0 true" "-n 1025 true" "-n 2" "true" "-n 2 --bogus true" "-n x true" \
    "-n 2 --rank-env 2:A=1 true" "-n 2 -x NOEQUALS true" "-n 2 --timeout 0 true"; do
    # shellcheck disable=SC2086 # the words are separate arguments on purpose
    run $args
    expect_rc "usage error for '$args'" 2
    expect_grep "usage error for '$args'" err '^gcoll-run: '
done

run -n 2 "./no-such-program-$$"
expect_rc "exec failure" 127
expect_grep "exec failure" err \
    "^gcoll-run: cannot execute './no-such-program-$$': No such file or directory"

# --- output ----------------------------------------------------------------------------
run -n 3 sh -c 'echo "out $GCOLL_RANK"; echo "err $GCOLL_RANK" >&2'
expect_rc prefix 0
expect_sorted "prefix stdout" out "$(printf '[0] out 0\n[1] out 1\n[2] out 2')"
expect_sorted "prefix stderr" err "$(printf '[0] err 0\n[1] err 1\n[2] err 2')"

run -n 2 -q echo hi
expect_rc quiet 0
expect_sorted quiet out "$(printf 'hi\nhi')"

run -n 1 printf 'first\nno newline'
expect_rc "partial line" 0
expect_sorted "partial line" out "$(printf '[0] first\n[0] no newline')"

# 100000 bytes: a 64 KiB piece, then the rest, each with prefix and newline.
run -n 1 sh -c 'head -c 100000 /dev/zero | tr "\0" x; echo; echo end'
expect_rc "long line" 0
lengths=$(awk '{ printf "%d ", length($0) }' out)
[ "$lengths" = "65540 34468 7 " ] ||
    fail "long line: line lengths '$lengths', expected '65540 34468 7 '"

run -n 64 sh -c 'echo "$GCOLL_RANK"'
expect_rc "many ranks" 0
counts=$(awk '{ n[$2]++ }
    END { for (r = 0; r < 64; r++) if (n[r] != 1) bad++; print NR, bad + 0 }' out)
[ "$counts" = "64 0" ] ||
    fail "many ranks: expected one line from each of 64 ranks, got $(wc -l <out) lines"

# --- environment -----------------------------------------------------------------------
envprog='echo "$GCOLL_RANK $GCOLL_SIZE $GCOLL_LOCAL_RANK $GCOLL_LOCAL_SIZE"'
envprog="$envprog"' "$GCOLL_ROOT $GCOLL_JOB_KEY"'
run -n 2 sh -c "$envprog"
expect_rc env 0
awk '
    $1 != "[" $2 "]" || $2 != $4 || $3 != "2" || $5 != "2" { bad = "rank or size" }
    $6 !~ /^127\.0\.0\.1:[0-9]+$/ { bad = "GCOLL_ROOT " $6 }
    length($7) != 64 || $7 ~ /[^0-9a-f]/ { bad = "GCOLL_JOB_KEY " $7 }
    { roots[$6]; keys[$7]; n++ }
    END {
        for (r in roots) nr++
        for (k in keys) nk++
        if (n != 2 || nr != 1 || nk != 1) bad = bad " (not one root and key for both ranks)"
        if (bad != "") { print bad; exit 1 }
    }' out >bad || fail "env: bad $(cat bad) in: $(cat out)"
key1=$(awk 'NR == 1 { print $7 }' out)
run -n 1 sh -c "$envprog"
key2=$(awk '{ print $7 }' out)
if [ -z "$key1" ] || [ "$key1" = "$key2" ]; then
    fail "env: GCOLL_JOB_KEY not fresh per job"
fi

# torch.distributed's env:// variables, as torchrun sets them; -x overrides them
run -n 3 sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $GCOLL_ROOT"'
expect_rc torch-env 0
awk '
    $1 != "[" $2 "]" || $2 != $4 || $3 != "3" || $5 != "3" { bad = "rank or size" }
    $6 != "127.0.0.1" || $7 !~ /^[0-9]+$/ || $8 == "127.0.0.1:" $7 { bad = "master " $6 ":" $7 }
    { ports[$7]; n++ }
    END {
        for (p in ports) np++
        if (n != 3 || np != 1) bad = bad " (not one MASTER_PORT for all ranks)"
        if (bad != "") { print bad; exit 1 }
    }' out >bad || fail "torch-env: bad $(cat bad) in: $(cat out)"
run -n 1 -x MASTER_PORT=4242 -x RANK=7 sh -c 'echo "$MASTER_PORT $RANK"'
grep -q '^\[0\] 4242 7$' out || fail "torch-env: -x does not override MASTER_PORT and RANK: $(cat out)"

# --bind: rank R on the (R mod n)-th of the n CPUs gcoll-run may use, by default; with
# --bind none on all of them.
ncpu=$(nproc)
allowed='grep "^Cpus_allowed_list:" /proc/self/status | cut -f2'
for n in "$ncpu" $((2 * ncpu + 1)); do
    run -n "$n" sh -c "$allowed"
    expect_rc "bind auto, $n ranks" 0
    # one CPU per rank, and ranks R and R + ncpu on the same one, R and R + 1 not (ncpu > 1)
    awk -v n="$ncpu" '{gsub(/[][]/, "", $1); cpu[$1] = $2}
        END {for (r in cpu) {
                 if (cpu[r] ~ /[,-]/) {print "rank " r " on " cpu[r]; exit 1}
                 if ((r + n) in cpu && cpu[r + n] != cpu[r]) {print "ranks " r ", " r + n; exit 1}
                 if (n > 1 && (r + 1) in cpu && cpu[r + 1] == cpu[r]) {print "ranks " r ", " r + 1; exit 1}
             }}' out >bad || fail "bind auto, $n ranks: $(cat bad): $(tr '\n' ' ' <out)"
done
run --bind core -n 1 sh -c "$allowed"
case "$(awk '{print $2}' out)" in
*[,-]*) fail "bind core: rank 0 on several CPUs: $(cat out)" ;;
esac
run --bind none -n "$ncpu" sh -c "$allowed"
expect_sorted "bind none" out "$(i=0; mine=$(sh -c "$allowed"); while [ "$i" -lt "$ncpu" ]; do
    echo "[$i] $mine"; i=$((i + 1)); done | LC_ALL=C sort)"
run --bind sometimes -n 1 true
expect_rc "bind: bad value" 2

GCOLL_JOB_KEY=feedface
export GCOLL_JOB_KEY
run -n 1 sh -c 'echo "$GCOLL_JOB_KEY"'
expect_grep "env key replaced" out '^\[0\] [0-9a-f]\{64\}$'
run -n 2 --key-from-env sh -c 'echo "$GCOLL_JOB_KEY"'
expect_sorted "env --key-from-env" out "$(printf '[0] feedface\n[1] feedface')"
unset GCOLL_JOB_KEY

run -n 2 --root 10.1.2.3:4567 -x A=all -x B=b --rank-env 1:A=one sh -c 'echo "$GCOLL_ROOT $A $B"'
expect_rc "env -x" 0
expect_sorted "env -x/--rank-env/--root" out \
    "$(printf '[0] 10.1.2.3:4567 all b\n[1] 10.1.2.3:4567 one b')"

# --- failures --------------------------------------------------------------------------
run -n 3 --rank-env 1:FAIL=1 sh -c \
    'if [ -n "${FAIL:-}" ]; then echo dying; exit 3; fi; exec sleep '"$marker"
expect_rc "failing rank" 3
expect_grep "failing rank" err \
    '^gcoll-run: rank 1 (pid [0-9]*) exited with status 3; stopping the other ranks: 0 2$'
[ "$(grep -c '^gcoll-run: ' err)" = 1 ] || fail "failing rank: not one line: $(cat err)"
expect_grep "failing rank output" out '^\[1\] dying$'
expect_fast "failing rank stops the others" 3
expect_no_leftovers "failing rank"

run -n 2 --rank-env 0:CRASH=1 sh -c \
    'if [ -n "${CRASH:-}" ]; then kill -SEGV $$; fi; exec sleep '"$marker"
expect_rc "crashing rank" 139
expect_grep "crashing rank" err \
    '^gcoll-run: rank 0 (pid [0-9]*) killed by signal 11 (.*); stopping the other ranks: 1$'
expect_fast "crashing rank stops the others" 3
expect_no_leftovers "crashing rank"

run -n 3 --keep-going sh -c 'case $GCOLL_RANK in
    0) exit 5 ;;
    1) sleep 1; kill -TERM $$ ;;
    2) sleep 2; echo survived ;;
    esac'
expect_rc "--keep-going" 5
expect_grep "--keep-going exit" err \
    '^gcoll-run: rank 0 (pid [0-9]*) exited with status 5; still running (--keep-going): 1 2$'
expect_grep "--keep-going signal" err '^gcoll-run: rank 1 (pid [0-9]*) killed by signal 15 ('
expect_grep "--keep-going waits" out '^\[2\] survived$'

# A rank that exits 0 while the others go on (they may be waiting for it) is reported once,
# 3 s later, with the ranks still running; they are left to finish.
run -n 3 sh -c 'if [ "$GCOLL_RANK" = 1 ]; then exit 0; fi; sleep 4; echo done'
expect_rc "early exit 0" 0
expect_grep "early exit 0" err \
    '^gcoll-run: rank 1 (pid [0-9]*) exited with status 0 3 s ago; still running: 0 2$'
expect_sorted "early exit 0 leaves the others" out "$(printf '[0] done\n[2] done')"
run -n 2 sh -c 'sleep 0.$GCOLL_RANK'
[ ! -s err ] || fail "ranks exiting 0.1 s apart: gcoll-run said $(cat err)"

# --- timeouts and signals --------------------------------------------------------------
run -n 4 --timeout 1 sleep "$marker"
expect_rc timeout 124
expect_grep timeout err '^gcoll-run: timeout after 1 s; ranks still running: 0[-0-9 ]*3$'
expect_fast timeout 4
expect_no_leftovers timeout

# Ranks that ignore SIGTERM must get SIGKILL once the grace period is over.
run -n 2 --timeout 1 --grace 1 sh -c 'trap "" TERM; sleep '"$marker"
expect_rc "grace" 124
expect_grep "grace" err 'sending SIGKILL$'
expect_fast "grace" 5
expect_no_leftovers "grace"

# A rank's background process must not outlive the job, nor hold it up.
run -n 2 sh -c 'sleep '"$marker"' & echo started'
expect_rc "leftover process" 0
expect_fast "leftover process" 4
expect_no_leftovers "leftover process"

for sig in TERM INT; do
    rm -f pid
    # timeout(1) restores SIGINT, which sh ignores in background commands.
    timeout -k 5 "$limit" sh -c 'echo $$ >pid; exec "$0" -n 2 sleep "$1"' \
        "$gcoll_run" "$marker" >out 2>err &
    bg=$!
    wait_for_file pid
    sleep 1
    kill -s "$sig" "$(cat pid)" 2>/dev/null
    wait "$bg"
    rc=$?
    if [ "$sig" = TERM ]; then want=143; else want=130; fi
    expect_rc "SIG$sig to gcoll-run" "$want"
    expect_grep "SIG$sig to gcoll-run" err "^gcoll-run: got SIG$sig"
    expect_no_leftovers "SIG$sig to gcoll-run"
done

if [ "$failures" -ne 0 ]; then
    echo "test-gcoll-run: $failures check(s) failed" >&2
    exit 1
fi
echo "test-gcoll-run: all checks passed"
exit 0
