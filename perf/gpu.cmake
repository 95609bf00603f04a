# bench_gpu: plain libtorch vs shardtrain full_shard vs CPU offload on one GPT-2 shape (one JSON
# line each); scripts/gpu-check runs it on a GPU next to perf/gpu/fsdp2_peer.py (PyTorch FSDP2).
add_executable(bench_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu/bench_gpu.cpp)
target_link_libraries(bench_gpu PRIVATE shardtrain::fsdp shardtrain::model shardtrain::runtime shardtrain::util)
shardtrain_torch_pch(bench_gpu)
