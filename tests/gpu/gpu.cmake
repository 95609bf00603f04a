# GPU tests (label gpu; scripts/gpu-check runs `ctest -L gpu`). On a machine or build that cannot
# run them (no GPU, a CPU libtorch, no NCCL) they exit 77 and CTest reports them as skipped; where
# a GPU is present (or SHARDTRAIN_GPU_REQUIRED=1) the same exits 1, a failure (gpu_required.h).
# The TIMEOUTs fit stage A of scripts/gpu-check (about 3 minutes for the tests after the build,
# run side by side with ctest -j), so a hang is reported before the device call's limit.
set(SHARDTRAIN_GPU_SKIP 77)
add_library(shardtrain_gpu_gtest STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu_test_main.cpp)
target_link_libraries(shardtrain_gpu_gtest PUBLIC GTest::gtest shardtrain::runtime)

# The CUDA AdamW kernel against Kokkos, bit for bit (needs nvcc for the kernel, cudart to run).
if(SHARDTRAIN_HAVE_CUDA_KERNELS)
  add_executable(test_gpu_adamw ${CMAKE_CURRENT_LIST_DIR}/test_gpu_adamw.cpp)
  target_link_libraries(test_gpu_adamw PRIVATE shardtrain::optim CUDA::cudart GTest::gtest)
  add_test(NAME gpu_adamw_cuda COMMAND test_gpu_adamw)
  set_tests_properties(gpu_adamw_cuda PROPERTIES LABELS "gpu;unit" TIMEOUT 90
                       SKIP_RETURN_CODE ${SHARDTRAIN_GPU_SKIP})
endif()

# NCCL collectives and the engine on CUDA use c10::cuda: a CUDA libtorch only.
if(SHARDTRAIN_TORCH_CUDA)
  foreach(t nccl engine)
    add_executable(test_gpu_${t} ${CMAKE_CURRENT_LIST_DIR}/test_gpu_${t}.cpp)
    target_link_libraries(test_gpu_${t} PRIVATE shardtrain_gpu_gtest shardtrain::fsdp shardtrain::model)
    shardtrain_torch_pch(test_gpu_${t})
  endforeach()
  add_mpi_test(NAME gpu_nccl TARGET test_gpu_nccl NP 1 2 LABELS gpu TIMEOUT 150)
  add_mpi_test(NAME gpu_engine TARGET test_gpu_engine NP 1 2 LABELS gpu TIMEOUT 150)
  # The trainer on the GPU, end to end (against the CPU, resume, offload, SGD, bf16).
  if(TARGET shardtrain)
    add_test(NAME gpu_train COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_gpu.sh $<TARGET_FILE:shardtrain>
             ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(gpu_train PROPERTIES LABELS "gpu;e2e" TIMEOUT 240 PROCESSORS 2
                         ENVIRONMENT "OMP_NUM_THREADS=1" SKIP_RETURN_CODE ${SHARDTRAIN_GPU_SKIP})
  endif()
  foreach(name gpu_nccl_np1 gpu_nccl_np2 gpu_engine_np1 gpu_engine_np2)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${SHARDTRAIN_GPU_SKIP})
  endforeach()
else()
  if(TARGET shardtrain_fsdp_device_cuda_check)
    # Compiled (not linked) against this libtorch's c10/cuda headers, as src/fsdp does for
    # device.cpp, so that CI catches compile errors in the tests it cannot run.
    add_library(shardtrain_gpu_tests_compile_check OBJECT
      ${CMAKE_CURRENT_LIST_DIR}/test_gpu_nccl.cpp ${CMAKE_CURRENT_LIST_DIR}/test_gpu_engine.cpp)
    target_include_directories(shardtrain_gpu_tests_compile_check PRIVATE ${PROJECT_BINARY_DIR}/src/fsdp/torch_cuda_shim)
    target_link_libraries(shardtrain_gpu_tests_compile_check PRIVATE shardtrain::fsdp shardtrain::model GTest::gtest CUDA::cudart)
  endif()
  # Say so in the gpu label instead of silently having fewer tests.
  # On a GPU machine (or under SHARDTRAIN_GPU_REQUIRED=1) a CPU libtorch is a failure, not a skip.
  add_test(NAME gpu_torch_cuda COMMAND bash -c
           "why='gpu_nccl, gpu_engine and gpu_train need a CUDA libtorch (-DTorch_DIR=...); this build has ${Torch_VERSION} CPU'; \
            if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ] || [ \"$SHARDTRAIN_GPU_REQUIRED\" = 1 ]; then echo \"FAIL: $why, on a GPU machine\"; exit 1; fi; \
            echo \"SKIP: $why\"; exit 77")
  set_tests_properties(gpu_torch_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
endif()

# When a gpu test may skip and when it must fail, checked on the CPU (label e2e, not gpu: on the GPU
# machine these rules are what `ctest -L gpu` itself is held to).
if(TARGET shardtrain)
  if(TARGET test_gpu_adamw)
    set(_adamw $<TARGET_FILE:test_gpu_adamw>)
  else()
    set(_adamw -)
  endif()
  add_test(NAME e2e_gpu_skip_rules COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/skip_rules.sh $<TARGET_FILE:shardtrain>
           ${_adamw} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_gpu_skip_rules PROPERTIES LABELS "e2e" TIMEOUT 120 SKIP_RETURN_CODE 77
                       PASS_REGULAR_EXPRESSION "skip rules: OK")
endif()
