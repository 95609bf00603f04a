# bench_gpu (perf/gpu) on the CPU with a tiny GPT-2 (tests/e2e/scripts/bench_gpu_table.sh): the
# three modes run and print their JSON line, plain libtorch, full_shard and CPU offload start
# from the same loss (same init, same batch), and perf/gpu/table.py turns those lines plus a
# failed FSDP2 peer into the table. (One run per mode, shared by the loss check and the table.)
if(TARGET bench_gpu)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME e2e_bench_gpu_table
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/scripts/bench_gpu_table.sh ${Python3_EXECUTABLE}
              ${PROJECT_SOURCE_DIR}/perf/gpu/table.py ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} -np 1
              $<TARGET_FILE:bench_gpu>)
    set_tests_properties(e2e_bench_gpu_table PROPERTIES TIMEOUT 120 LABELS "e2e;mpi" FAIL_REGULAR_EXPRESSION "FAIL:"
      PASS_REGULAR_EXPRESSION "tiny, micro batch 4 x 64 tokens.*\\| shardtrain full_shard \\+ CPU offload \\| [0-9.]+ \\|.*\\| PyTorch FSDP2 fully_shard \\(python\\) \\| failed")
  endif()
endif()
