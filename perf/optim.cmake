# bench_optim: fused AdamW/SGD GB/s next to memcpy and torch::optim (prints one table).
add_executable(bench_optim ${CMAKE_CURRENT_LIST_DIR}/bench_optim.cpp)
target_link_libraries(bench_optim PRIVATE shardtrain::optim shardtrain::torch Kokkos::kokkos)
# The float-mask comparison kernel is compiled here, so it needs the library's vectorising flags.
target_compile_options(bench_optim PRIVATE -O3 -fno-math-errno)
