#!/bin/bash
# ompi-compare.sh: gcoll's point-to-point and rooted collectives against Open MPI's, in one
# run (issue 35's speed targets: >= 1.0x Open MPI's bandwidth at 1 MiB and up, within 1.5x
# of its latency at 8 B).
#
# Builds bench/mpi_colls.c with mpicc (Debian: libopenmpi-dev), then, over TCP loopback and
# over UCX's shared memory, runs tools/gcoll-bench --coll C and mpi_colls --coll C on the
# same sizes and rank counts, REPS times, gcoll and Open MPI alternating within each
# repetition, band by band (who goes first alternates too), so that load from other users
# of the machine falls on both alike:
#   sendrecv on 2 ranks (nccl-tests' pattern: every rank sends to rank+1 and receives from
#   rank-1 at once), 8 B (latency) and 1 KiB .. 64 MiB;
#   reduce, gather, scatter on 2 and 4 ranks (root 0), 8 B per rank and 1 KiB .. 64 MiB.
# Both sides time blocking calls, out of place, on the slowest rank (gcoll-bench -z 2 -a 3),
# float32, sum; sizes, algbw and busbw as nccl-tests. Prints markdown tables of the median
# busbw (GB/s) and time (us) with the ratio gcoll / Open MPI (busbw: > 1 is gcoll faster;
# time: < 1 is gcoll faster).
#   tcp:      gcoll GCOLL_TRANSPORT=tcp    against  mpirun --mca pml ob1 --mca btl self,tcp
#             (--mca btl_tcp_if_include lo)
#   ucx-shm:  gcoll GCOLL_TRANSPORT=ucx    against  mpirun --mca pml ucx
#             both with UCX_TLS=posix,cma,self (Open MPI also needs
#             --mca pml_ucx_tls any --mca pml_ucx_devices any to accept shared memory alone)
set -euo pipefail

usage() {
    cat <<EOF
usage: $0 [-B GCOLL_BUILD_DIR] [-o OUT_DIR] [-r REPS] [-l "LINKS"] [-c "COLLS"] [-q]
       $0 -p "DIR..." [-o OUT_DIR] [-l "LINKS"] [-c "COLLS"]
  -B DIR    build directory with tools/gcoll-bench and tools/gcoll-run (default: \$PWD)
  -o DIR    where the driver, raw CSV and table go (default: a new /tmp dir)
  -r N      repetitions (default 3)
  -l LINKS  "tcp ucx-shm" (default)
  -c COLLS  "sendrecv reduce gather scatter" (default)
  -q        quick: sizes up to 1 MiB, fewer iterations (a smoke test)
  -p DIRS   run nothing: pool the raw.csv of earlier runs' output directories (their
            repetitions renumbered one after the other) and print the tables of the whole
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
build=$PWD
out=""
reps=3
links="tcp ucx-shm"
colls="sendrecv reduce gather scatter"
quick=0
pool=""
while getopts "B:o:r:l:c:qp:h" opt; do
    case $opt in
    B) build=$OPTARG ;;
    o) out=$OPTARG ;;
    r) reps=$OPTARG ;;
    l) links=$OPTARG ;;
    c) colls=$OPTARG ;;
    q) quick=1 ;;
    p) pool=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
header="peer,link,coll,np,rep,size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,load1"
[ -n "$out" ] || out=$(mktemp -d /tmp/gcoll-ompi.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
raw=$out/raw.csv
log=$out/run.log
note() { echo "ompi-compare: $*" | tee -a "$log" >&2; }
if [ -n "$pool" ]; then
    files=()
    for d in $pool; do
        [ -f "$d/raw.csv" ] && head -1 "$d/raw.csv" | grep -qx "$header" ||
            { echo "ompi-compare: no raw.csv of this script in $d" >&2; exit 2; }
        [ "$(cd "$d" && pwd)" != "$out" ] || { echo "ompi-compare: -o must differ from the pooled directories" >&2; exit 2; }
        files+=("$d/raw.csv")
    done
    : >"$log"
    # each file's repetitions after the ones before
    awk -F, -v OFS=, -v h="$header" 'BEGIN { print h }
        FNR == 1 { base = top; next }
        { $5 = $5 + base; if ($5 > top) top = $5; print }' "${files[@]}" >"$raw.tmp"
    mv "$raw.tmp" "$raw"
    reps=$(awk -F, 'NR > 1 && $5 > m { m = $5 } END { print m + 0 }' "$raw")
    t0=$(date +%s)
    note "pooled ${#files[@]} runs: $reps repetitions"
else
build=$(cd "$build" && pwd)
bench=$build/tools/gcoll-bench
run=$build/tools/gcoll-run
[ -x "$bench" ] && [ -x "$run" ] || { echo "ompi-compare: no tools/gcoll-bench in $build" >&2; exit 2; }
command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
    { echo "ompi-compare: no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 2; }
mpicc -O2 -std=c11 -Wall -o "$out/mpi_colls" "$here/mpi_colls.c"
: >"$log"
echo "$header" >"$raw"

# the collectives this gcoll-bench knows (the others get '-' cells)
gcoll_colls=""
for c in $colls; do
    if "$bench" --coll "$c" --help >/dev/null 2>&1; then
        gcoll_colls="$gcoll_colls $c"
    else
        note "this gcoll-bench has no --coll $c: Open MPI only"
    fi
done

# launch PEER LINK NP LIMIT ARGS...: one run; its CSV rows (first 8 fields) on stdout
launch() {
    local peer=$1 link=$2 np=$3 limit=$4
    shift 4
    local cmd
    if [ "$peer" = gcoll ]; then
        local x=(-x GCOLL_TRANSPORT=tcp)
        [ "$link" = ucx-shm ] && x=(-x GCOLL_TRANSPORT=ucx -x UCX_TLS=posix,cma,self)
        cmd=(timeout "$limit" "$run" -q -n "$np" "${x[@]}" "$bench" -z 2 -a 3 --csv "$@")
    else
        local m=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo)
        [ "$link" = ucx-shm ] && m=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any
            -x UCX_TLS=posix,cma,self)
        cmd=(timeout "$limit" mpirun --allow-run-as-root --oversubscribe -np "$np" "${m[@]}"
            "$out/mpi_colls" --csv "$@")
    fi
    echo "+ ${cmd[*]}" >>"$log"
    local rc=0
    "${cmd[@]}" >"$out/last.out" 2>>"$log" || rc=$?
    [ $rc -eq 0 ] || note "$peer $link np=$np $* failed (exit $rc)"
    grep -E '^[0-9]+,' "$out/last.out" | cut -d, -f1-8 || true
}

# bands: the latency point (8 B per rank), then 1 KiB .. 64 MiB by factors of 4; the last
# field is the timeout in seconds
bands() {
    local per=$1 # 8 B per rank: the total for gather and scatter
    if [ $quick = 1 ]; then
        echo "-b $per -e $per -n 200 -w 20 -c 0 60;-b 1K -e 1M -f 4 -n 20 -w 2 -c 1 90"
    else
        echo "-b $per -e $per -n 2000 -w 200 -c 0 120;-b 1K -e 1M -f 4 -n 50 -w 5 -c 1 120;-b 4M -e 64M -f 4 -n 5 -w 2 -c 1 300"
    fi
}

t0=$(date +%s)
for rep in $(seq 1 "$reps"); do
    for link in $links; do
        for coll in $colls; do
            nps="2 4"
            [ "$coll" = sendrecv ] && nps=2
            for np in $nps; do
                per=8
                case $coll in gather | scatter) per=$((8 * np)) ;; esac
                IFS=';' read -r -a bs <<<"$(bands $per)"
                # each band's two runs back to back, so that a slow spell of the machine
                # (it comes and goes within seconds here) falls on both alike; who goes
                # first alternates between repetitions
                peers="gcoll ompi"
                [ $((rep % 2)) = 0 ] && peers="ompi gcoll"
                for band in "${bs[@]}"; do
                    for peer in $peers; do
                        [ "$peer" = ompi ] || case " $gcoll_colls " in *" $coll "*) ;; *) continue ;; esac
                        # shellcheck disable=SC2086
                        set -- $band
                        limit=${*: -1}
                        load=$(cut -d' ' -f1 /proc/loadavg)
                        launch "$peer" "$link" "$np" "$limit" --coll "$coll" "${@:1:$#-1}" |
                            sed "s/\$/,$load/; s/^/$peer,$link,$coll,$np,$rep,/" >>"$raw"
                    done
                done
            done
        done
    done
    note "repetition $rep done after $(($(date +%s) - t0)) s"
done
fi

# ---- tables: median over repetitions ---------------------------------------------------------
awk -F, 'NR > 1 {
        k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4 SUBSEP $6
        n[k]++; t[k, n[k]] = $10; b[k, n[k]] = $12
        if ($13 != "N/A" && $13 + 0 > w[k]) w[k] = $13 + 0
    }
    function med(a, k, c,    i, j, v, x) {
        for (i = 1; i <= c; i++) v[i] = a[k, i]
        for (i = 2; i <= c; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
        return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
    }
    END {
        for (k in n) {
            split(k, p, SUBSEP)
            printf "%s,%s,%s,%s,%s,%.3f,%.4f,%d,%d\n", p[1], p[2], p[3], p[4], p[5], med(t, k, n[k]), med(b, k, n[k]), w[k] + 0, n[k]
        }
    }' "$raw" | sort -t, -k2,2 -k3,3 -k4,4n -k6,6n -k1,1 >"$out/summary.csv"

# the ratio within each repetition (gcoll's run and Open MPI's follow each other), then its
# median: a slow spell of the machine that spans both runs of a repetition cancels out
awk -F, 'NR > 1 { k = $2 SUBSEP $3 SUBSEP $4 SUBSEP $6; bw[$1, k, $5] = $12; reps[k, $5] = 1; keys[k] = 1 }
    END {
        for (k in keys) {
            c = 0
            for (kr in reps) {
                split(kr, q, SUBSEP)
                if (q[1] SUBSEP q[2] SUBSEP q[3] SUBSEP q[4] != k) continue
                r = q[5]
                if ((("gcoll", k, r) in bw) && (("ompi", k, r) in bw) && bw["ompi", k, r] > 0)
                    v[++c] = bw["gcoll", k, r] / bw["ompi", k, r]
            }
            if (!c) continue
            for (i = 2; i <= c; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
            split(k, p, SUBSEP)
            printf "%s,%s,%s,%s,%.4f\n", p[1], p[2], p[3], p[4], c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
        }
    }' "$raw" >"$out/paired.csv"

{
    awk -F, -v c="$(nproc)" 'NR > 1 { s += $14; n++; if ($14 > m) m = $14 }
        END { if (n) printf "1-minute load average on the %d cores while this ran (this benchmark included): mean %.1f, max %.1f.\n", c, s / n, m }' "$raw"
    for link in $links; do
        for coll in $colls; do
            echo
            echo "#### $coll over $link: median of $reps runs; busbw (GB/s) and time (µs); ×: gcoll / Open MPI; paired: the median of each repetition's ×"
            echo
            echo "| ranks | size | gcoll busbw | Open MPI busbw | × busbw | × busbw, paired | gcoll time | Open MPI time | × time |"
            echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            awk -F, -v link="$link" -v coll="$coll" '
                function human(s) { return s >= 1048576 ? s / 1048576 " MiB" : s >= 1024 ? s / 1024 " KiB" : s " B" }
                FILENAME ~ /paired/ { if ($1 == link && $2 == coll) pr[$3 SUBSEP $4] = $5; next }
                $2 == link && $3 == coll {
                    k = $4 SUBSEP $5; keys[k] = 1; t[$1, k] = $6; b[$1, k] = $7; if ($8 > 0) bad[$1, k] = 1
                }
                END {
                    for (k in keys) {
                        split(k, a, SUBSEP)
                        g = (("gcoll", k) in t); m = (("ompi", k) in t)
                        printf "%d %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", a[1], a[2], a[1], human(a[2]),
                            g ? sprintf("%.3f%s", b["gcoll", k], bad["gcoll", k] ? " WRONG" : "") : "-",
                            m ? sprintf("%.3f%s", b["ompi", k], bad["ompi", k] ? " WRONG" : "") : "-",
                            (g && m && b["ompi", k] > 0) ? sprintf("%.2f", b["gcoll", k] / b["ompi", k]) : "-",
                            (k in pr) ? sprintf("%.2f", pr[k]) : "-",
                            g ? sprintf("%.1f", t["gcoll", k]) : "-", m ? sprintf("%.1f", t["ompi", k]) : "-",
                            (g && m && t["ompi", k] > 0) ? sprintf("%.2f", t["gcoll", k] / t["ompi", k]) : "-"
                    }
                }' "$out/paired.csv" "$out/summary.csv" | sort -k1,1n -k2,2n | cut -d' ' -f3-
        done
    done
} | tee "$out/table.md"

# issue 35's targets: from 1 MiB, gcoll's busbw at least Open MPI's (the paired ratio); at
# the smallest size (8 B per rank), gcoll's median time within 1.5x of Open MPI's
awk -F, '
    FILENAME ~ /paired/ {
        if ($4 >= 1048576) {
            n++
            if ($5 >= 1.0) ok++
            else bm = bm sprintf("\n- %s %s, %d ranks, %d B: %.2f", $1, $2, $3, $4, $5)
        }
        next
    }
    { k = $2 SUBSEP $3 SUBSEP $4; if (!(k in s) || $5 + 0 < s[k]) s[k] = $5 + 0; t[$1, k, $5 + 0] = $6 }
    END {
        for (k in s) {
            if (!(("gcoll", k, s[k]) in t) || !(("ompi", k, s[k]) in t) || t["ompi", k, s[k]] <= 0) continue
            ln++
            r = t["gcoll", k, s[k]] / t["ompi", k, s[k]]
            split(k, a, SUBSEP)
            if (r <= 1.5) lok++
            else lm = lm sprintf("\n- %s %s, %d ranks: %.2fx", a[1], a[2], a[3], r)
        }
        printf "\ntargets: from 1 MiB, %d of %d cells at 1.0x Open MPI'"'"'s busbw or more (paired)%s\n\n", ok, n, bm
        printf "targets: at 8 B per rank, %d of %d cells within 1.5x of Open MPI'"'"'s time%s\n", lok, ln, lm
    }' "$out/paired.csv" "$out/summary.csv" | tee -a "$out/table.md"
if awk -F, '$8 > 0 { bad = 1 } END { exit !bad }' "$out/summary.csv"; then
    note "some runs reported wrong results (WRONG cells; see $raw)"
fi
note "done in $(($(date +%s) - t0)) s; raw: $raw, summary: $out/summary.csv, table: $out/table.md"
