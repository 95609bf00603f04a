# Data layer unit tests. Tests that need the fetched sources (scripts/fetch-data) skip with a
# message when they are absent; the reference-tokenizer test also needs node.
find_package(ZLIB REQUIRED)
add_unit_test(NAME test_data_formats
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_rformat.cpp ${CMAKE_CURRENT_LIST_DIR}/test_data_dataset.cpp
              LIBS shardtrain::data_core ZLIB::ZLIB LABELS data)
add_unit_test(NAME test_data_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_tokenizer.cpp
              LIBS shardtrain::data_core LABELS data TIMEOUT 300)
add_unit_test(NAME test_data_sampler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_sampler.cpp ${CMAKE_CURRENT_LIST_DIR}/test_data_packing.cpp
              LIBS shardtrain::data LABELS data)
add_unit_test(NAME test_data_model_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_model_tokenizer.cpp
              LIBS shardtrain::data_core LABELS "data;tokenizer")
# Instruction data: chat formats (texts against the templates), ids and masks, masked datasets.
add_unit_test(NAME test_data_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_chat.cpp
              LIBS shardtrain::data LABELS data)
