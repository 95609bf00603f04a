# Optimizer layer: fused kernels against torch::optim, masks, schedules, reductions.
add_unit_test(NAME test_optim
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_optim_kokkos_env.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_optim_layer.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_optim_torch_reference.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_optim_device_math.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_optim_outer_sgd.cpp
  LIBS shardtrain::optim shardtrain::torch
  LABELS optim TIMEOUT 300)
