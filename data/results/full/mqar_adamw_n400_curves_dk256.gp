# attnlab study plot: re-render with `gnuplot mqar_adamw_n400_curves_dk256.gp` in this folder
set terminal svg size 840,380 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'mqar_adamw_n400_curves_dk256.svg'
set grid
set key top right
set multiplot layout 1,2 title 'mqar/adamw, 400 steps: eval loss during training at d_k = 256'
set xlabel 'step'
set ylabel 'eval loss'
set yrange [0:6]
set title 'peak lr = 0.00316'
plot 'mqar_adamw_n400_curves_dk256.dat' index 0 using 1:2 with lines lw 2 title 'none', 'mqar_adamw_n400_curves_dk256.dat' index 1 using 1:2 with lines lw 2 title 'sqrt_dk', 'mqar_adamw_n400_curves_dk256.dat' index 2 using 1:2 with lines lw 2 title 'dk'
set title 'peak lr = 0.01'
plot 'mqar_adamw_n400_curves_dk256.dat' index 3 using 1:2 with lines lw 2 title 'none', 'mqar_adamw_n400_curves_dk256.dat' index 4 using 1:2 with lines lw 2 title 'sqrt_dk', 'mqar_adamw_n400_curves_dk256.dat' index 5 using 1:2 with lines lw 2 title 'dk'
unset multiplot
