#!/bin/bash
# compare-rooted.sh: gcoll_reduce, gcoll_gather and gcoll_scatter side by side with Open
# MPI's MPI_Reduce, MPI_Gather and MPI_Scatter on loopback, in one run.
#
# gcoll is timed by tests/integration/rooted_check's "time" mode, Open MPI by
# bench/mpi_rooted.c, the same way (float32, root 0, bytes per rank from 8 B to MAX in
# steps of 4x, 3 warm-up calls then about 0.2 s of calls, the slowest rank's mean). Each
# repetition runs every peer in turn so that load from other users of the machine falls on
# all of them alike. Prints a markdown table per rank count: median time per call in us over
# the repetitions for gcoll over TCP (and UCX, when built), Open MPI over its TCP BTL (like
# with like) and over shared memory (vader, the ceiling), and gcoll TCP's speed relative to
# Open MPI TCP (> 1: gcoll faster).
set -euo pipefail

usage() {
    cat <<EOT
usage: $0 [-B GCOLL_BUILD_DIR] [-o OUT_DIR] [-r REPS] [-n "NPS"] [-m MAX]
  -B DIR   gcoll build directory (default: \$GCOLL_BUILD, else the current directory)
  -o DIR   where the driver and the raw timings go (default: a new /tmp dir)
  -r N     repetitions (default 3)
  -n LIST  rank counts (default "2 4")
  -m MAX   largest size per rank in bytes (default 4194304)
EOT
}

here=$(cd "$(dirname "$0")" && pwd)
build=${GCOLL_BUILD:-$PWD}
out=""
reps=3
nps="2 4"
max=4194304
while getopts "B:o:r:n:m:h" opt; do
    case $opt in
    B) build=$OPTARG ;;
    o) out=$OPTARG ;;
    r) reps=$OPTARG ;;
    n) nps=$OPTARG ;;
    m) max=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
check=$build/tests/integration/rooted_check
run=$build/tools/gcoll-run
[ -x "$check" ] || { echo "no $check: make check TESTS= (or make tests/integration/rooted_check) first" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/compare-rooted.XXXXXX)
mkdir -p "$out/raw"
peers="gcoll_tcp"
"$build/tools/gcoll-info" -t | grep -q '^ucx *usable' && peers="$peers gcoll_ucx"
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -std=c11 -Wall -o "$out/mpi_rooted" "$here/mpi_rooted.c"
    peers="$peers ompi_tcp ompi_shm"
else
    echo "no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev): gcoll alone" >&2
fi

for rep in $(seq 1 "$reps"); do
    for np in $nps; do
        for peer in $peers; do
            mpi=(timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$np")
            case $peer in
            gcoll_tcp) cmd=(timeout 600 "$run" -n "$np" -x GCOLL_TRANSPORT=tcp -- "$check" time "$max") ;;
            gcoll_ucx) cmd=(timeout 600 "$run" -n "$np" -x GCOLL_TRANSPORT=ucx -- "$check" time "$max") ;;
            ompi_tcp) cmd=("${mpi[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$out/mpi_rooted" "$max") ;;
            ompi_shm) cmd=("${mpi[@]}" --mca btl self,vader "$out/mpi_rooted" "$max") ;;
            esac
            "${cmd[@]}" 2>/dev/null | sed 's/^\[0\] //' | grep -E '^(reduce|gather|scatter) ' \
                >"$out/raw/$peer-$np-$rep.txt" || echo "$peer on $np ranks failed (rep $rep)" >&2
        done
    done
done

# median over repetitions of each (peer, np, kind, bytes)
for np in $nps; do
    echo
    echo "### $np ranks (time per call, us; median of $reps)"
    echo
    hdr="| call | bytes per rank |"
    sep="| --- | --- |"
    for peer in $peers; do hdr="$hdr $peer |"; sep="$sep --- |"; done
    case " $peers " in *" ompi_tcp "*) hdr="$hdr gcoll_tcp speed vs ompi_tcp |"; sep="$sep --- |" ;; esac
    echo "$hdr"
    echo "$sep"
    for peer in $peers; do
        cat "$out"/raw/"$peer-$np"-*.txt | awk -v p="$peer" '{print p, $1, $2, $3}'
    done | awk -v peers="$peers" '
        { key = $2 " " $3; v[$1, key, ++n[$1, key]] = $4; if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
        function med(p, key,   c, i, j, t, a) {
            c = n[p, key]; if (!c) return -1
            for (i = 1; i <= c; i++) a[i] = v[p, key, i]
            for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
        }
        END {
            np = split(peers, P, " ")
            for (i = 1; i <= k; i++) {
                split(order[i], kb, " ")
                line = "| " kb[1] " | " kb[2] " |"
                for (j = 1; j <= np; j++) { m = med(P[j], order[i]); line = line " " (m < 0 ? "-" : sprintf("%.1f", m)) " |" }
                g = med("gcoll_tcp", order[i]); o = med("ompi_tcp", order[i])
                if (o > 0 && g > 0) line = line " " sprintf("%.2fx", o / g) " |"
                print line
            }
        }'
done
echo
echo "raw timings: $out/raw"
