# attnlab study plot: re-render with `gnuplot recall_adamw-modern_jacobian_init.gp` in this folder
set terminal svg size 640,440 font 'sans,11' background '#ffffff'
set termoption noenhanced
set output 'recall_adamw-modern_jacobian_init.svg'
set grid
set key top right
set multiplot layout 1,1 title 'recall/adamw-modern: softmax Jacobian norm at initialisation'
set logscale x 2
set logscale y
set xlabel 'd_k'
set ylabel 'mean ||diag(p) - p p^T||_F at step 0'
set key bottom left
plot 'recall_adamw-modern_jacobian_init.dat' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk', 'recall_adamw-modern_jacobian_init.dat' index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk', 'recall_adamw-modern_jacobian_init.dat' index 2 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_qknorm', 'recall_adamw-modern_jacobian_init.dat' index 3 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'dk_softcap', 'recall_adamw-modern_jacobian_init.dat' index 4 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_qknorm', 'recall_adamw-modern_jacobian_init.dat' index 5 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'none_softcap', 'recall_adamw-modern_jacobian_init.dat' index 6 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_qknorm', 'recall_adamw-modern_jacobian_init.dat' index 7 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'sqrt_dk_softcap'
unset multiplot
