# Unit tests of the train layer's single-process parts (schedule from a deck) and the token choice
# of the infer layer.
add_unit_test(NAME test_train_loop_parts
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train_loop_parts.cpp
  LIBS shardtrain::train shardtrain::infer
  LABELS train
  TIMEOUT 60)
target_compile_definitions(test_train_loop_parts PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
shardtrain_torch_pch(test_train_loop_parts)
# train.reproducible's parts: leaf sums, the exact norm, the leaf order, the refusals.
add_unit_test(NAME test_reproducible_parts
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reproducible_parts.cpp
  LIBS shardtrain::train
  LABELS "train;reproducible"
  TIMEOUT 60)
shardtrain_torch_pch(test_reproducible_parts)
