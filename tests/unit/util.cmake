add_unit_test(NAME test_util SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_util.cpp LIBS shardtrain::util)
# Creating files in shared directories (planted links, FIFOs, devices) and path keys (docs/security.md).
add_unit_test(NAME test_util_files SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_util_files.cpp LIBS shardtrain::util)

# GEMM kernel selection (runtime/blas_kernel.h): the decision table, the fp64 check, and whole
# processes through the driver (default, forced fallback, bits vs the exported core, OPENBLAS_CORETYPE, off switch, mpirun).
add_executable(blas_kernel_driver ${CMAKE_CURRENT_LIST_DIR}/blas_kernel_driver.cpp)
target_link_libraries(blas_kernel_driver PRIVATE shardtrain::runtime shardtrain::torch)
add_unit_test(NAME test_blas_kernel SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_blas_kernel.cpp
  LIBS shardtrain::runtime shardtrain::torch LABELS "blas" TIMEOUT 120)
target_compile_definitions(test_blas_kernel PRIVATE BLAS_DRIVER="$<TARGET_FILE:blas_kernel_driver>"
                                                    MPIEXEC="${MPIEXEC_EXECUTABLE}")
add_dependencies(test_blas_kernel blas_kernel_driver)

# A private Open MPI session directory per singleton (runtime/singleton_session.h), down to a
# real isolated singleton MPI_Init.
add_unit_test(NAME test_singleton_session SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_singleton_session.cpp
  LIBS shardtrain::runtime LABELS "mpi_start" TIMEOUT 60)
set_tests_properties(test_singleton_session PROPERTIES
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_ess_singleton_isolated=1")
