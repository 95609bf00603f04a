# `shardtrain info` prints the mesh: 4 ranks as 2 simulated hosts of 2 (hybrid layout).
add_test(NAME e2e_info_mesh_2x2
  COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 4 $<TARGET_FILE:shardtrain> info
          --set parallel.simulate_ranks_per_host=2)
set_tests_properties(e2e_info_mesh_2x2 PROPERTIES PROCESSORS 4 TIMEOUT 120 LABELS "e2e;mpi"
  PASS_REGULAR_EXPRESSION "mesh: 2 replicate x 2 shard.*\n +3 +[^ ]+#1 +1 +cpu +shard\\[1\\] +2,3 +replicate\\[1\\] +1,3")
# A shard group size that does not divide the world is a clear error, exit 2 on every rank.
add_test(NAME e2e_info_bad_shard_size
  COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 3 $<TARGET_FILE:shardtrain> info
          --set parallel.shard_group_size=2)
set_tests_properties(e2e_info_bad_shard_size PROPERTIES PROCESSORS 3 TIMEOUT 120 LABELS "e2e;mpi" WILL_FAIL TRUE)
# The GEMM kernel selection through the real binary under mpirun (docs/performance.md): with
# OpenBLAS's choice forced to Prescott, `info` names the kernel that runs and its fp64 check;
# on a CPU with AVX2 or AVX-512 that is the selected better core. A user's OPENBLAS_CORETYPE is
# never overridden (some machines set one in the environment): unset here, so that the selection runs.
add_test(NAME e2e_info_blas_forced_fallback
  COMMAND ${CMAKE_COMMAND} -E env --unset=OPENBLAS_CORETYPE SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott
          ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 2 $<TARGET_FILE:shardtrain> info)
set_tests_properties(e2e_info_blas_forced_fallback PROPERTIES PROCESSORS 2 TIMEOUT 120 LABELS "e2e;mpi;blas"
  PASS_REGULAR_EXPRESSION "\n  BLAS [^\n]*core (SkylakeX|Haswell|Zen) \\(selected: OpenBLAS chose Prescott[^\n]*fp64 check ok|\n  BLAS [^\n]*\\((autodetected: OpenBLAS's own choice fits this CPU \\((sse|avx)\\)|not OpenBLAS)[^\n]*fp64 check ok")
