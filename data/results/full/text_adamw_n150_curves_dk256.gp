# attnlab study plot: re-render with `gnuplot text_adamw_n150_curves_dk256.gp` in this folder
set terminal svg size 420,380 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'text_adamw_n150_curves_dk256.svg'
set grid
set key top right
set multiplot layout 1,1 title 'text/adamw, 150 steps: eval loss during training at d_k = 256'
set xlabel 'step'
set ylabel 'eval loss'
set yrange [0:6]
set title 'peak lr = 0.0316'
plot 'text_adamw_n150_curves_dk256.dat' index 0 using 1:2 with lines lw 2 title 'none', 'text_adamw_n150_curves_dk256.dat' index 1 using 1:2 with lines lw 2 title 'sqrt_dk', 'text_adamw_n150_curves_dk256.dat' index 2 using 1:2 with lines lw 2 title 'dk'
unset multiplot
