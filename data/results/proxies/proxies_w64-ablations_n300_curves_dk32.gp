# attnlab study plot: re-render with `gnuplot proxies_w64-ablations_n300_curves_dk32.gp` in this folder
set terminal svg size 840,380 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'proxies_w64-ablations_n300_curves_dk32.svg'
set grid
set key top right
set multiplot layout 1,2 title 'proxies/w64-ablations, 300 steps: eval loss during training at d_k = 32'
set xlabel 'step'
set ylabel 'eval loss'
set yrange [0:6]
set title 'peak lr = 0.01'
plot 'proxies_w64-ablations_n300_curves_dk32.dat' index 0 using 1:2 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w64-ablations_n300_curves_dk32.dat' index 1 using 1:2 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w64-ablations_n300_curves_dk32.dat' index 2 using 1:2 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w64-ablations_n300_curves_dk32.dat' index 3 using 1:2 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w64-ablations_n300_curves_dk32.dat' index 4 using 1:2 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w64-ablations_n300_curves_dk32.dat' index 5 using 1:2 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w64-ablations_n300_curves_dk32.dat' index 6 using 1:2 with lines lw 2 title 'sqrt_dk_warmup60'
set title 'peak lr = 0.03'
plot 'proxies_w64-ablations_n300_curves_dk32.dat' index 7 using 1:2 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w64-ablations_n300_curves_dk32.dat' index 8 using 1:2 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w64-ablations_n300_curves_dk32.dat' index 9 using 1:2 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w64-ablations_n300_curves_dk32.dat' index 10 using 1:2 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w64-ablations_n300_curves_dk32.dat' index 11 using 1:2 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w64-ablations_n300_curves_dk32.dat' index 12 using 1:2 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w64-ablations_n300_curves_dk32.dat' index 13 using 1:2 with lines lw 2 title 'sqrt_dk_warmup60'
unset multiplot
