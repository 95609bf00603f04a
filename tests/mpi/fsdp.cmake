add_executable(test_fsdp ${CMAKE_CURRENT_LIST_DIR}/test_fsdp.cpp)
target_link_libraries(test_fsdp PRIVATE shardtrain_mpi_gtest shardtrain::fsdp)
shardtrain_torch_pch(test_fsdp)
add_mpi_test(NAME fsdp TARGET test_fsdp NP 1 2 3 4 TIMEOUT 600)

# ZeRO++-style quantized collectives: round trip, error feedback, the accuracy guard (4 ranks:
# 2 simulated hosts x 2).
add_executable(test_zeropp ${CMAKE_CURRENT_LIST_DIR}/test_zeropp.cpp)
target_link_libraries(test_zeropp PRIVATE shardtrain_mpi_gtest shardtrain::fsdp)
shardtrain_torch_pch(test_zeropp)
add_mpi_test(NAME zeropp TARGET test_zeropp NP 1 4 TIMEOUT 300 LABELS fsdp)

# Instruction data: eval's loss over a masked dataset equals a hand-computed reference over the
# counted targets only, the same bits at 1 and 2 ranks.
add_executable(test_masked_loss ${CMAKE_CURRENT_LIST_DIR}/test_masked_loss.cpp)
target_link_libraries(test_masked_loss PRIVATE shardtrain_mpi_gtest shardtrain::infer)
shardtrain_torch_pch(test_masked_loss)
add_mpi_test(NAME masked_loss TARGET test_masked_loss NP 1 2 TIMEOUT 120 LABELS "data;train")

# DiLoCo's outer-gradient wire formats: int4 beside int8 (quantize.h), the group average in
# fp32 / bf16 / int8 / int4 (collectives.h wire_average: private to src/fsdp, hence its include
# directory here) against references each rank computes, its bytes against CountingComm's.
add_executable(test_outer_wire ${CMAKE_CURRENT_LIST_DIR}/test_outer_wire.cpp)
target_link_libraries(test_outer_wire PRIVATE shardtrain_mpi_gtest shardtrain::fsdp)
target_include_directories(test_outer_wire PRIVATE ${PROJECT_SOURCE_DIR}/src/fsdp)
shardtrain_torch_pch(test_outer_wire)
add_mpi_test(NAME outer_wire TARGET test_outer_wire NP 1 2 4 TIMEOUT 300 LABELS fsdp)
