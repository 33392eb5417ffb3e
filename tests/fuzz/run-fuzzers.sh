#!/bin/sh
# run-fuzzers.sh: builds the codec libFuzzer targets with clang and runs each for FUZZ_SECONDS.
#
#   FUZZ_SECONDS=30 tests/fuzz/run-fuzzers.sh          run every target (default 30 s each)
#   tests/fuzz/run-fuzzers.sh decode_sparse spec       run some targets
#   tests/fuzz/run-fuzzers.sh --seeds                  rewrite the committed seed corpora
# Environment: FUZZ_CC (default clang), FUZZ_BUILD_DIR (default a temporary directory),
# FUZZ_JOBS (parallel fuzzing processes per target, default 1).
# Exits 0 with "skipped" when clang or libFuzzer is missing; non-zero on a finding, with
# the crashing input left in the build directory.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
secs=${FUZZ_SECONDS:-30}
cc=${FUZZ_CC:-clang}
targets="decode_dense decode_sparse decode_randomk encode spec"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "run-fuzzers: skipped: $cc not found (install clang and libclang-rt-dev)"
    exit 0
fi
out=${FUZZ_BUILD_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gcoll-fuzz.XXXXXX")}
mkdir -p "$out"

printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' >"$out/probe.c"
if ! "$cc" -fsanitize=fuzzer,address "$out/probe.c" -o "$out/probe" >/dev/null 2>&1; then
    echo "run-fuzzers: skipped: $cc cannot link -fsanitize=fuzzer (libFuzzer runtime missing)"
    [ -z "${FUZZ_BUILD_DIR:-}" ] && rm -rf "$out"
    exit 0
fi

lib_srcs=$(ls "$top"/lib/compress/*.c)
cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer -I$top/include -I$top/lib -DGCOLL_BUILDING_LIBRARY"
san="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"

build() { # name source [defines]
    # shellcheck disable=SC2086
    "$cc" $cflags $san $3 "$here/$2" "$here/fuzz_log_stub.c" $lib_srcs -lm -o "$out/fuzz_$1"
}

if [ "${1:-}" = "--seeds" ]; then
    # shellcheck disable=SC2086
    "$cc" $cflags "$here/gen_seeds.c" "$here/fuzz_log_stub.c" $lib_srcs -lm -o "$out/gen_seeds"
    "$out/gen_seeds" "$here/corpus"
    echo "run-fuzzers: seed corpora written under $here/corpus"
    exit 0
fi
[ $# -gt 0 ] && targets="$*"

status=0
for t in $targets; do
    case $t in
    decode_dense) build "$t" fuzz_decode.c -DFUZZ_FAMILY=1 ;;
    decode_sparse) build "$t" fuzz_decode.c -DFUZZ_FAMILY=2 ;;
    decode_randomk) build "$t" fuzz_decode.c -DFUZZ_FAMILY=3 ;;
    encode) build "$t" fuzz_encode.c "" ;;
    spec) build "$t" fuzz_spec.c "" ;;
    *) echo "run-fuzzers: unknown target $t ($targets)" >&2; exit 2 ;;
    esac
    # new inputs go to a scratch corpus; the committed seeds are only read
    mkdir -p "$out/corpus-$t"
    echo "run-fuzzers: $t for ${secs}s"
    jobs=""
    [ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs="-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS"
    # run inside the build directory: libFuzzer writes its job logs to the cwd
    # shellcheck disable=SC2086
    if ! (cd "$out" && "$out/fuzz_$t" -max_total_time="$secs" -max_len=8192 \
        -rss_limit_mb=2048 -timeout=10 $jobs -artifact_prefix="$out/$t-" \
        -print_final_stats=1 "$out/corpus-$t" "$here/corpus/$t" >"$out/$t.log" 2>&1); then
        echo "run-fuzzers: $t FAILED; log $out/$t.log, inputs $out/$t-*" >&2
        tail -n 40 "$out/$t.log" >&2
        status=1
    else
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -n 1)
        echo "run-fuzzers: $t ok (${runs:-?} inputs)"
    fi
done
[ $status -eq 0 ] && [ -z "${FUZZ_BUILD_DIR:-}" ] && rm -rf "$out"
exit $status
