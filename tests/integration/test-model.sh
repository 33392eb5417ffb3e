#!/bin/sh
# test-model.sh: gcoll-model against closed forms computed here in awk. Fits synthetic
# measurements made from known alpha, beta, gamma and kappa (exact, then with noise) and
# checks the recovered parameters; checks predict against the formulas on cases it was not
# fitted to (4,096 ranks, hierarchical); bad input fails with a message and status 2.
set -u
: "${top_builddir:=$(pwd)}"
MODEL="$top_builddir/tools/gcoll-model"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-model-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok: $*"; }
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# The parameters behind the synthetic rows.
A=20e-6 B=1e-9 G=3e-10 K=2
# gcoll-codec-bench's layout: GB/s of fp32 input for enc, ef (used), dec, acc; ns per nonzero
cat >"$TMP/codec.txt" <<'EOF'
# gcoll-codec-bench 0.1.0: synthetic figures
codec                                  ratio     enc      x      ef      x     dec      x     acc      x acc ns/nz     target
topk:density=0.01                     0.0130   10.00  1.000    4.00  1.000    8.00  1.000   40.00  1.000       5.0   >=0.1 ok
q8                                    0.2500   10.00  1.000    2.00  1.000    4.00  1.000    5.00  1.000       nan   >=0.5 ok
EOF

# t(P, n, algo, codec): the closed forms, independent of the tool's code. Sparse: k pairs
# from every rank to every rank; q8: the ring when each rank's chunk is >= 1 MiB.
FORMS='
function lg2f(p,  l) { l = 0; while (2 ^ (l + 1) <= p) l++; return l }
function lg2c(p,  l) { l = 0; while (2 ^ l < p) l++; return l }
function t(P, n, algo, codec,   f, l, p2, f2, x, N, c) {
    f = (P - 1) / P; l = lg2f(P); p2 = 2 ^ l; f2 = (p2 - 1) / p2; N = n / 4
    if (algo == "ring") return 2 * (P - 1) * A + 2 * f * n * B + f * n * G
    if (algo == "rhd" || algo == "rd") {
        x = (p2 != P) ? 2 * A + 2 * n * B + n * G : 0
        if (algo == "rhd") return 2 * l * A + 2 * f2 * n * B + f2 * n * G + x
        return l * (A + n * B + n * G) + x
    }
    if (algo == "tree") {
        l = lg2c(P); x = l * A + l * n * B + l * n * G
        if (n <= 65536 || P == 2) return x + l * A + l * n * B
        return x + (P - 1) * A + (n + (P - 2) * (n < 524288 ? n : 524288)) * B
    }
    if (codec ~ /^topk/)
        return (P - 1) * A + (P - 1) * 0.013 * n * B + K * (N * (1e-9 + 0.5e-9) + (P - 1) * 0.01 * N * 5e-9)
    c = (n / P >= 1048576) ? f * N * (2e-9 + 0.8e-9) : N * (2e-9 + 0.8e-9)
    return 2 * (P - 1) * A + 2 * f * 0.25 * n * B + K * (c + N / P * 2e-9 + N * 1e-9)
}'

# Synthetic rows; NOISE > 0 multiplies each time by 1 +- NOISE (a fixed pseudo-random
# sequence, so the test is deterministic).
synth() {
    awk -v A=$A -v B=$B -v G=$G -v K=$K -v NOISE="$1" "$FORMS"'
    BEGIN {
        print "link,ranks,algo,codec,bytes,time_us,comp_us,wire_bytes,load"
        split("2 3 4 5 8", ps); split("8 65536 1048576 16777216", ns)
        split("ring rhd rd tree", as); seed = 12345
        for (i = 1; i <= 5; i++) for (j = 1; j <= 4; j++) {
            for (a = 1; a <= 4; a++) row(ps[i], ns[j], as[a], "none")
            if (ns[j] >= 1048576) {
                row(ps[i], ns[j], "compressed", "topk:density=0.01")
                row(ps[i], ns[j], "compressed", "q8")
                row(ps[i], 4 * ns[j], "compressed", "q8")
            }
        }
    }
    function row(P, n, algo, codec,   x) {
        seed = (seed * 1103515245 + 12345) % 2147483648
        x = t(P, n, algo, codec) * (1 + NOISE * (2 * seed / 2147483648 - 1))
        printf "syn,%d,%s,%s,%d,%.6f,0,0,0\n", P, algo, codec, n, x * 1e6
    }'
}

# near NAME GOT WANT TOL: relative difference within TOL
near() {
    if awk -v g="$2" -v w="$3" -v tol="$4" 'BEGIN { d = (g - w) / w; exit !(d <= tol && d >= -tol) }'; then
        ok "$1: $2 (expected $3, tolerance $4)"
    else
        fail "$1: $2, expected $3 within $4"
    fi
}
param() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }

# 1. Exact data: the fit recovers every parameter.
synth 0 >"$TMP/exact.csv"
if "$MODEL" fit --codec-bench "$TMP/codec.txt" -o "$TMP/exact.params" "$TMP/exact.csv" 2>"$TMP/fit.err"; then
    near "alpha, exact" "$(param alpha "$TMP/exact.params")" $A 1e-4
    near "beta, exact" "$(param beta "$TMP/exact.params")" $B 1e-4
    near "gamma, exact" "$(param gamma "$TMP/exact.params")" $G 1e-4
    near "kappa, exact" "$(param kappa "$TMP/exact.params")" $K 1e-3
else
    fail "fit of exact data: $(cat "$TMP/fit.err")"
fi

# 2. With +-5% noise: within 10%; and every row within 6% of its measurement in check.
synth 0.05 >"$TMP/noisy.csv"
if "$MODEL" fit --codec-bench "$TMP/codec.txt" -o "$TMP/noisy.params" "$TMP/noisy.csv" 2>"$TMP/fit.err"; then
    near "alpha, 5% noise" "$(param alpha "$TMP/noisy.params")" $A 0.1
    near "beta, 5% noise" "$(param beta "$TMP/noisy.params")" $B 0.1
    near "gamma, 5% noise" "$(param gamma "$TMP/noisy.params")" $G 0.1
    near "kappa, 5% noise" "$(param kappa "$TMP/noisy.params")" $K 0.1
    worst=$("$MODEL" check -p "$TMP/noisy.params" "$TMP/noisy.csv" | sed -n 's/.*worst \([0-9.]*\)%.*/\1/p')
    near "check, worst error of a noisy row (%)" "${worst:-999}" 5 0.2
else
    fail "fit of noisy data: $(cat "$TMP/fit.err")"
fi

# 3. Predictions outside the fitted range against the closed forms (exact parameters).
pred() { "$MODEL" predict -p "$TMP/exact.params" "$@" | awk '{ print $(NF - 2) }'; }
form() { awk -v A=$A -v B=$B -v G=$G -v K=$K "$FORMS"' BEGIN { printf "%.9g\n", t('"$1"') }'; }
near "ring, 4096 ranks, 100 MB" "$(pred -n 4096 -s 100000000 -a ring)" "$(form '4096, 1e8, "ring", "none"')" 1e-5
near "rhd, 1000 ranks, 1 MiB" "$(pred -n 1000 -s 1M -a rhd)" "$(form '1000, 1048576, "rhd", "none"')" 1e-5
near "tree, 6 ranks, 16 MiB" "$(pred -n 6 -s 16M -a tree)" "$(form '6, 16777216, "tree", "none"')" 1e-5
near "top-k, 64 ranks, 25M floats" "$(pred -n 64 -c 25000000 -z topk:density=0.01 -a allgather)" \
    "$(form '64, 1e8, "compressed", "topk"')" 1e-5
# hierarchical, 8 ranks per host: 3 log2(8) shared-memory steps (5 us), 2 n copied (5 GB/s),
# (L-1)/L n reduced, then a ring of 8 hosts on n/8
hier=$(awk -v A=$A -v B=$B -v G=$G -v K=$K "$FORMS"' BEGIN { n = 1e8
    printf "%.9g\n", 9 * 5e-6 + 2 * n / 5e9 + 7 / 8 * n * G + t(8, n / 8, "ring", "none") }')
near "hierarchical ring, 64 ranks, 8 per host" "$(pred -n 64 -s 100000000 -a ring --ppn 8)" "$hier" 1e-5
# a 10 Gbit/s link: beta = 0.8 ns per byte
B10=$(awk -v A=$A -v B=8e-10 -v G=$G -v K=$K "$FORMS"' BEGIN { printf "%.9g\n", t(16, 1e8, "ring", "none") }')
near "ring, 16 ranks, 10 Gbit/s" "$(pred -n 16 -s 100000000 -a ring --link-gbit 10)" "$B10" 1e-5
# a 2-core host shared by 8 ranks: everything but the wire 4x slower
S4=$(awk -v A=$A -v B=$B -v G=$G -v K=$K "$FORMS"' BEGIN { n = 1048576
    printf "%.9g\n", t(8, n, "ring", "none") + 3 * 7 / 8 * n * G }')
near "ring, 8 ranks on 2 cores" "$(pred -n 8 -s 1M -a ring --cores 2)" "$S4" 1e-5
"$MODEL" table -p "$TMP/exact.params" --link-gbit 10,100 --max-ranks 4096 >"$TMP/table.txt" 2>&1
rows=$(grep -c '^  *4096 ' "$TMP/table.txt")
[ "$rows" -eq 4 ] && ok "table: 2 sizes x 2 links to 4096 ranks" ||
    fail "table: $rows rows of 4096 ranks, expected 4: $(head -5 "$TMP/table.txt")"

# 4. Bad input: a message, status 2, never a crash.
bad() { # NAME EXPECTED-MESSAGE ARGS...
    name=$1 msg=$2
    shift 2
    "$MODEL" "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
    rc=$?
    if [ "$rc" -eq 2 ] && grep -q "$msg" "$TMP/bad.err"; then
        ok "bad input: $name ($(head -1 "$TMP/bad.err"))"
    else
        fail "bad input: $name: status $rc, stderr: $(head -3 "$TMP/bad.err")"
    fi
}
bad "missing file" "cannot open measurements" fit "$TMP/none.csv"
bad "missing parameters" "cannot open parameters" predict -p "$TMP/none.params" -n 4 -s 1M
printf 'link,ranks,algo,codec,bytes,time_us\nsyn,4,ring,none,1024,12.5\nsyn,4,ring\n' >"$TMP/short.csv"
bad "short row" "short.csv:3: malformed row" fit "$TMP/short.csv"
printf 'link,ranks,algo,codec,bytes,time_us\nsyn,0,ring,none,1024,12.5\n' >"$TMP/p0.csv"
bad "a row with 0 ranks" "p0.csv:2: malformed row" fit "$TMP/p0.csv"
printf 'link,ranks,algo,codec,bytes,time_us\nsyn,4,ring,none,1024,abc\n' >"$TMP/nan.csv"
bad "a time that is not a number" "nan.csv:2: malformed row" fit "$TMP/nan.csv"
printf 'ranks,bytes\n4,1024\n' >"$TMP/hdr.csv"
bad "a header without the columns" "header has no column" fit "$TMP/hdr.csv"
printf 'link,ranks,algo,codec,bytes,time_us\nsyn,4,bogus,none,1024,12\n' >"$TMP/algo.csv"
bad "an unknown algorithm" "does not apply" fit "$TMP/algo.csv"
printf 'link,ranks,algo,codec,bytes,time_us\nsyn,4,compressed,sign,1024,12\n' >"$TMP/codec.csv"
bad "a codec without costs" "has no costs" fit "$TMP/codec.csv"
: >"$TMP/empty.csv"
bad "an empty file" "no header" fit "$TMP/empty.csv"
bad "P < 1" "bad value 0" predict -p "$TMP/exact.params" -n 0 -s 1M
bad "negative size" "bad value" predict -p "$TMP/exact.params" -n 4 -s -5
bad "an unknown algorithm to predict" "bad value" predict -p "$TMP/exact.params" -n 4 -s 1M -a fast
bad "a dense algorithm for a codec" "does not apply" predict -p "$TMP/exact.params" -n 4 -s 1M -a ring -z q8
echo "alpha 1" >"$TMP/half.params"
bad "parameters without beta" "are required" table -p "$TMP/half.params"
bad "an unknown command" "unknown command" frobnicate

[ "$fails" -eq 0 ] || { echo "test-model: $fails failure(s)"; exit 1; }
echo "test-model: all passed"
