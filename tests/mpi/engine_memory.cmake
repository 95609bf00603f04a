# test_engine_memory: FSDP engine memory bookkeeping and step-0 loss on a small GPT-2 (np 1 2 4).
add_executable(test_engine_memory ${CMAKE_CURRENT_LIST_DIR}/test_engine_memory.cpp)
target_link_libraries(test_engine_memory PRIVATE shardtrain_mpi_gtest shardtrain::fsdp shardtrain::model)
shardtrain_torch_pch(test_engine_memory)
add_mpi_test(NAME engine_memory TARGET test_engine_memory NP 1 2 4 TIMEOUT 300)
