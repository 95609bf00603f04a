# Unit tests of the model layer (GPT-2, Llama-style decoder, ViT).
add_unit_test(NAME test_model
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_gpt2.cpp ${CMAKE_CURRENT_LIST_DIR}/test_model_llama.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_model_vit.cpp ${CMAKE_CURRENT_LIST_DIR}/test_model_dump.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_model_bf16_gemm.cpp ${CMAKE_CURRENT_LIST_DIR}/test_model_lora.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_model_sizes.cpp
  LIBS shardtrain::model shardtrain::deck
  TIMEOUT 300)
shardtrain_torch_pch(test_model)

# Cross-check against Hugging Face semantics in Python, when a Python with torch exists
# (Debian: python3-torch for /usr/bin/python3): test_model dumps tiny models, then
# tests/python/hf_reference.py recomputes their logits.
find_program(SHARDTRAIN_TORCH_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDTRAIN_TORCH_PYTHON)
  execute_process(COMMAND ${SHARDTRAIN_TORCH_PYTHON} -c "import torch, numpy"
                  RESULT_VARIABLE _model_py_rc OUTPUT_QUIET ERROR_QUIET)
  if(_model_py_rc EQUAL 0)
    set(_model_dump_dir ${CMAKE_CURRENT_BINARY_DIR}/model_python_dump)
    add_test(NAME test_model_python_dump COMMAND test_model --gtest_filter=ModelDump.*)
    set_tests_properties(test_model_python_dump PROPERTIES LABELS "unit"
      ENVIRONMENT "SHARDTRAIN_MODEL_DUMP_DIR=${_model_dump_dir}" FIXTURES_SETUP model_python)
    add_test(NAME test_model_python_crosscheck
      COMMAND ${SHARDTRAIN_TORCH_PYTHON} ${PROJECT_SOURCE_DIR}/tests/python/hf_reference.py ${_model_dump_dir})
    set_tests_properties(test_model_python_crosscheck PROPERTIES LABELS "unit" TIMEOUT 120
      FIXTURES_REQUIRED model_python)
  endif()
endif()
