# plot-adapt-layers.gp: the density each bucket (one per tensor in gcoll-train) got at every
# step under a statistical GCOLL_ADAPT rule (data: "step bucket density" per line, from
# TRACE=FILE bench/adapt-train.sh). NAMES: the buckets' tensors, in bucket order.
# gnuplot -e "DATA='x.dat'; OUT='x.png'; TITLE='stage'" bench/plot-adapt-layers.gp
set terminal pngcairo size 900,480
set output OUT
if (!exists("NAMES")) NAMES = "fc3.bias fc3.weight fc2.bias fc2.weight fc1.bias fc1.weight"
if (!exists("TITLE")) TITLE = ""
set title TITLE
set xlabel "step"
set ylabel "density"
set logscale y
set key outside right font ",9"
plot for [j=0:words(NAMES)-1] sprintf("< awk '$2 == %d' %s", j, DATA) using 1:3 \
     with lines lw 1.5 title word(NAMES, j + 1)
