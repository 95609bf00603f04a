# bench_tokenizer: model tokenizers' encode speed next to the built-in GPT-2 (prints one table).
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.cpp)
target_link_libraries(bench_tokenizer PRIVATE shardtrain::data_core)
