# attnlab study plot: re-render with `gnuplot recall_adamw_n1600_attention_dk256.gp` in this folder
set terminal svg size 1000,760 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw_n1600_attention_dk256.svg'
set grid
set key top right
set multiplot layout 2,2 title 'recall/adamw, 1600 steps: layer 0 head 0 during training, d_k = 256, peak lr = 0.00316'
set xlabel 'step'
set title 'attention entropy (nats)'
unset logscale y
set autoscale y
plot 'recall_adamw_n1600_attention_dk256.dat' index 0 using 1:2 with lines lw 2 title 'none', 'recall_adamw_n1600_attention_dk256.dat' index 1 using 1:2 with lines lw 2 title 'sqrt_dk', 'recall_adamw_n1600_attention_dk256.dat' index 2 using 1:2 with lines lw 2 title 'dk'
set title 'max |scaled logit| (log scale)'
set logscale y
set autoscale y
plot 'recall_adamw_n1600_attention_dk256.dat' index 0 using 1:3 with lines lw 2 title 'none', 'recall_adamw_n1600_attention_dk256.dat' index 1 using 1:3 with lines lw 2 title 'sqrt_dk', 'recall_adamw_n1600_attention_dk256.dat' index 2 using 1:3 with lines lw 2 title 'dk'
set title 'fraction of rows with max weight > 0.99'
unset logscale y
set yrange [0:1.05]
plot 'recall_adamw_n1600_attention_dk256.dat' index 0 using 1:4 with lines lw 2 title 'none', 'recall_adamw_n1600_attention_dk256.dat' index 1 using 1:4 with lines lw 2 title 'sqrt_dk', 'recall_adamw_n1600_attention_dk256.dat' index 2 using 1:4 with lines lw 2 title 'dk'
set title 'attention mass on the correct key'
unset logscale y
set yrange [0:1.05]
plot 'recall_adamw_n1600_attention_dk256.dat' index 0 using 1:6 with lines lw 2 title 'none', 'recall_adamw_n1600_attention_dk256.dat' index 1 using 1:6 with lines lw 2 title 'sqrt_dk', 'recall_adamw_n1600_attention_dk256.dat' index 2 using 1:6 with lines lw 2 title 'dk'
unset multiplot
