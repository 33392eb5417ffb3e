#!/bin/sh
# run-fuzzers.sh: builds gcoll's libFuzzer targets with clang and runs each for FUZZ_SECONDS.
#
#   FUZZ_SECONDS=30 tests/fuzz/run-fuzzers.sh          every target (default 30 s each)
#   tests/fuzz/run-fuzzers.sh decode_sparse frame      some targets
#   FUZZ_BUILD_DIR=D tests/fuzz/run-fuzzers.sh --merge [targets]
#                                                      fold the inputs found by the runs kept
#                                                      in D into the committed corpora,
#                                                      minimized (libFuzzer -merge=1)
#   tests/fuzz/run-fuzzers.sh --seeds                  rewrite the codec seed corpora
# Targets:
#   decode_dense decode_sparse decode_randomk   gcoll_decode, gcoll_decode_pairs,
#                                               gcoll_decode_info, gcoll_codec_sum per family
#   encode spec                                 the encoders' round trip; spec strings
#   wire                                        wire.c: message header, index sections
#   state                                       gcoll_state_load: checkpoints, vq's codebook
#   frame                                       transports/tcp/tcp_frame.c: TCP frame header
#   bootstrap                                   lib/core/bootstrap.c: hello and reply messages
#   auth                                        lib/base/auth.c: both sides of the handshake
#   ucx_hdr                                     the UCX active-message header and single-copy
#                                               write request (UCX builds)
#   ps                                          lib/training/ps_wire.c: the parameter
#                                               server's header, frames and fused apply
# The UCX shared-memory mailbox records are read inside the transport's poll loop, not by
# a pure function, so no target reaches them; test_ucx covers their malformed forms.
# Environment: FUZZ_CC (default clang), FUZZ_BUILD_DIR (default a temporary directory,
# removed after a clean run), FUZZ_JOBS (parallel fuzzing processes per target, default 1),
# FUZZ_REPORT (a file to append "target seconds executions crashes corpus-files" lines to).
# Exits 0 with "skipped" when clang or libFuzzer is missing; non-zero on a finding, with
# the crashing input left in the build directory.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
secs=${FUZZ_SECONDS:-30}
cc=${FUZZ_CC:-clang}
targets="decode_dense decode_sparse decode_randomk encode spec wire state frame bootstrap auth ucx_hdr ps"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "run-fuzzers: skipped: $cc not found (install clang and libclang-rt-dev)"
    exit 0
fi
out=${FUZZ_BUILD_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gcoll-fuzz.XXXXXX")}
mkdir -p "$out/obj"

printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' >"$out/probe.c"
if ! "$cc" -fsanitize=fuzzer,address "$out/probe.c" -o "$out/probe" >/dev/null 2>&1; then
    echo "run-fuzzers: skipped: $cc cannot link -fsanitize=fuzzer (libFuzzer runtime missing)"
    [ -z "${FUZZ_BUILD_DIR:-}" ] && rm -rf "$out"
    exit 0
fi

cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -I$top/include -I$top/lib"
cflags="$cflags -I$top -DGCOLL_BUILDING_LIBRARY -DGCOLL_HAVE_UCX"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
compress_srcs=$(cd "$top" && ls lib/compress/*.c)
boot_srcs="lib/core/bootstrap.c lib/base/auth.c lib/base/config.c lib/base/parse.c lib/base/status.c lib/base/log.c"
ucx_srcs="$(cd "$top" && ls transports/ucx/*.c) transports/match.c lib/base/status.c"

# Library sources are compiled once per build directory and shared by the targets.
obj() { # source (relative to the top) -> object path
    o="$out/obj/$(echo "$1" | tr / _).o"
    if [ ! -f "$o" ] || [ "$top/$1" -nt "$o" ]; then
        # shellcheck disable=SC2086
        "$cc" $cflags $san -fsanitize=fuzzer-no-link -c "$top/$1" -o "$o"
    fi
    echo "$o"
}

build() { # name harness "library sources" [defines] [libraries]
    objs=""
    for s in $3; do objs="$objs $(obj "$s")"; done
    # shellcheck disable=SC2086
    "$cc" $cflags $san -fsanitize=fuzzer ${4:-} "$here/$2" $objs -lm ${5:-} -o "$out/fuzz_$1"
}

build_target() { # name: 0 built, 1 skipped
    case $1 in
    decode_dense) build "$1" fuzz_decode.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" -DFUZZ_FAMILY=1 ;;
    decode_sparse) build "$1" fuzz_decode.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" -DFUZZ_FAMILY=2 ;;
    decode_randomk) build "$1" fuzz_decode.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" -DFUZZ_FAMILY=3 ;;
    encode) build "$1" fuzz_encode.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" ;;
    spec) build "$1" fuzz_spec.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" ;;
    wire) build "$1" fuzz_wire.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" ;;
    state) build "$1" fuzz_state.c "$compress_srcs tests/fuzz/fuzz_log_stub.c" ;;
    frame) build "$1" fuzz_frame.c "transports/tcp/tcp_frame.c" ;;
    ps) build "$1" fuzz_ps.c "$compress_srcs lib/training/ps_wire.c lib/base/status.c tests/fuzz/fuzz_log_stub.c" ;;
    bootstrap) build "$1" fuzz_bootstrap.c "$boot_srcs" "" -lcrypto ;;
    auth) build "$1" fuzz_auth.c "$boot_srcs" "" -lcrypto ;;
    ucx_hdr)
        if ! printf '#include <ucp/api/ucp.h>\n' | "$cc" -E - >/dev/null 2>&1; then
            echo "run-fuzzers: ucx_hdr skipped: no UCX headers"
            return 1
        fi
        build "$1" fuzz_ucx_hdr.c "$ucx_srcs tests/fuzz/fuzz_log_stub.c" "" \
            "-lucp -luct -lucs -lucm" ;;
    *) echo "run-fuzzers: unknown target $1 ($targets)" >&2; exit 2 ;;
    esac
}

if [ "${1:-}" = "--seeds" ]; then
    objs=""
    for s in $compress_srcs tests/fuzz/fuzz_log_stub.c; do objs="$objs $(obj "$s")"; done
    # shellcheck disable=SC2086
    "$cc" $cflags $san "$here/gen_seeds.c" $objs -lm -o "$out/gen_seeds"
    "$out/gen_seeds" "$here/corpus"
    echo "run-fuzzers: seed corpora written under $here/corpus"
    exit 0
fi
merge=0
if [ "${1:-}" = "--merge" ]; then
    [ -n "${FUZZ_BUILD_DIR:-}" ] || { echo "run-fuzzers: --merge needs FUZZ_BUILD_DIR" >&2; exit 2; }
    merge=1
    shift
fi
[ $# -gt 0 ] && targets="$*"

status=0
for t in $targets; do
    build_target "$t" || continue
    mkdir -p "$out/corpus-$t" "$here/corpus/$t"
    if [ $merge -eq 1 ]; then
        # the smallest set of committed and new inputs that keeps every feature reached
        rm -rf "$out/merged-$t"
        mkdir -p "$out/merged-$t"
        (cd "$out" && "$out/fuzz_$t" -merge=1 -max_len=8192 "$out/merged-$t" \
            "$here/corpus/$t" "$out/corpus-$t" >"$out/$t-merge.log" 2>&1)
        rm -f "$here/corpus/$t"/*
        cp "$out/merged-$t"/* "$here/corpus/$t/"
        echo "run-fuzzers: $t corpus: $(ls "$here/corpus/$t" | wc -l) files," \
            "$(du -sk "$here/corpus/$t" | cut -f1) KiB"
        continue
    fi
    # new inputs go to a scratch corpus; the committed ones are only read
    echo "run-fuzzers: $t for ${secs}s"
    jobs=""
    [ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs="-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS"
    t0=$(date +%s)
    rc=0
    # run inside the build directory: libFuzzer writes its job logs to the cwd
    # shellcheck disable=SC2086
    (cd "$out" && "$out/fuzz_$t" -max_total_time="$secs" -max_len=8192 \
        -rss_limit_mb=2048 -timeout=10 $jobs -artifact_prefix="$out/$t-" \
        -print_final_stats=1 "$out/corpus-$t" "$here/corpus/$t" >"$out/$t.log" 2>&1) || rc=$?
    took=$(( $(date +%s) - t0 ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -n 1)
    crashes=$(ls "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* "$out/$t"-oom-* \
        2>/dev/null | wc -l)
    [ -n "${FUZZ_REPORT:-}" ] &&
        echo "$t $took ${runs:-0} $crashes $(ls "$out/corpus-$t" | wc -l)" >>"$FUZZ_REPORT"
    if [ $rc -ne 0 ]; then
        echo "run-fuzzers: $t FAILED; log $out/$t.log, inputs $out/$t-*" >&2
        tail -n 40 "$out/$t.log" >&2
        status=1
    else
        echo "run-fuzzers: $t ok (${runs:-?} inputs in ${took}s)"
    fi
done
[ $status -eq 0 ] && [ -z "${FUZZ_BUILD_DIR:-}" ] && rm -rf "$out"
exit $status
