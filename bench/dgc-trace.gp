# dgc-trace.gp: per-layer density, fraction updated and residual norm over the steps
# (bench/dgc-trace.sh). gnuplot -e "dir='...'; outfile='x.png'; spe=468; subtitle='...'" dgc-trace.gp
set terminal pngcairo size 1300,520 font ",10"
set output outfile
set multiplot layout 1, 2 title "DGC on gcoll-train's MLP: what each layer gets\n{/*0.8 ".subtitle."}"
set xlabel "step"
set grid
set logscale y
set yrange [0.0005:1.5]
set key top right
colors = "#e41a1c #ff7f00 #377eb8 #4daf4a #984ea3 #a65628"
do for [t=1:6] { set linetype t lc rgb word(colors, t) lw 2 }
names = "fc1.weight fc1.bias fc2.weight fc2.bias fc3.weight fc3.bias"
set title "fraction of the tensor updated per step (dashed: density in force)"
set ylabel "fraction"
plot for [i=1:6] dir."/".word(names, i).".dat" using 1:3 with lines lt i title word(names, i), \
     dir."/fc1.weight.dat" using 1:2 with lines dt 2 lc rgb "#000000" title "density"
set title "|accumulated residual| / |gradient| (per rank)"
set yrange [0.01:1000]
set ylabel "ratio"
plot for [i=1:6] dir."/".word(names, i).".dat" using 1:4 with lines lt i title word(names, i)
unset multiplot
