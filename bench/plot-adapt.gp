# plot-adapt.gp: density chosen by GCOLL_ADAPT=bandwidth and iteration time per step while
# the links change rate (data: "time_s iteration_ms density" per line, from MODE=adapt).
set terminal pngcairo size 900,480
set output OUT
set xlabel "time (s)"
set ylabel "iteration (ms)"
set y2label "density (largest bucket)"
set y2tics
set ytics nomirror
set key bottom right
set arrow from 14,graph 0 to 14,graph 1 nohead dt 2
set arrow from 28,graph 0 to 28,graph 1 nohead dt 2
set arrow from 42,graph 0 to 42,graph 1 nohead dt 2
set label "10 Gbit/s" at 2,graph 0.95
set label "1 Gbit/s" at 16,graph 0.95
set label "200 Mbit/s" at 30,graph 0.95
set label "10 Gbit/s" at 44,graph 0.95
plot DATA using 1:2 with linespoints title "iteration time", \
     DATA using 1:3 axes x1y2 with steps lw 2 title "density", \
     1500 with lines dt 3 title "compute"
