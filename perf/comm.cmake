# bench_collectives: the collectives benchmark without the CLI (same code as
# `shardtrain bench collectives`), so the comm layer can be measured on its own.
add_executable(bench_collectives ${CMAKE_CURRENT_LIST_DIR}/bench_collectives_main.cpp)
target_link_libraries(bench_collectives PRIVATE shardtrain::comm)
