# bench_gpu (perf/gpu) on the CPU with a tiny GPT-2: the three modes run, print their JSON line,
# and plain libtorch, full_shard and CPU offload start from the same loss (same init, same batch).
if(TARGET bench_gpu)
  foreach(mode plain fsdp offload)
    add_test(NAME e2e_bench_gpu_cpu_${mode}
      COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 1 $<TARGET_FILE:bench_gpu> --device cpu
              --model tiny --seq 64 --micro-batch 4 --steps 2 --warmup 1 --dtype fp32 --mode ${mode})
    set_tests_properties(e2e_bench_gpu_cpu_${mode} PROPERTIES TIMEOUT 120 LABELS "e2e;mpi"
      PASS_REGULAR_EXPRESSION "\"mode\": \"${mode}\".*\"loss_first\": 6\\.25265")
  endforeach()
endif()
# perf/gpu/table.py turns the bench lines (here the CPU ones, plus a failed peer) into the table.
if(TARGET bench_gpu)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME e2e_bench_gpu_table
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/scripts/bench_gpu_table.sh ${Python3_EXECUTABLE}
              ${PROJECT_SOURCE_DIR}/perf/gpu/table.py ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 1
              $<TARGET_FILE:bench_gpu>)
    set_tests_properties(e2e_bench_gpu_table PROPERTIES TIMEOUT 120 LABELS "e2e;mpi"
      PASS_REGULAR_EXPRESSION "tiny, micro batch 2 x 32 tokens.*\\| shardtrain full_shard \\+ CPU offload \\| [0-9.]+ \\|.*\\| PyTorch FSDP2 fully_shard \\(python\\) \\| failed")
  endif()
endif()
