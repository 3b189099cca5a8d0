# attnlab study plot: re-render with `gnuplot recall_adamw-modern_n400_curves_dk256.gp` in this folder
set terminal svg size 1680,380 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw-modern_n400_curves_dk256.svg'
set grid
set key top right
set multiplot layout 1,4 title 'recall/adamw-modern, 400 steps: eval loss during training at d_k = 256'
set xlabel 'step'
set ylabel 'eval loss'
set yrange [0:5]
set title 'peak lr = 0.00316'
plot 'recall_adamw-modern_n400_curves_dk256.dat' index 0 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 1 using 1:2 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 2 using 1:2 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 3 using 1:2 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 4 using 1:2 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 5 using 1:2 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 6 using 1:2 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 7 using 1:2 with lines lw 2 title 'sqrt_dk_softcap'
set title 'peak lr = 0.01'
plot 'recall_adamw-modern_n400_curves_dk256.dat' index 8 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 9 using 1:2 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 10 using 1:2 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 11 using 1:2 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 12 using 1:2 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 13 using 1:2 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 14 using 1:2 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 15 using 1:2 with lines lw 2 title 'sqrt_dk_softcap'
set title 'peak lr = 0.0316'
plot 'recall_adamw-modern_n400_curves_dk256.dat' index 16 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 17 using 1:2 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 18 using 1:2 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 19 using 1:2 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 20 using 1:2 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 21 using 1:2 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 22 using 1:2 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 23 using 1:2 with lines lw 2 title 'sqrt_dk_softcap'
set title 'peak lr = 0.1'
plot 'recall_adamw-modern_n400_curves_dk256.dat' index 24 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 25 using 1:2 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_curves_dk256.dat' index 26 using 1:2 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 27 using 1:2 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 28 using 1:2 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 29 using 1:2 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_curves_dk256.dat' index 30 using 1:2 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_curves_dk256.dat' index 31 using 1:2 with lines lw 2 title 'sqrt_dk_softcap'
unset multiplot
