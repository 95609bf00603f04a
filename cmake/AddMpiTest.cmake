# add_mpi_test(NAME <name> TARGET <exe> NP <n>... [ARGS ...] [LABELS ...] [TIMEOUT s])
# Registers <name>_np<n> for each rank count, launched through mpirun with the flags
# this project needs on shared CPU machines, and sets PROCESSORS so ctest -j packs them.
execute_process(COMMAND id -u OUTPUT_VARIABLE SHARDTRAIN_UID OUTPUT_STRIP_TRAILING_WHITESPACE)
set(SHARDTRAIN_MPIRUN_FLAGS --oversubscribe --bind-to none)
if(SHARDTRAIN_UID STREQUAL "0")
  list(PREPEND SHARDTRAIN_MPIRUN_FLAGS --allow-run-as-root)
endif()

function(add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "NP;ARGS;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(np IN LISTS T_NP)
    set(test_name ${T_NAME}_np${np})
    add_test(NAME ${test_name}
      COMMAND ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np}
              $<TARGET_FILE:${T_TARGET}> ${T_ARGS})
    set_tests_properties(${test_name} PROPERTIES PROCESSORS ${np} TIMEOUT ${T_TIMEOUT}
      LABELS "mpi;${T_LABELS}"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;${T_ENV}")
  endforeach()
endfunction()

# add_unit_test(NAME <name> SOURCES ... LIBS ... [LABELS ...])
function(add_unit_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;${T_LABELS}")
endfunction()

# shardtrain_library(<layer> SOURCES ... DEPS ... [HEADERS <dir>] [TORCH]) -> target
# shardtrain_<layer>, alias shardtrain::<layer>; TORCH adds libtorch and the precompiled torch
# header. The target exposes only its own headers, include/shardtrain/<dir> (dir defaults to the
# layer's name), and, through its DEPS, those of the layers it depends on: see
# shardtrain_expose_headers.
function(shardtrain_library layer)
  cmake_parse_arguments(L "TORCH" "HEADERS" "SOURCES;DEPS" ${ARGN})
  if(NOT L_HEADERS)
    set(L_HEADERS ${layer})
  endif()
  add_library(shardtrain_${layer} STATIC ${L_SOURCES})
  add_library(shardtrain::${layer} ALIAS shardtrain_${layer})
  # Installed as shardtrain::<layer> too (find_package(shardtrain); see src/install.cmake).
  set_target_properties(shardtrain_${layer} PROPERTIES EXPORT_NAME ${layer})
  set_property(GLOBAL APPEND PROPERTY SHARDTRAIN_LAYER_TARGETS shardtrain_${layer})
  shardtrain_expose_headers(shardtrain_${layer} PUBLIC ${L_HEADERS})
  target_link_libraries(shardtrain_${layer} PUBLIC ${L_DEPS})
  if(L_TORCH)
    target_link_libraries(shardtrain_${layer} PUBLIC shardtrain::torch)
    shardtrain_torch_pch(shardtrain_${layer})
  endif()
endfunction()

# Layers enforced by the build (docs/architecture.md, "Layers"): no target gets all of include/.
# shardtrain_expose_headers(<target> PUBLIC|INTERFACE <dir> [<file>...]) gives <target> an include
# directory of its own in the build tree, layer_include/<target>/shardtrain/<dir>, a symbolic link
# to include/shardtrain/<dir> (or, with files, a directory of links to just those headers). A
# target sees the directories of the targets it links, so `#include "shardtrain/<dir>/x.h"` keeps
# its spelling and compiles where the CMake graph declares the dependency, and fails ("No such
# file or directory") where it does not. Installed, every layer's headers are in <prefix>/include.
function(shardtrain_expose_headers target scope dir)
  set(root ${PROJECT_BINARY_DIR}/layer_include/${target})
  if(ARGN)
    file(MAKE_DIRECTORY ${root}/shardtrain/${dir})
    foreach(f IN LISTS ARGN)
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/shardtrain/${dir}/${f} ${root}/shardtrain/${dir}/${f} SYMBOLIC)
    endforeach()
  else()
    file(MAKE_DIRECTORY ${root}/shardtrain)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/shardtrain/${dir} ${root}/shardtrain/${dir} SYMBOLIC)
  endif()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${root}> $<INSTALL_INTERFACE:include>)
endfunction()

# Gives a target the precompiled torch header. It is compiled once, by shardtrain_torch_pch_pic
# (static libraries) or shardtrain_torch_pch_pie (executables), and reused: every target
# compiling its own copy cost ~25 s each (7 for the binary alone, ~25 with the tests). GCC checks
# at each use that the flags that matter (-fPIC / -fPIE, -std, the macros the header uses) agree,
# and -Winvalid-pch says so if they do not.
function(shardtrain_torch_pch target)
  if(NOT TARGET shardtrain_torch_pch_pic)
    foreach(kind pic pie)
      add_library(shardtrain_torch_pch_${kind} OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
      # The header's own dependencies as targets: their include directories are not always the
      # system's (gpu-check builds against a pack of headers in its own prefix).
      target_link_libraries(shardtrain_torch_pch_${kind} PRIVATE shardtrain::torch nlohmann_json::nlohmann_json)
      target_precompile_headers(shardtrain_torch_pch_${kind} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
    endforeach()
    # Executables are compiled -fPIE (POSITION_INDEPENDENT_CODE), libraries -fPIC. The binary's
    # commands all parse CLI11 (~2 s each): the executables' header has it too.
    set_target_properties(shardtrain_torch_pch_pie PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(shardtrain_torch_pch_pie PRIVATE -fPIE)
    target_link_libraries(shardtrain_torch_pch_pie PRIVATE CLI11::CLI11)
    target_precompile_headers(shardtrain_torch_pch_pie PRIVATE <CLI/CLI.hpp>)
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_precompile_headers(${target} REUSE_FROM shardtrain_torch_pch_pie)
  else()
    target_precompile_headers(${target} REUSE_FROM shardtrain_torch_pch_pic)
  endif()
endfunction()
