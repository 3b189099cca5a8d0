# attnlab study plot: re-render with `gnuplot proxies_w128-ablations_n300_attention_dk32.gp` in this folder
set terminal svg size 1000,760 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'proxies_w128-ablations_n300_attention_dk32.svg'
set grid
set key top right
set multiplot layout 2,2 title 'proxies/w128-ablations, 300 steps: layer 0 head 0 during training, d_k = 32, peak lr = 0.01'
set xlabel 'step'
set title 'attention entropy (nats)'
unset logscale y
set autoscale y
plot 'proxies_w128-ablations_n300_attention_dk32.dat' index 0 using 1:2 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w128-ablations_n300_attention_dk32.dat' index 1 using 1:2 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w128-ablations_n300_attention_dk32.dat' index 2 using 1:2 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w128-ablations_n300_attention_dk32.dat' index 3 using 1:2 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 4 using 1:2 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w128-ablations_n300_attention_dk32.dat' index 5 using 1:2 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 6 using 1:2 with lines lw 2 title 'sqrt_dk_warmup60'
set title 'max |scaled logit| (log scale)'
set logscale y
set autoscale y
plot 'proxies_w128-ablations_n300_attention_dk32.dat' index 0 using 1:3 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w128-ablations_n300_attention_dk32.dat' index 1 using 1:3 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w128-ablations_n300_attention_dk32.dat' index 2 using 1:3 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w128-ablations_n300_attention_dk32.dat' index 3 using 1:3 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 4 using 1:3 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w128-ablations_n300_attention_dk32.dat' index 5 using 1:3 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 6 using 1:3 with lines lw 2 title 'sqrt_dk_warmup60'
set title 'fraction of rows with max weight > 0.99'
unset logscale y
set yrange [0:1.05]
plot 'proxies_w128-ablations_n300_attention_dk32.dat' index 0 using 1:4 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w128-ablations_n300_attention_dk32.dat' index 1 using 1:4 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w128-ablations_n300_attention_dk32.dat' index 2 using 1:4 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w128-ablations_n300_attention_dk32.dat' index 3 using 1:4 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 4 using 1:4 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w128-ablations_n300_attention_dk32.dat' index 5 using 1:4 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 6 using 1:4 with lines lw 2 title 'sqrt_dk_warmup60'
set title 'softmax Jacobian norm'
unset logscale y
set autoscale y
plot 'proxies_w128-ablations_n300_attention_dk32.dat' index 0 using 1:5 with lines lw 2 title 'qk_norm_gain_frozen', 'proxies_w128-ablations_n300_attention_dk32.dat' index 1 using 1:5 with lines lw 2 title 'qk_norm_gain_lr0.1', 'proxies_w128-ablations_n300_attention_dk32.dat' index 2 using 1:5 with lines lw 2 title 'qk_norm_no_shift', 'proxies_w128-ablations_n300_attention_dk32.dat' index 3 using 1:5 with lines lw 2 title 'qk_norm_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 4 using 1:5 with lines lw 2 title 'qk_norm_warmup60', 'proxies_w128-ablations_n300_attention_dk32.dat' index 5 using 1:5 with lines lw 2 title 'sqrt_dk_warmup150', 'proxies_w128-ablations_n300_attention_dk32.dat' index 6 using 1:5 with lines lw 2 title 'sqrt_dk_warmup60'
unset multiplot
