# plot-dense.gp: busbw vs message size, one panel per rank count, from compare-dense.sh's plot.dat.
# Usage: gnuplot -e "datafile='plot.dat'; outfile='dense-busbw.png'; npeers=5; nps='2 4'" plot-dense.gp
# plot.dat holds one block per rank count (gnuplot "index"), each with a header line and
# columns: size, then median, min, max busbw for each peer.
if (!exists("datafile")) datafile = 'plot.dat'
if (!exists("outfile")) outfile = 'dense-busbw.png'
if (!exists("npeers")) npeers = 5
if (!exists("nps")) nps = '2 4'

panels = words(nps)
set terminal pngcairo noenhanced size 640 * panels, 520 font ",10"
set output outfile
set multiplot layout 1, panels title "float32 sum allreduce on loopback, busbw (median, bars: min-max of the runs)"
set logscale x 2
set xrange [3500:310000000]
set xtics ("4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576, \
           "4M" 4194304, "16M" 16777216, "64M" 67108864, "256M" 268435456)
# log y: the latency-bound small sizes and the bandwidth-bound large ones on one axis
set logscale y 10
set xlabel "message size (bytes)"
set ylabel "busbw (GB/s, log scale)"
set grid
set key bottom right box opaque
# gcoll solid and thick; TCP peers dashed; shared-memory ceiling dotted grey
set style line 1 lc rgb "#d62728" lw 3 pt 7
set style line 2 lc rgb "#1f77b4" lw 2 pt 5 dt 2
set style line 3 lc rgb "#2ca02c" lw 2 pt 9 dt 2
set style line 4 lc rgb "#9467bd" lw 2 pt 11 dt 2
set style line 5 lc rgb "#7f7f7f" lw 2 pt 13 dt 3
set style line 6 lc rgb "#ff7f0e" lw 3 pt 7
do for [b = 1:panels] {
    set title word(nps, b) . " ranks"
    plot for [i = 0:npeers - 1] datafile index (b - 1) \
        using 1:(column(2 + 3 * i)):(column(3 + 3 * i)):(column(4 + 3 * i)) \
        with yerrorlines ls (i + 1) title columnheader(2 + 3 * i)
}
unset multiplot
