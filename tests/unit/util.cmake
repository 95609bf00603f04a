add_unit_test(NAME test_util SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_util.cpp LIBS shardtrain::util)
