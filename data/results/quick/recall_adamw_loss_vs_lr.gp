# attnlab study plot: re-render with `gnuplot recall_adamw_loss_vs_lr.gp` in this folder
set terminal pngcairo size 1350,450 font ',10'
set termoption noenhanced
set output 'recall_adamw_loss_vs_lr.png'
set grid
set key top right
set multiplot layout 1,3 title 'recall/adamw: final eval loss vs peak LR (dashed: loss at init)'
set logscale x
set xrange [0.000666667:0.15]
set xlabel 'peak learning rate'
set ylabel 'final eval loss'
set yrange [0:5]
set title 'd_k = 16'
plot 'recall_adamw_loss_vs_lr.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'none', 'recall_adamw_loss_vs_lr.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title 'sqrt_dk', 'recall_adamw_loss_vs_lr.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title 'dk', 3.93755 with lines dt 2 lc rgb 'gray' notitle
set title 'd_k = 64'
plot 'recall_adamw_loss_vs_lr.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title 'none', 'recall_adamw_loss_vs_lr.dat' index 4 using 1:2 with linespoints lw 2 pt 7 title 'sqrt_dk', 'recall_adamw_loss_vs_lr.dat' index 5 using 1:2 with linespoints lw 2 pt 7 title 'dk', 3.93755 with lines dt 2 lc rgb 'gray' notitle
set title 'd_k = 256'
plot 'recall_adamw_loss_vs_lr.dat' index 6 using 1:2 with linespoints lw 2 pt 7 title 'none', 'recall_adamw_loss_vs_lr.dat' index 7 using 1:2 with linespoints lw 2 pt 7 title 'sqrt_dk', 'recall_adamw_loss_vs_lr.dat' index 8 using 1:2 with linespoints lw 2 pt 7 title 'dk', 3.93755 with lines dt 2 lc rgb 'gray' notitle
unset multiplot
