# Unit test of the memory planner's formulas (src/plan); no MPI ranks needed.
add_unit_test(NAME test_memory_plan
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory_plan.cpp
  LIBS shardtrain::train shardtrain::plan
  LABELS plan
  TIMEOUT 120)
shardtrain_torch_pch(test_memory_plan)
