# NF4 codes (QLoRA's 4-bit NormalFloat, fsdp/nf4.h) against an independent PyTorch implementation
# of bitsandbytes' semantics (tests/python/nf4_reference.py), when a Python with torch exists:
# the reference writes its cases and results (fixture), test_nf4 compares bit for bit.
add_unit_test(NAME test_nf4 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_nf4.cpp LIBS shardtrain::fsdp)
find_program(SHARDTRAIN_TORCH_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDTRAIN_TORCH_PYTHON)
  execute_process(COMMAND ${SHARDTRAIN_TORCH_PYTHON} -c "import torch, numpy"
                  RESULT_VARIABLE _nf4_py_rc OUTPUT_QUIET ERROR_QUIET)
  if(_nf4_py_rc EQUAL 0)
    set(_nf4_dir ${CMAKE_CURRENT_BINARY_DIR}/nf4_reference_cases)
    add_test(NAME test_nf4_reference_cases
      COMMAND ${SHARDTRAIN_TORCH_PYTHON} ${PROJECT_SOURCE_DIR}/tests/python/nf4_reference.py cases ${_nf4_dir})
    set_tests_properties(test_nf4_reference_cases PROPERTIES LABELS "unit" TIMEOUT 120 FIXTURES_SETUP nf4_cases)
    set_tests_properties(test_nf4 PROPERTIES ENVIRONMENT "SHARDTRAIN_NF4_CASES=${_nf4_dir}" FIXTURES_REQUIRED nf4_cases)
  endif()
endif()
