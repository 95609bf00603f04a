# Draws the report's PNGs; run from the report directory: gnuplot data/plots.gp
set terminal pngcairo size 1100,840 noenhanced font ',10'
set grid
set logscale x 2
set xtics ("1" 1, "2" 2, "4" 4)
set xrange [0.8:5.2]
set xlabel 'ranks'
set key outside right top vertical box
set output 'throughput.png'
set multiplot layout 2,1 title 'gpt2-byte-cpu-pass2: throughput'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'strong scaling (global batch 8)'
set ylabel 'tokens/s (median over timed steps)'
set yrange [0:*]
plot 'data/strong-full_shard-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/strong-full_shard-h2.dat' using 1:2 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/strong-shard_grad_op-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/strong-no_shard-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/strong-hybrid_shard-h2.dat' using 1:2 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  'data/strong-ideal.dat' using 1:2 with lines lw 1.5 lc rgb 'black' dt 2 title 'ideal: N x T_1', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'weak scaling (micro batch 2 per rank)'
set ylabel 'tokens/s (median over timed steps)'
set yrange [0:*]
plot 'data/weak-full_shard-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/weak-full_shard-h2.dat' using 1:2 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/weak-shard_grad_op-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/weak-no_shard-h1.dat' using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/weak-hybrid_shard-h2.dat' using 1:2 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  'data/weak-ideal.dat' using 1:2 with lines lw 1.5 lc rgb 'black' dt 2 title 'ideal: N x T_1', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset multiplot
set output 'efficiency.png'
set multiplot layout 2,1 title 'gpt2-byte-cpu-pass2: scaling efficiency T_N / (N x T_1)'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'strong scaling (global batch 8)'
set ylabel 'efficiency'
set yrange [0:1.2<*]
plot 'data/strong-full_shard-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/strong-full_shard-h2.dat' using 1:3 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/strong-shard_grad_op-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/strong-no_shard-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/strong-hybrid_shard-h2.dat' using 1:3 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  1 with lines lw 1.5 lc rgb 'black' dt 2 title 'ideal', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'weak scaling (micro batch 2 per rank)'
set ylabel 'efficiency'
set yrange [0:1.2<*]
plot 'data/weak-full_shard-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/weak-full_shard-h2.dat' using 1:3 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/weak-shard_grad_op-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/weak-no_shard-h1.dat' using 1:3 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/weak-hybrid_shard-h2.dat' using 1:3 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  1 with lines lw 1.5 lc rgb 'black' dt 2 title 'ideal', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset multiplot
set output 'memory.png'
set multiplot layout 2,1 title 'gpt2-byte-cpu-pass2: peak resident memory per rank (max over ranks)'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'strong scaling (global batch 8)'
set ylabel 'MiB'
set yrange [0:*]
plot 'data/strong-full_shard-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/strong-full_shard-h2.dat' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/strong-shard_grad_op-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/strong-no_shard-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/strong-hybrid_shard-h2.dat' using 1:4 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'weak scaling (micro batch 2 per rank)'
set ylabel 'MiB'
set yrange [0:*]
plot 'data/weak-full_shard-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/weak-full_shard-h2.dat' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/weak-shard_grad_op-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/weak-no_shard-h1.dat' using 1:4 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/weak-hybrid_shard-h2.dat' using 1:4 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset multiplot
set output 'comm.png'
set multiplot layout 2,1 title 'gpt2-byte-cpu-pass2: exposed communication'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'strong scaling (global batch 8)'
set ylabel '% of step time (median)'
set yrange [0:*]
plot 'data/strong-full_shard-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/strong-full_shard-h2.dat' using 1:5 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/strong-shard_grad_op-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/strong-no_shard-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/strong-hybrid_shard-h2.dat' using 1:5 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset arrow
set arrow from 2, graph 0 to 2, graph 1 nohead dt 3 lw 2 lc rgb 'gray50'
set title 'weak scaling (micro batch 2 per rank)'
set ylabel '% of step time (median)'
set yrange [0:*]
plot 'data/weak-full_shard-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#1f77b4' dt 1 pt 7 ps 1.3 title 'full_shard, 1 host', \
  'data/weak-full_shard-h2.dat' using 1:5 with linespoints lw 2 lc rgb '#1f77b4' dt 2 pt 5 ps 1.3 title 'full_shard, 2 hosts', \
  'data/weak-shard_grad_op-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#2ca02c' dt 1 pt 7 ps 1.3 title 'shard_grad_op, 1 host', \
  'data/weak-no_shard-h1.dat' using 1:5 with linespoints lw 2 lc rgb '#ff7f0e' dt 1 pt 7 ps 1.3 title 'no_shard, 1 host', \
  'data/weak-hybrid_shard-h2.dat' using 1:5 with linespoints lw 2 lc rgb '#d62728' dt 2 pt 5 ps 1.3 title 'hybrid_shard, 2 hosts', \
  NaN with lines dt 3 lw 2 lc rgb 'gray50' title '2 cores: more ranks share them'
unset multiplot
