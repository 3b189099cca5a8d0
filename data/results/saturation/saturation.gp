# attnlab saturation: re-render with `gnuplot saturation.gp`
set terminal pngcairo size 1500,900
set termoption noenhanced
set output 'saturation.png'
set multiplot layout 2,3 title 'Attention at initialisation vs d_k (64 keys, x unit RMS, W ~ N(0,1/d_model))'
set logscale x 2
set xlabel 'd_k'
set grid
set key top left
set title 'entropy / ln Tk'
set key bottom left
plot 'saturation.dat' index 0 using 1:3 with linespoints lw 2 title 'none', 'saturation.dat' index 1 using 1:3 with linespoints lw 2 title 'sqrt_dk', 'saturation.dat' index 2 using 1:3 with linespoints lw 2 title 'dk'
set title 'mean max weight'
set key top left
plot 'saturation.dat' index 0 using 1:4 with linespoints lw 2 title 'none', 'saturation.dat' index 1 using 1:4 with linespoints lw 2 title 'sqrt_dk', 'saturation.dat' index 2 using 1:4 with linespoints lw 2 title 'dk'
set title 'fraction of rows saturated (max w > 0.99)'
set key top left
plot 'saturation.dat' index 0 using 1:5 with linespoints lw 2 title 'none', 'saturation.dat' index 1 using 1:5 with linespoints lw 2 title 'sqrt_dk', 'saturation.dat' index 2 using 1:5 with linespoints lw 2 title 'dk'
set title 'softmax Jacobian norm'
set key top left
plot 'saturation.dat' index 0 using 1:6 with linespoints lw 2 title 'none', 'saturation.dat' index 1 using 1:6 with linespoints lw 2 title 'sqrt_dk', 'saturation.dat' index 2 using 1:6 with linespoints lw 2 title 'dk'
set title 'Var(q.k)/d_k (unscaled dots)'
set key top left
set yrange [0:2]
plot 'saturation.dat' index 0 using 1:2 with linespoints lw 2 title 'none', 'saturation.dat' index 1 using 1:2 with linespoints lw 2 title 'sqrt_dk', 'saturation.dat' index 2 using 1:2 with linespoints lw 2 title 'dk'
unset multiplot
