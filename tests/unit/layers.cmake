# Layers enforced by the build (docs/architecture.md, "Layers"): a translation unit of a layer that
# includes a header of a layer it does not depend on fails to compile, and the same include from a
# layer that does depend on it compiles. Each check builds one EXCLUDE_FROM_ALL object library of
# layer_include_check.cpp linked like that layer, through a nested build of this tree (hence the
# lock: one nested build at a time).
function(shardtrain_layer_check name link header expect)
  add_library(${name} OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/layer_include_check.cpp)
  target_link_libraries(${name} PRIVATE ${link})
  target_compile_definitions(${name} PRIVATE SHARDTRAIN_CHECK_HEADER="${header}")
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;layers" RESOURCE_LOCK shardtrain_build_tree TIMEOUT 300)
  if(expect STREQUAL "fails")
    string(REPLACE "." "\\." pattern "${header}: No such file or directory")
    set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${pattern}")
  endif()
endfunction()

# model depends on util and the fsdp hook interface only.
shardtrain_layer_check(layers_model_cannot_include_comm shardtrain::model shardtrain/comm/comm.h fails)
shardtrain_layer_check(layers_model_cannot_include_fsdp_engine shardtrain::model shardtrain/fsdp/engine.h fails)
shardtrain_layer_check(layers_model_includes_fsdp_hook shardtrain::model shardtrain/fsdp/forward_hook.h compiles)
# util is the bottom layer.
shardtrain_layer_check(layers_util_cannot_include_deck shardtrain::util shardtrain/deck/deck.h fails)
# fsdp depends on comm (control: the same kind of include compiles along a declared edge).
shardtrain_layer_check(layers_fsdp_includes_comm shardtrain::fsdp shardtrain/comm/comm.h compiles)
# plan (the planner) asks fsdp and model for their rules; it reads no deck and knows no trainer.
shardtrain_layer_check(layers_plan_cannot_include_train shardtrain::plan shardtrain/train/setup.h fails)
shardtrain_layer_check(layers_plan_cannot_include_deck shardtrain::plan shardtrain/deck/deck.h fails)
shardtrain_layer_check(layers_plan_includes_fsdp_wrap shardtrain::plan shardtrain/fsdp/wrap.h compiles)
# infer (generation, whole-split evaluation) runs a given model: below train, which samples
# through it; it knows no trainer.
shardtrain_layer_check(layers_infer_cannot_include_train shardtrain::infer shardtrain/train/setup.h fails)
shardtrain_layer_check(layers_infer_includes_data shardtrain::infer shardtrain/data/token_dataset.h compiles)
# report (plots of metrics.jsonl) reads files only.
shardtrain_layer_check(layers_report_cannot_include_train shardtrain::report shardtrain/train/metrics.h fails)
shardtrain_layer_check(layers_report_includes_util shardtrain::report shardtrain/util/file_io.h compiles)
# model_io and probe sit above train (they open its sharded jobs); train sees neither, and the two
# do not see each other.
shardtrain_layer_check(layers_train_cannot_include_model_io shardtrain::train shardtrain/model_io/import.h fails)
shardtrain_layer_check(layers_train_cannot_include_probe shardtrain::train shardtrain/probe/probe.h fails)
shardtrain_layer_check(layers_train_includes_infer shardtrain::train shardtrain/infer/sampling.h compiles)
shardtrain_layer_check(layers_model_io_cannot_include_probe shardtrain::model_io shardtrain/probe/probe.h fails)
shardtrain_layer_check(layers_model_io_includes_train shardtrain::model_io shardtrain/train/job.h compiles)
shardtrain_layer_check(layers_probe_cannot_include_model_io shardtrain::probe shardtrain/model_io/import.h fails)
shardtrain_layer_check(layers_probe_includes_train shardtrain::probe shardtrain/train/alloc_tracker.h compiles)

# One way to talk to the other ranks (docs/comm.md, "Exchanges"): no raw MPI communication call
# (collective or point-to-point) in src/ or include/ outside comm and runtime; a grep in CMake,
# no compile. The planted fixture proves the check fails on one (a call, and one split over lines).
add_test(NAME layers_no_raw_mpi COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -P ${CMAKE_CURRENT_LIST_DIR}/no_raw_mpi/check.cmake)
set_tests_properties(layers_no_raw_mpi PROPERTIES LABELS "unit;layers" TIMEOUT 60)
add_test(NAME layers_no_raw_mpi_planted
  COMMAND ${CMAKE_COMMAND} -DROOT=${CMAKE_CURRENT_LIST_DIR}/no_raw_mpi/planted -P ${CMAKE_CURRENT_LIST_DIR}/no_raw_mpi/check.cmake)
set_tests_properties(layers_no_raw_mpi_planted PROPERTIES LABELS "unit;layers" TIMEOUT 60
  PASS_REGULAR_EXPRESSION "src/train/planted.cpp:7: MPI_Allreduce.*src/train/planted.cpp:12: MPI_Send")
