# The loss curve of the character-level Shakespeare run (README, "Language modelling and
# generation"): gnuplot -e "run='runs/shakespeare_char_cpu'" data/results/shakespeare_char_cpu/loss.gp
# reads RUN/metrics.csv and writes data/results/shakespeare_char_cpu/loss.png.
if (!exists("run")) run = 'runs/shakespeare_char_cpu'
set terminal pngcairo size 800,500 font ",11"
set output 'data/results/shakespeare_char_cpu/loss.png'
set datafile separator ','
set key top right
set grid
set xlabel 'step'
set ylabel 'cross-entropy (nats per character)'
set title "attnlab, nanoGPT's CPU Shakespeare configuration (4 layers, 4 heads, width 128, block 64)"
set yrange [1:4]
plot run.'/metrics.csv' every ::1 using 1:2 with linespoints title 'train (batch at the logged step)', \
     run.'/metrics.csv' using 1:3 with linespoints lw 2 title 'validation (256 fixed blocks)', \
     1.88 with lines dt 2 title "1.88: nanoGPT's figure on its tinyshakespeare"
