#!/bin/sh
# stream-trace.sh: where streamed top-k's time goes on a shaped link. Runs
# bench/netns-shaped.sh (4 ranks, 1 Gbit/s, one allreduce of COUNT floats, top-k 1%) with
# GCOLL_DEBUG=trace on the COMPRESS subsystem, every rank logging to its own file; each
# streamed call logs its phases (collectives/compressed/topk_stream.c), and this script
# prints them per rank as min-max over the timed calls (the first call of each rank, the
# warm-up, is left out):
#   pass  the selection pass over e + g, segments sent as they are done
#   net   network work done inside the pass (part of pass)
#   tail  the pass's end to the trailer sent (empty segments, the trailer)
#   wait  the trailer sent to every peer's last segment and trailer in, every send done
#   sum   every rank's pairs trimmed and summed in rank order into the output
#
#   sudo bench/stream-trace.sh [BUILD_DIR]   (environment: RATES (1gbit), COUNT (25000000),
#                                             ITERS (6), SPECS (topk:density=0.01))
set -eu
B=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-.}
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-strace.XXXXXX")
trap 'rm -rf "$TMPD"' EXIT INT TERM
chmod 777 "$TMPD"
GCOLL_DEBUG=trace GCOLL_DEBUG_SUBSYS=COMPRESS GCOLL_DEBUG_FILE="$TMPD/trace.%p" \
    RATES=${RATES:-1gbit} COUNT=${COUNT:-25000000} ITERS=${ITERS:-6} \
    SPECS=${SPECS:-topk:density=0.01} "$B/netns-shaped.sh" "$BUILD"
echo
echo "## streamed top-k phases per rank, ms (min-max over the timed calls; warm-up left out)"
cat "$TMPD"/trace.* 2>/dev/null | grep 'topk-stream phases:' | sed 's/.*topk-stream phases: //' |
    awk '{ for (i = 1; i < NF; i += 2) v[$i] = $(i + 1)
           r = v["rank"]; n[r]++; if (n[r] == 1) next
           for (f = 1; f <= 5; f++) {
               k = (f == 1 ? "pass_ms" : f == 2 ? "net_ms" : f == 3 ? "tail_ms" : f == 4 ? "wait_ms" : "sum_ms")
               x = v[k] + 0
               if (!((r, f) in lo) || x < lo[r, f]) lo[r, f] = x
               if (!((r, f) in hi) || x > hi[r, f]) hi[r, f] = x }
           if (r + 1 > P) P = r + 1 }
         END { if (!P) { print "no trace lines: is the build current?"; exit 1 }
               printf "| rank | calls | pass | net (in pass) | tail | wait | sum |\n"
               printf "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
               for (r = 0; r < P; r++) {
                   printf "| %d | %d", r, n[r] - 1
                   for (f = 1; f <= 5; f++) printf " | %.1f-%.1f", lo[r, f], hi[r, f]
                   printf " |\n" } }'
