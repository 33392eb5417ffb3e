# train-accuracy.gp: test accuracy per epoch per gradient codec, one panel per rank count
# (bench/train-table.sh).
# gnuplot -e "files='a-2.dat a-4.dat'; ranks='2 4'; outfile='x.png'; ncols=12; subtitle='...'" train-accuracy.gp
# each file: a header row of quoted method names, then epoch and one accuracy per method.
np = words(files)
set terminal pngcairo size 1300,560 font ",10"
set output outfile
set multiplot layout 1, np title "gcoll-train: MLP 784-512-256-10 on Fashion-MNIST\n{/*0.8 ".subtitle."}"
set xlabel "epoch"
set ylabel "test accuracy"
set grid
set xtics 1
set yrange [0.78:0.89]
set datafile missing "NaN"
colors = "#000000 #e41a1c #ff7f00 #377eb8 #4daf4a #984ea3 #a65628 #f781bf #999999 #17becf #bcbd22 #1f3a93"
do for [t=1:12] { set linetype t lc rgb word(colors, t) lw 2 pt (t % 13 + 1) }
do for [p=1:np] {
    set title word(ranks, p)." ranks"
    # the first panel has every method: its key names the colours of both
    if (p == 1) { set key inside bottom right font ",9" } else { unset key }
    plot for [i=2:ncols] word(files, p) using 1:i with linespoints lt (i - 1) title columnhead(i)
}
unset multiplot
