# model-scaling.gp: gcoll-model's projected allreduce time against the rank count, one panel
# per tensor size and link (bench/model-plot.sh writes the data and calls this).
# Usage: gnuplot -e "dir='DIR'; outfile='model-scaling.png'" model-scaling.gp
# DIR holds t-25000000-10.dat, t-25000000-100.dat, t-340000000-10.dat, t-340000000-100.dat:
# the plain output of gcoll-model table (columns: ranks, ring, rhd, tree, topk allgather,
# topk split, topk oktopk, q8, hier ring, hier topk).
if (!exists("dir")) dir = '.'
if (!exists("outfile")) outfile = 'model-scaling.png'
set terminal pngcairo noenhanced size 1200, 900 font ",10"
set output outfile
set datafile missing "-"
set multiplot layout 2, 2 title "gcoll-model: projected time per allreduce (float32 sum; hierarchical: 8 ranks per host)"
set logscale x 2
set logscale y 10
set xrange [2:4096]
set format x "%.0f"
set xlabel "ranks"
set ylabel "time per allreduce (s, log scale)"
set grid
set key top left box opaque font ",9"
set style line 1 lc rgb "#1f77b4" lw 2 pt 5
set style line 2 lc rgb "#2ca02c" lw 2 pt 9 dt 2
set style line 3 lc rgb "#d62728" lw 2 pt 7
set style line 4 lc rgb "#ff7f0e" lw 2 pt 11
set style line 5 lc rgb "#9467bd" lw 2 pt 13
set style line 6 lc rgb "#8c564b" lw 2 pt 3 dt 3
set style line 7 lc rgb "#7f7f7f" lw 2 pt 1 dt 4
do for [c in "25000000 340000000"] {
    do for [g in "10 100"] {
        f = sprintf("%s/t-%s-%s.dat", dir, c, g)
        set title sprintf("%s floats (%s), %s Gbit/s", c eq "25000000" ? "25M" : "340M", \
                          c eq "25000000" ? "ResNet-50" : "BERT-large", g)
        plot f using 1:2 with linespoints ls 1 title "dense ring", \
             f using 1:3 with linespoints ls 2 title "dense rhd", \
             f using 1:5 with linespoints ls 3 title "top-k 1% allgather (SparCML)", \
             f using 1:7 with linespoints ls 4 title "top-k 1% Ok-Topk (O(k))", \
             f using 1:8 with linespoints ls 5 title "q8", \
             f using 1:9 with linespoints ls 6 title "hierarchical dense ring", \
             f using 1:10 with linespoints ls 7 title "hierarchical top-k 1%"
    }
}
unset multiplot
