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
