#!/bin/bash
# compare-dense.sh: gcoll's dense allreduce side by side with Open MPI and Gloo on loopback.
#
# Builds bench/mpi_allreduce.c (system Open MPI) and bench/gloo_allreduce.cc (libgloo-dev),
# then runs them and tools/gcoll-bench on the same sizes and rank counts, REPS times,
# interleaving the peers within each repetition so that load from other users of the machine
# falls on all of them alike. Prints markdown tables of busbw (median over repetitions,
# +-half the min-max range) and the ratio gcoll/peer, plus small-message latency, and plots
# busbw against size with gnuplot (bench/plot-dense.gp).
#
# Like with like: gcoll over its TCP transport against Open MPI's TCP BTL (ob1, btl
# self,tcp on lo) and Gloo's TCP transport; Open MPI's shared-memory BTL (vader) is a
# separate column, the shared-memory ceiling. If this gcoll build accepts
# GCOLL_TRANSPORT=ucx, gcoll over UCX is added next to it.
set -euo pipefail

usage() {
    cat <<EOF
usage: $0 [-B GCOLL_BUILD_DIR] [-o OUT_DIR] [-r REPS] [-n "NPS"] [-p PNG] [-q]
  -B DIR   gcoll build directory holding tools/gcoll-bench and tools/gcoll-run
           (default: \$GCOLL_BUILD, else the current directory)
  -o DIR   where drivers, raw CSV, tables and the plot go (default: a new /tmp dir)
  -r N     repetitions of the whole sweep (default 5, or \$REPS; about 6 minutes in all)
  -n LIST  rank counts (default "2 4")
  -p FILE  also copy the PNG plot there (e.g. docs/img/dense-busbw.png)
  -q       quick: sizes up to 16M, for a smoke test
Environment: MPI_BIND (Open MPI's --bind-to; default: not given, so that each launcher
binds as it does by default: mpirun to cores for 2 ranks, gcoll-run (gcoll and Gloo) to
CPUs when the ranks do not outnumber them); GCOLL_BENCH_ENV, a space-separated
list of VAR=VALUE given to every gcoll rank (e.g. "GCOLL_RING_SLICE=16mb");
GCOLL_BASE_BUILD, another gcoll build directory (e.g. of the last commit) run as one more
column, "gcoll base", so that a change is measured against its baseline in the same run;
BANDS, size bands replacing the default sweep, separated by ";", each gcoll-bench flags and
a timeout in seconds last (e.g. "-b 64K -e 1M -f 4 -n 50 -w 5 90; -b 64M -e 64M -n 3 -w 1 180").
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
build=${GCOLL_BUILD:-$PWD}
out=""
reps=${REPS:-5}
nps="2 4"
png_copy=""
max_large=256M
while getopts "B:o:r:n:p:qh" opt; do
    case $opt in
    B) build=$OPTARG ;;
    o) out=$OPTARG ;;
    r) reps=$OPTARG ;;
    n) nps=$OPTARG ;;
    p) png_copy=$OPTARG ;;
    q) max_large=16M ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
bench=$build/tools/gcoll-bench
run=$build/tools/gcoll-run
if [ ! -x "$bench" ] || [ ! -x "$run" ]; then
    echo "compare-dense: no tools/gcoll-bench in $build (pass -B BUILD_DIR)" >&2
    exit 2
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/gcoll-compare.XXXXXX)
mkdir -p "$out/bin"
out=$(cd "$out" && pwd)
raw=$out/raw.csv
log=$out/run.log
: >"$log"
# the last column is the 1-minute load average when the launch began (other users + us)
echo "peer,np,rep,size,count,type,redop,time_us,algbw_GBps,busbw_GBps,wrong,load1" >"$raw"
mpi_bind=()
[ -z "${MPI_BIND:-}" ] || mpi_bind=(--bind-to "$MPI_BIND")
gcoll_x=()
for kv in ${GCOLL_BENCH_ENV:-}; do gcoll_x+=(-x "$kv"); done
# gcoll-bench times like the peer drivers: blocking calls (-z 2), the slowest rank (-a 3)
gcoll_flags=(-z 2 -a 3)

note() { echo "compare-dense: $*" | tee -a "$log" >&2; }

# ---- build the peer drivers ---------------------------------------------------------------
peers="gcoll_tcp"
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -std=c11 -Wall -o "$out/bin/mpi_allreduce" "$here/mpi_allreduce.c" &&
        peers="$peers ompi_tcp" || note "mpi_allreduce did not build; skipping Open MPI"
else
    note "no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev); skipping Open MPI"
fi
if [ -f /usr/include/gloo/allreduce_ring_chunked.h ]; then
    g++ -O2 -std=c++17 -Wall -o "$out/bin/gloo_allreduce" "$here/gloo_allreduce.cc" \
        -lgloo -pthread &&
        peers="$peers gloo_ring gloo_hd" || note "gloo_allreduce did not build; skipping Gloo"
else
    note "no Gloo headers (apt-get install libgloo-dev); skipping Gloo"
fi
case " $peers " in *" ompi_tcp "*) peers="$peers ompi_shm" ;; esac
base_build=""
if [ -n "${GCOLL_BASE_BUILD:-}" ]; then
    base_build=$(cd "$GCOLL_BASE_BUILD" && pwd)
    if [ -x "$base_build/tools/gcoll-bench" ] && [ -x "$base_build/tools/gcoll-run" ]; then
        peers="$peers gcoll_base"
    else
        note "no tools/gcoll-bench in GCOLL_BASE_BUILD=$base_build; skipping the baseline"
    fi
fi
if GCOLL_TRANSPORT=ucx timeout 30 "$run" -q -n 2 -x GCOLL_TRANSPORT=ucx "$bench" -b 8 -e 8 \
    -n 1 -w 0 >/dev/null 2>&1; then
    peers="$peers gcoll_ucx"
fi
note "peers: $peers; rank counts: $nps; repetitions: $reps; output in $out"
[ -z "${GCOLL_BENCH_ENV:-}" ] || note "gcoll ranks get: $GCOLL_BENCH_ENV"

# ---- one launch: peer, rank count, then the driver's size/iteration flags ---------------------
# Prints the driver's CSV rows on stdout; a failure or timeout is logged and yields no rows.
launch() {
    local peer=$1 np=$2 limit=$3
    shift 3
    local mpirun_common=(timeout "$limit" mpirun --allow-run-as-root --oversubscribe -np "$np"
        "${mpi_bind[@]}" --mca pml ob1)
    local cmd
    case $peer in
    gcoll_tcp | gcoll_ucx)
        cmd=(timeout "$limit" "$run" -q -n "$np" -x "GCOLL_TRANSPORT=${peer#gcoll_}"
            "${gcoll_x[@]}" "$bench" "${gcoll_flags[@]}" --csv "$@")
        ;;
    gcoll_base)
        cmd=(timeout "$limit" "$base_build/tools/gcoll-run" -q -n "$np" -x GCOLL_TRANSPORT=tcp
            "${gcoll_x[@]}" "$base_build/tools/gcoll-bench" "${gcoll_flags[@]}" --csv "$@")
        ;;
    ompi_tcp) cmd=("${mpirun_common[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo
        "$out/bin/mpi_allreduce" --csv "$@") ;;
    ompi_shm) cmd=("${mpirun_common[@]}" --mca btl self,vader "$out/bin/mpi_allreduce" --csv
        "$@") ;;
    gloo_ring | gloo_hd)
        local algo=ring_chunked
        [ "$peer" = gloo_hd ] && algo=halving_doubling
        # a fresh FileStore directory per launch: Gloo's keys would clash with the last run's
        local store
        store=$(mktemp -d "$out/store.XXXXXX")
        cmd=(timeout "$limit" "$run" -q -n "$np" "$out/bin/gloo_allreduce" -s "$store" -a "$algo"
            --csv "$@")
        ;;
    esac
    echo "+ ${cmd[*]}" >>"$log"
    local rc=0
    "${cmd[@]}" >"$out/last.out" 2>>"$log" || rc=$?
    case $peer in gloo_*) rm -rf "$store" ;; esac
    if [ $rc -ne 0 ]; then
        note "$peer np=$np $* failed (exit $rc$([ $rc -eq 124 ] && echo ', timeout'))"
    fi
    # the first 8 fields (gcoll-bench's CSV goes on with the in-place columns)
    grep -E '^[0-9]+,' "$out/last.out" | cut -d, -f1-8 || true
}

# Sizes: 8 B (latency), then 4 KiB to 256 MiB by factors of 4. Iterations shrink with size
# to keep the whole run under 10 minutes on a 2-core VM; results are checked (-c) up to
# 16 MiB (the check is one more operation per size, too dear above). The last field of each
# band is its timeout in seconds.
bands=("-b 8 -e 8 -n 2000 -w 200 -c 0 60"
    "-b 4K -e 1M -f 4 -n 50 -w 5 -c 1 90"
    "-b 4M -e 16M -f 4 -n 5 -w 2 -c 1 120")
[ "$max_large" = 16M ] || bands+=("-b 64M -e $max_large -f 4 -n 3 -w 1 -c 0 180")
if [ -n "${BANDS:-}" ]; then
    IFS=';' read -r -a bands <<<"$BANDS"
fi

t_start=$(date +%s)
for rep in $(seq 1 "$reps"); do
    for np in $nps; do
        for peer in $peers; do
            for band in "${bands[@]}"; do
                set -- $band
                limit=${*: -1}
                flags=("${@:1:$#-1}")
                load=$(cut -d' ' -f1 /proc/loadavg)
                launch "$peer" "$np" "$limit" "${flags[@]}" |
                    sed "s/\$/,$load/; s/^/$peer,$np,$rep,/" >>"$raw"
            done
        done
        note "rep $rep np $np done after $(($(date +%s) - t_start)) s"
    done
done

# ---- tables ------------------------------------------------------------------------------------
# summary.csv: peer,np,size,busbw median,min,max, time median,min,max, wrong (max), runs
awk -F, 'NR > 1 {
        k = $1 SUBSEP $2 SUBSEP $4
        n[k]++; bw[k, n[k]] = $10; t[k, n[k]] = $8
        if ($11 != "N/A" && $11 + 0 > w[k]) w[k] = $11 + 0
    }
    function med(a, k, c,    i, j, v, tmp) {
        for (i = 1; i <= c; i++) v[i] = a[k, i]
        for (i = 2; i <= c; i++) { tmp = v[i]; for (j = i - 1; j >= 1 && v[j] > tmp; j--) v[j + 1] = v[j]; v[j + 1] = tmp }
        lo = v[1]; hi = v[c]
        return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
    }
    END {
        print "peer,np,size,busbw_med,busbw_min,busbw_max,time_med,time_min,time_max,wrong,runs"
        for (k in n) {
            split(k, p, SUBSEP)
            b = med(bw, k, n[k]); blo = lo; bhi = hi
            tm = med(t, k, n[k])
            printf "%s,%s,%s,%.4f,%.4f,%.4f,%.3f,%.3f,%.3f,%d,%d\n", p[1], p[2], p[3], b, blo, bhi, tm, lo, hi, w[k] + 0, n[k]
        }
    }' "$raw" | { read -r h; echo "$h"; sort -t, -k2,2n -k1,1 -k3,3n; } >"$out/summary.csv"

label() {
    case $1 in
    gcoll_tcp) echo "gcoll tcp" ;;
    gcoll_ucx) echo "gcoll ucx" ;;
    gcoll_base) echo "gcoll base (tcp)" ;;
    ompi_tcp) echo "Open MPI tcp" ;;
    ompi_shm) echo "Open MPI vader (shm ceiling)" ;;
    gloo_ring) echo "Gloo ring_chunked" ;;
    gloo_hd) echo "Gloo halving_doubling" ;;
    esac
}
others=""
for p in $peers; do [ "$p" = gcoll_tcp ] || others="$others $p"; done

tables() {
    for np in $nps; do
        echo
        echo "#### busbw (GB/s) on $np ranks: median of $reps runs ± half the min-max range; ×: gcoll tcp / peer (> 1: gcoll faster)"
        echo
        local hdr="| size | gcoll tcp |" sep="| ---: | ---: |"
        for p in $others; do
            if [ "$p" = gcoll_ucx ]; then
                hdr="$hdr $(label "$p") | × (ucx / vader) |"
            else
                hdr="$hdr $(label "$p") | × |"
            fi
            sep="$sep ---: | ---: |"
        done
        echo "$hdr"
        echo "$sep"
        awk -F, -v np="$np" -v others="$others" '
            function human(s) { return s >= 1048576 ? s / 1048576 " MiB" : s >= 1024 ? s / 1024 " KiB" : s " B" }
            function cell(p, s,    k, m, r) {
                k = p SUBSEP s
                if (!(k in med)) return "-"
                m = med[k]; r = m > 0 ? 50 * (hi[k] - lo[k]) / m : 0
                return sprintf("%.3f ±%d%%%s", m, r + 0.5, wr[k] > 0 ? " WRONG" : "")
            }
            NR > 1 && $2 == np && $3 >= 4096 {
                k = $1 SUBSEP $3; med[k] = $4; lo[k] = $5; hi[k] = $6; wr[k] = $10; sizes[$3] = 1
            }
            END {
                n = split(others, o, " ")
                ns = 0; for (s in sizes) ss[++ns] = s + 0
                for (i = 2; i <= ns; i++) { v = ss[i]; for (j = i - 1; j >= 1 && ss[j] > v; j--) ss[j + 1] = ss[j]; ss[j + 1] = v }
                for (i = 1; i <= ns; i++) {
                    s = ss[i]; g = med["gcoll_tcp" SUBSEP s]
                    line = "| " human(s) " | " cell("gcoll_tcp", s) " |"
                    for (j = 1; j <= n; j++) {
                        k = o[j] SUBSEP s
                        # gcoll over UCX is set against the shared-memory ceiling, not gcoll tcp
                        v = o[j] == "gcoll_ucx" ? med["ompi_shm" SUBSEP s] : g
                        if (o[j] == "gcoll_ucx")
                            r = (k in med) && v > 0 ? sprintf("%.2f", med[k] / v) : "-"
                        else
                            r = (k in med) && med[k] > 0 && g != "" ? sprintf("%.2f", g / med[k]) : "-"
                        line = line " " cell(o[j], s) " | " r " |"
                    }
                    print line
                }
            }' "$out/summary.csv"
        echo
        echo "#### latency on $np ranks: time per allreduce (µs), median of $reps runs; ×: gcoll tcp / peer (< 1: gcoll faster)"
        echo
        hdr="| size | gcoll tcp |"
        sep="| ---: | ---: |"
        for p in $others; do
            hdr="$hdr $(label "$p") | × |"
            sep="$sep ---: | ---: |"
        done
        echo "$hdr gcoll / best TCP peer |"
        echo "$sep ---: |"
        awk -F, -v np="$np" -v others="$others" '
            NR > 1 && $2 == np && ($3 == 8 || $3 == 4096) { t[$1 SUBSEP $3] = $7 }
            END {
                n = split(others, o, " ")
                split("8 4096", sz, " ")
                for (i = 1; i <= 2; i++) {
                    s = sz[i]; g = t["gcoll_tcp" SUBSEP s]; best = ""
                    line = "| " (s == 8 ? "8 B" : "4 KiB") " | " (g == "" ? "-" : sprintf("%.1f", g)) " |"
                    for (j = 1; j <= n; j++) {
                        k = o[j] SUBSEP s
                        if (!(k in t)) { line = line " - | - |"; continue }
                        line = line sprintf(" %.1f | %s |", t[k], g == "" ? "-" : sprintf("%.2f", g / t[k]))
                        if (o[j] != "ompi_shm" && o[j] != "gcoll_ucx" && o[j] != "gcoll_base" && (best == "" || t[k] < best)) best = t[k]
                    }
                    print line " " (best == "" || g == "" ? "-" : sprintf("%.2f", g / best)) " |"
                }
            }' "$out/summary.csv"
    done
}
{
    awk -F, -v c="$(nproc)" 'NR > 1 { s += $12; n++; if ($12 > m) m = $12 }
        END { if (n) printf "1-minute load average on the %d cores while this ran (this benchmark included, 2-4 of it): mean %.1f, max %.1f.\n", c, s / n, m }' "$raw"
    [ -z "${GCOLL_BENCH_ENV:-}" ] || echo "gcoll ranks ran with: $GCOLL_BENCH_ENV."
    tables
} | tee "$out/table.md"
if awk -F, 'NR > 1 && $10 > 0 { bad = 1 } END { exit !bad }' "$out/summary.csv"; then
    note "some runs reported wrong results (see the WRONG cells and $raw)"
fi

# ---- plot ----------------------------------------------------------------------------------------
# plot.dat: per rank count a block (separated by two blank lines, gnuplot's "index"), columns
# size then median,min,max per peer in the order of $peers; NaN where a peer has no value.
for np in $nps; do
    printf "size"
    for p in $peers; do printf ' "%s" min max' "$(label "$p")"; done
    echo
    awk -F, -v np="$np" -v peers="$peers" '
        NR > 1 && $2 == np && $3 >= 4096 { k = $1 SUBSEP $3; m[k] = $4; lo[k] = $5; hi[k] = $6; s[$3] = 1 }
        END {
            n = split(peers, p, " ")
            for (x in s) {
                line = x
                for (j = 1; j <= n; j++) {
                    k = p[j] SUBSEP x
                    line = line ((k in m) ? " " m[k] " " lo[k] " " hi[k] : " NaN NaN NaN")
                }
                print line
            }
        }' "$out/summary.csv" | sort -n
    printf "\n\n"
done >"$out/plot.dat"
if command -v gnuplot >/dev/null; then
    npeers=$(echo $peers | wc -w)
    gnuplot -e "datafile='$out/plot.dat'; outfile='$out/dense-busbw.png'; npeers=$npeers; nps='$nps'" \
        "$here/plot-dense.gp" 2>>"$log" && note "plot: $out/dense-busbw.png" ||
        note "gnuplot failed (see $log)"
    if [ -n "$png_copy" ] && [ -f "$out/dense-busbw.png" ]; then
        mkdir -p "$(dirname "$png_copy")"
        cp "$out/dense-busbw.png" "$png_copy"
    fi
else
    note "no gnuplot (apt-get install gnuplot-nox); skipping the plot"
fi
note "done in $(($(date +%s) - t_start)) s; raw: $raw, summary: $out/summary.csv, table: $out/table.md"
