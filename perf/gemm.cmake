# bench_gemm: GEMM GFLOP/s per kernel choice (OpenBLAS autodetected / selected core, oneDNN fp32
# and bf16, libtorch bf16, fp32 on bf16 operands) at the perf/ddp model's shapes, with ratios.
add_executable(bench_gemm ${CMAKE_CURRENT_LIST_DIR}/bench_gemm.cpp)
target_link_libraries(bench_gemm PRIVATE shardtrain::runtime shardtrain::model shardtrain::torch ${CMAKE_DL_LIBS})
