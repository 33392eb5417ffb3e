# plot-adapt.gp: density chosen by GCOLL_ADAPT=bandwidth and iteration time per step while
# the links change rate (data: "time_s iteration_ms density" per line, time on the script's
# clock: MODE=adapt ADAPT_DAT=FILE bench/netns-shaped.sh). ALONE: a step of compute alone, ms.
# gnuplot -e "DATA='x.dat'; OUT='x.png'; PHASE=15" bench/plot-adapt.gp  (PHASE: seconds per rate;
# SLOW: the third phase's label, default "200 Mbit/s")
set terminal pngcairo size 900,480
set output OUT
set xlabel "time (s)"
set ylabel "iteration (ms)"
set y2label "density (largest bucket)"
set y2tics
set ytics nomirror
set key bottom right font ",9"
set yrange [1400:2000]  # the warm-up step (about 2.5 s) is off the top
if (!exists("PHASE")) PHASE = 15
if (!exists("ALONE")) ALONE = 0
if (!exists("SLOW")) SLOW = "200 Mbit/s"
set arrow from PHASE,graph 0 to PHASE,graph 1 nohead dt 2
set arrow from 2*PHASE,graph 0 to 2*PHASE,graph 1 nohead dt 2
set arrow from 3*PHASE,graph 0 to 3*PHASE,graph 1 nohead dt 2
set label "10 Gbit/s" at 2,graph 0.95
set label "1 Gbit/s" at PHASE+2,graph 0.95
set label SLOW at 2*PHASE+2,graph 0.95
set label "10 Gbit/s" at 3*PHASE+2,graph 0.95
set y2range [0:0.11]
plot DATA using 1:2 with linespoints title "iteration time", \
     DATA using 1:3 axes x1y2 with steps lw 2 title "density in use", \
     1500 with lines dt 3 title "compute loops", \
     1.2 * 1500 with lines dt 2 title "1.2x compute loops", \
     (ALONE > 0 ? ALONE : 1/0) with lines dt 4 title "compute alone (measured)", \
     (ALONE > 0 ? 1.2 * ALONE : 1/0) with lines dt 1 lc rgb "red" title "1.2x compute alone"
