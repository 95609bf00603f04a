add_executable(test_runtime ${CMAKE_CURRENT_LIST_DIR}/test_runtime.cpp)
target_link_libraries(test_runtime PRIVATE shardtrain_mpi_gtest shardtrain::runtime)
add_mpi_test(NAME runtime TARGET test_runtime NP 1 2 3 4)
