# attnlab study plot: re-render with `gnuplot recall_adamw-modern_n400_loss_vs_lr.gp` in this folder
set terminal svg size 1260,420 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw-modern_n400_loss_vs_lr.svg'
set grid
set key top right
set multiplot layout 1,3 title 'recall/adamw-modern, 400 steps: final eval loss vs peak LR (mean, 95% bootstrap; dashed: at init)'
set logscale x
set xrange [6.66667e-05:0.474]
set xlabel 'peak learning rate'
set ylabel 'final eval loss'
set yrange [0:5]
set title 'd_k = 16'
plot 'recall_adamw-modern_n400_loss_vs_lr.dat' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 2 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 3 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 4 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 5 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 6 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 7 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_softcap', 3.94471 with lines dt 2 lc rgb 'gray' notitle
set title 'd_k = 64'
plot 'recall_adamw-modern_n400_loss_vs_lr.dat' index 8 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 9 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 10 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 11 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 12 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 13 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 14 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 15 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_softcap', 3.94471 with lines dt 2 lc rgb 'gray' notitle
set title 'd_k = 256'
plot 'recall_adamw-modern_n400_loss_vs_lr.dat' index 16 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 17 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 18 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 19 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 20 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 21 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_softcap', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 22 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_loss_vs_lr.dat' index 23 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_softcap', 3.94471 with lines dt 2 lc rgb 'gray' notitle
unset multiplot
