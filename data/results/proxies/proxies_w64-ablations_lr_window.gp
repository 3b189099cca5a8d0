# attnlab study plot: re-render with `gnuplot proxies_w64-ablations_lr_window.gp` in this folder
set terminal svg size 640,420 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'proxies_w64-ablations_lr_window.svg'
set grid
set key top right
set multiplot layout 1,1 title 'proxies/w64-ablations: working LR window (mean over seeds, 95% bootstrap)'
set logscale x 2
set xrange [21.3333:48]
set xlabel 'd_k'
set ylabel 'decades of LR that work'
set yrange [-0.1:3.7]
set title '300 steps'
plot 'proxies_w64-ablations_lr_window.dat' index 0 using ($1*1):2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm_gain_frozen', 'proxies_w64-ablations_lr_window.dat' index 1 using ($1*1.04):2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm_gain_lr0.1', 'proxies_w64-ablations_lr_window.dat' index 2 using ($1*1.08):2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm_no_shift', 'proxies_w64-ablations_lr_window.dat' index 3 using ($1*1.12):2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm_warmup150', 'proxies_w64-ablations_lr_window.dat' index 4 using ($1*1.16):2:3:4 with yerrorlines lw 2 pt 7 title 'qk_norm_warmup60', 'proxies_w64-ablations_lr_window.dat' index 5 using ($1*1.2):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_warmup150', 'proxies_w64-ablations_lr_window.dat' index 6 using ($1*1.24):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_warmup60'
unset multiplot
