# The validation loss of the modern preset against nanoGPT's CPU preset on the character-level
# Shakespeare run, against wall-clock time (examples/README.md, "The modern block"):
#   gnuplot -e "cpu='runs/shakespeare_char_cpu'; modern='runs/shakespeare_char_modern'; \
#               cpu_sps=0.0346; modern_sps=0.0423" data/results/shakespeare_char_modern/loss.gp
# reads each RUN/metrics.csv and writes data/results/shakespeare_char_modern/loss.png. *_sps is a
# run's wall seconds per step, summary.json's seconds / steps_done (evaluations included), which
# puts the runs on one time axis. The defaults are the committed runs beside this file.
if (!exists("cpu")) cpu = 'data/results/shakespeare_char_modern/cpu'
if (!exists("modern")) modern = 'data/results/shakespeare_char_modern/modern'
if (!exists("cpu_sps")) cpu_sps = 69.191576489 / 2000
if (!exists("modern_sps")) modern_sps = 84.54502669 / 2000
set terminal pngcairo size 800,500 font ",11"
set output 'data/results/shakespeare_char_modern/loss.png'
set datafile separator ','
set key top right
set grid
set xlabel 'wall-clock seconds (2 threads, the same machine)'
set ylabel 'validation cross-entropy (nats per character)'
set title "Shakespeare, 4 layers, width 128, block 64: the 2019 block against the modern one"
set yrange [1:5]
plot cpu.'/metrics.csv' using ($1*cpu_sps):3 with linespoints lw 2 \
         title 'shakespeare\_char\_cpu (learned positions, GELU, biases, untied)', \
     modern.'/metrics.csv' using ($1*modern_sps):3 with linespoints lw 2 \
         title 'shakespeare\_char\_modern (RoPE, QK-norm, ReLU², tied, no biases, cap 15)'
