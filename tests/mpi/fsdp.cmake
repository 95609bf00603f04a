add_executable(test_fsdp ${CMAKE_CURRENT_LIST_DIR}/test_fsdp.cpp)
target_link_libraries(test_fsdp PRIVATE shardtrain_mpi_gtest shardtrain::fsdp)
shardtrain_torch_pch(test_fsdp)
add_mpi_test(NAME fsdp TARGET test_fsdp NP 1 2 3 4 TIMEOUT 600)
