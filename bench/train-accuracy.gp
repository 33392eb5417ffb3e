# train-accuracy.gp: test accuracy per epoch per gradient codec (bench/train-table.sh).
# gnuplot -e "datafile='acc.dat'; outfile='x.png'; ncols=10; subtitle='...'" train-accuracy.gp
# datafile: a header row of quoted method names, then epoch and one accuracy per method.
set terminal pngcairo size 1000,620 font ",11"
set output outfile
set title "gcoll-train: MLP 784-512-256-10 on Fashion-MNIST\n{/*0.8 ".subtitle."}"
set xlabel "epoch"
set ylabel "test accuracy"
set key outside right center
set grid
set xtics 1
set datafile missing "NaN"
# twelve distinguishable colours; methods whose run diverged have no points and no line
colors = "#000000 #e41a1c #ff7f00 #377eb8 #4daf4a #984ea3 #a65628 #f781bf #999999 #17becf #bcbd22 #1f3a93"
do for [t=1:12] { set linetype t lc rgb word(colors, t) lw 2 pt (t % 13 + 1) }
plot for [i=2:ncols] datafile using 1:i with linespoints lt (i - 1) title columnhead(i)
