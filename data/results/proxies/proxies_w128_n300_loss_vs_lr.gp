# attnlab study plot: re-render with `gnuplot proxies_w128_n300_loss_vs_lr.gp` in this folder
set terminal svg size 420,420 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'proxies_w128_n300_loss_vs_lr.svg'
set grid
set key top right
set multiplot layout 1,1 title 'proxies/w128, 300 steps: final eval loss vs peak LR (mean, 95% bootstrap; dashed: at init)'
set logscale x
set xrange [0.0002:0.45]
set xlabel 'peak learning rate'
set ylabel 'final eval loss'
set yrange [0:6]
set title 'd_k = 32'
plot 'proxies_w128_n300_loss_vs_lr.dat' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'proxies_w128_n300_loss_vs_lr.dat' index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'proxies_w128_n300_loss_vs_lr.dat' index 2 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm', 'proxies_w128_n300_loss_vs_lr.dat' index 3 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'softcap', 4.89605 with lines dt 2 lc rgb 'gray' notitle
unset multiplot
