# bench_ckpt: checkpoint save/load GB/s next to a raw parallel-HDF5 collective write/read of the
# same bytes, split vs single-writer replicas, and the step stall of sync vs async saves (MPI).
add_executable(bench_ckpt ${CMAKE_CURRENT_LIST_DIR}/bench_ckpt.cpp)
target_include_directories(bench_ckpt PRIVATE ${PROJECT_SOURCE_DIR}/tests/mpi)
target_link_libraries(bench_ckpt PRIVATE shardtrain::ckpt shardtrain::runtime)
shardtrain_torch_pch(bench_ckpt)
