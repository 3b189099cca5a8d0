# Muon + AdamW against AdamW alone on the modern Shakespeare preset (examples/README.md, "Muon
# against AdamW"): validation loss against steps (left) and against wall-clock seconds (right):
#   gnuplot data/results/shakespeare_char_muon/loss.gp
# reads the three runs beside this file (adamw: lr 2e-3; muon: --optimizer muon --muon-lr 0.01,
# lr 1e-3; muon_walltime: the same with --steps 1279, AdamW's wall time) and writes loss.png. A
# run's seconds per step is summary.json's seconds / steps_done (evaluations included).
dir = 'data/results/shakespeare_char_muon'
adamw_sps = 83.451007926 / 2000
muon_sps = 130.480594795 / 2000
wall_sps = 81.9 / 1279
set terminal pngcairo size 1200,480 font ",11"
set output dir.'/loss.png'
set datafile separator ','
set grid
set key top right
set yrange [1.5:2.6]
set ylabel 'validation cross-entropy (nats per character)'
set multiplot layout 1,2 title "Shakespeare, modern block (4 layers, width 128, block 64, batch 12), 2 threads"
set xlabel 'step'
plot dir.'/adamw/metrics.csv' using 1:3 every ::1 with linespoints lw 2 title 'AdamW, lr 2e-3', \
     dir.'/muon/metrics.csv' using 1:3 every ::1 with linespoints lw 2 title 'Muon 0.01 + AdamW 1e-3', \
     dir.'/muon_walltime/metrics.csv' using 1:3 every ::1 with linespoints lw 2 title 'the same, 1279 steps (AdamW''s wall time)'
set xlabel 'wall-clock seconds'
plot dir.'/adamw/metrics.csv' using ($1*adamw_sps):3 every ::1 with linespoints lw 2 title 'AdamW, lr 2e-3', \
     dir.'/muon/metrics.csv' using ($1*muon_sps):3 every ::1 with linespoints lw 2 title 'Muon 0.01 + AdamW 1e-3', \
     dir.'/muon_walltime/metrics.csv' using ($1*wall_sps):3 every ::1 with linespoints lw 2 title 'the same, 1279 steps'
unset multiplot
