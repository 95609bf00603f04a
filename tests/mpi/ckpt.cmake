# Checkpoint tests: reshard matrix, train state, commit/rotation/resume, async, corrupt and
# hostile files, tools; files go to ${CMAKE_BINARY_DIR}/ckpt_test/<test>_np<N>.
file(GLOB CKPT_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_ckpt*.cpp)
add_executable(test_ckpt ${CKPT_TEST_SOURCES})
target_link_libraries(test_ckpt PRIVATE shardtrain_mpi_gtest shardtrain::ckpt)
target_compile_definitions(test_ckpt PRIVATE CKPT_TEST_DIR="${CMAKE_BINARY_DIR}/ckpt_test")
shardtrain_torch_pch(test_ckpt)
add_mpi_test(NAME ckpt TARGET test_ckpt NP 1 2 3 4 TIMEOUT 600)
# The np=2 run leaves a checkpoint and the values it must hold for the h5py check.
set_tests_properties(ckpt_np2 PROPERTIES FIXTURES_SETUP ckpt_python_files)
execute_process(COMMAND /usr/bin/python3 -c "import h5py, numpy" RESULT_VARIABLE CKPT_HAVE_H5PY OUTPUT_QUIET ERROR_QUIET)
if(CKPT_HAVE_H5PY EQUAL 0)
  add_test(NAME ckpt_python_h5py
    COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/python/check_ckpt_h5py.py ${CMAKE_BINARY_DIR}/ckpt_test/python_np2)
  set_tests_properties(ckpt_python_h5py PROPERTIES FIXTURES_REQUIRED ckpt_python_files LABELS "mpi;python" TIMEOUT 120)
endif()
