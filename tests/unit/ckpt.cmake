# Checkpoint layer unit tests: flat-range box decomposition and the digest.
add_unit_test(NAME test_ckpt_boxes SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_boxes.cpp LIBS shardtrain::ckpt)
