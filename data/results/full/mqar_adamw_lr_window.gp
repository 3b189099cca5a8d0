# attnlab study plot: re-render with `gnuplot mqar_adamw_lr_window.gp` in this folder
set terminal svg size 640,420 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'mqar_adamw_lr_window.svg'
set grid
set key top right
set multiplot layout 1,1 title 'mqar/adamw: working LR window (mean over seeds, 95% bootstrap)'
set logscale x 2
set xrange [10.6667:384]
set xlabel 'd_k'
set ylabel 'decades of LR that work'
set yrange [-0.1:3.19962]
set title '400 steps'
plot 'mqar_adamw_lr_window.dat' index 0 using ($1*1):2:3:4 with yerrorlines lw 2 pt 7 title 'none', 'mqar_adamw_lr_window.dat' index 1 using ($1*1.04):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'mqar_adamw_lr_window.dat' index 2 using ($1*1.08):2:3:4 with yerrorlines lw 2 pt 7 title 'dk'
unset multiplot
