# add_mpi_test(NAME <name> TARGET <exe> NP <n>... [ARGS ...] [LABELS ...] [TIMEOUT s])
# Registers <name>_np<n> for each rank count, launched through mpirun with the flags
# this project needs on shared CPU machines, and sets PROCESSORS so ctest -j packs them.
execute_process(COMMAND id -u OUTPUT_VARIABLE SHARDTRAIN_UID OUTPUT_STRIP_TRAILING_WHITESPACE)
set(SHARDTRAIN_MPIRUN_FLAGS --oversubscribe --bind-to none)
if(SHARDTRAIN_UID STREQUAL "0")
  list(PREPEND SHARDTRAIN_MPIRUN_FLAGS --allow-run-as-root)
endif()

function(add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "NP;ARGS;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(np IN LISTS T_NP)
    set(test_name ${T_NAME}_np${np})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np}
              $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
    set_tests_properties(${test_name} PROPERTIES PROCESSORS ${np} TIMEOUT ${T_TIMEOUT}
      LABELS "mpi;${T_LABELS}"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;${T_ENV}")
  endforeach()
endfunction()

# add_unit_test(NAME <name> SOURCES ... LIBS ... [LABELS ...])
function(add_unit_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}")
endfunction()

# shardtrain_library(<layer> SOURCES ... DEPS ... [TORCH]) -> target shardtrain_<layer>,
# alias shardtrain::<layer>; TORCH adds libtorch and the precompiled torch header.
function(shardtrain_library layer)
  cmake_parse_arguments(L "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(shardtrain_${layer} STATIC ${L_SOURCES})
  add_library(shardtrain::${layer} ALIAS shardtrain_${layer})
  target_include_directories(shardtrain_${layer} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(shardtrain_${layer} PUBLIC ${L_DEPS})
  if(L_TORCH)
    target_link_libraries(shardtrain_${layer} PUBLIC shardtrain::torch)
    shardtrain_torch_pch(shardtrain_${layer})
  endif()
endfunction()

# Gives a target the precompiled torch header.
function(shardtrain_torch_pch target)
  target_precompile_headers(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
endfunction()
