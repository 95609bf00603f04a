# bench_engine: FSDP engine memory per rank and step time per strategy on a GPT-2, and the fused
# AdamW step on one rank's shard next to memcpy and torch::optim (MPI; perf/run_engine_bench.sh).
add_executable(bench_engine ${CMAKE_CURRENT_LIST_DIR}/bench_engine.cpp)
target_link_libraries(bench_engine PRIVATE shardtrain::fsdp shardtrain::model shardtrain::runtime shardtrain::util)
shardtrain_torch_pch(bench_engine)
