# attnlab study plot: re-render with `gnuplot recall_adamw-modern_n400_attention_dk256.gp` in this folder
set terminal svg size 1000,760 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw-modern_n400_attention_dk256.svg'
set grid
set key top right
set multiplot layout 2,2 title 'recall/adamw-modern, 400 steps: layer 0 head 0 during training, d_k = 256, peak lr = 0.01'
set xlabel 'step'
set title 'attention entropy (nats)'
unset logscale y
set autoscale y
plot 'recall_adamw-modern_n400_attention_dk256.dat' index 0 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 1 using 1:2 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 2 using 1:2 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 3 using 1:2 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 4 using 1:2 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 5 using 1:2 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 6 using 1:2 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 7 using 1:2 with lines lw 2 title 'sqrt_dk_softcap'
set title 'max |scaled logit| (log scale)'
set logscale y
set autoscale y
plot 'recall_adamw-modern_n400_attention_dk256.dat' index 0 using 1:3 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 1 using 1:3 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 2 using 1:3 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 3 using 1:3 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 4 using 1:3 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 5 using 1:3 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 6 using 1:3 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 7 using 1:3 with lines lw 2 title 'sqrt_dk_softcap'
set title 'fraction of rows with max weight > 0.99'
unset logscale y
set yrange [0:1.05]
plot 'recall_adamw-modern_n400_attention_dk256.dat' index 0 using 1:4 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 1 using 1:4 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 2 using 1:4 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 3 using 1:4 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 4 using 1:4 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 5 using 1:4 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 6 using 1:4 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 7 using 1:4 with lines lw 2 title 'sqrt_dk_softcap'
set title 'attention mass on the correct key'
unset logscale y
set yrange [0:1.05]
plot 'recall_adamw-modern_n400_attention_dk256.dat' index 0 using 1:6 with lines lw 2 title 'sqrt_dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 1 using 1:6 with lines lw 2 title 'dk', 'recall_adamw-modern_n400_attention_dk256.dat' index 2 using 1:6 with lines lw 2 title 'dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 3 using 1:6 with lines lw 2 title 'dk_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 4 using 1:6 with lines lw 2 title 'none_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 5 using 1:6 with lines lw 2 title 'none_softcap', 'recall_adamw-modern_n400_attention_dk256.dat' index 6 using 1:6 with lines lw 2 title 'sqrt_dk_qknorm', 'recall_adamw-modern_n400_attention_dk256.dat' index 7 using 1:6 with lines lw 2 title 'sqrt_dk_softcap'
unset multiplot
