# attnlab study plot: re-render with `gnuplot recall_adamw-modern_lr_window.gp` in this folder
set terminal svg size 640,420 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw-modern_lr_window.svg'
set grid
set key top right
set multiplot layout 1,1 title 'recall/adamw-modern: working LR window (mean over seeds, 95% bootstrap)'
set logscale x 2
set xrange [10.6667:384]
set xlabel 'd_k'
set ylabel 'decades of LR that work'
set yrange [-0.1:4.19964]
set title '400 steps'
plot 'recall_adamw-modern_lr_window.dat' index 0 using ($1*1):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'recall_adamw-modern_lr_window.dat' index 1 using ($1*1.04):2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'recall_adamw-modern_lr_window.dat' index 2 using ($1*1.08):2:3:4 with yerrorlines lw 2 pt 7 title 'dk_qknorm', 'recall_adamw-modern_lr_window.dat' index 3 using ($1*1.12):2:3:4 with yerrorlines lw 2 pt 7 title 'dk_softcap', 'recall_adamw-modern_lr_window.dat' index 4 using ($1*1.16):2:3:4 with yerrorlines lw 2 pt 7 title 'none_qknorm', 'recall_adamw-modern_lr_window.dat' index 5 using ($1*1.2):2:3:4 with yerrorlines lw 2 pt 7 title 'none_softcap', 'recall_adamw-modern_lr_window.dat' index 6 using ($1*1.24):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_qknorm', 'recall_adamw-modern_lr_window.dat' index 7 using ($1*1.28):2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_softcap'
unset multiplot
