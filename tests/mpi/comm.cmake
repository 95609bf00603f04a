# Comm layer tests: MPI backend collectives, errors, hybrid meshes, NCCL without a GPU.
foreach(t bench collectives errors mesh nccl tree)
  add_executable(test_comm_${t} ${CMAKE_CURRENT_LIST_DIR}/test_comm_${t}.cpp)
  target_link_libraries(test_comm_${t} PRIVATE shardtrain_mpi_gtest shardtrain::comm)
  shardtrain_torch_pch(test_comm_${t})
endforeach()
# Meshes and backend errors go through the one path production uses (fsdp::open_groups).
target_link_libraries(test_comm_errors PRIVATE shardtrain::fsdp)
target_link_libraries(test_comm_mesh PRIVATE shardtrain::fsdp)
add_mpi_test(NAME comm_collectives TARGET test_comm_collectives NP 1 2 3 4 LABELS comm TIMEOUT 600)
# Errors: 1 rank (no in-place slice check), 2 (the failing pair alone), 4 (the pair with idle
# ranks beside it); 3 ranks would only change the numbers in the messages.
add_mpi_test(NAME comm_errors TARGET test_comm_errors NP 1 2 4 LABELS comm TIMEOUT 120)
add_mpi_test(NAME comm_mesh TARGET test_comm_mesh NP 1 2 3 4 LABELS comm TIMEOUT 120)
# Fixed-tree sums: the power-of-two sizes train.reproducible serves (3: refused).
add_mpi_test(NAME comm_tree TARGET test_comm_tree NP 1 2 3 4 8 LABELS comm TIMEOUT 300)
# bench collectives: groups at once (the planner's inputs in perf/cluster/run.sh); 3: a group of 3
# and of 1 only, 4: groups of 2 contiguous and strided.
add_mpi_test(NAME comm_bench TARGET test_comm_bench NP 1 3 4 LABELS comm TIMEOUT 120)
add_mpi_test(NAME comm_nccl TARGET test_comm_nccl NP 1 2 LABELS comm TIMEOUT 120)
