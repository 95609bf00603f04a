# An exported GPT-2 gives the same loss in an independent implementation (needs python3-torch).
find_program(SHARDTRAIN_EXPORT_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDTRAIN_EXPORT_PYTHON)
  execute_process(COMMAND ${SHARDTRAIN_EXPORT_PYTHON} -c "import torch, numpy" RESULT_VARIABLE _export_py_rc
                  OUTPUT_QUIET ERROR_QUIET)
  if(_export_py_rc EQUAL 0)
    add_test(NAME e2e_export_gpt2_loss
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/export_loss.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_export_gpt2_loss PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH")
    # eval (equal bits at 1/2/4 ranks) and generate (greedy equal at 1/2 ranks), both checked
    # against the independent GPT-2 on the exported weights; bad input exits 2.
    add_test(NAME e2e_eval_generate
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/eval_generate.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_eval_generate PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:")
    # Hugging Face directories in and out (Llama 2 / 3.1 / 3.2, Mistral, Qwen2, head_dim):
    # eval equal to an independent PyTorch implementation, training at 1/2/4 ranks, export
    # byte-identical to the source, bad config.json = exit 2.
    add_test(NAME e2e_hf_models
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/hf_models.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_hf_models PROPERTIES PROCESSORS 2 TIMEOUT 600 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
    # LoRA with PEFT's semantics against an independent PyTorch implementation: eval and one
    # optimizer step of a hub adapter, ranks / strategies / resume bit for bit, PEFT export round
    # trip, the merged export, train.freeze, bad input (tests/e2e/export/lora.sh).
    add_test(NAME e2e_lora
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/lora.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_lora PROPERTIES PROCESSORS 2 TIMEOUT 900 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
    # QLoRA (lora.base_dtype = "nf4") against the independent PyTorch implementation: eval and one
    # step on an NF4 base, ranks and strategies bit for bit, byte ranges read once, the gather in
    # codes, bad input (tests/e2e/export/qlora.sh).
    add_test(NAME e2e_qlora
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/qlora.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_qlora PROPERTIES PROCESSORS 2 TIMEOUT 900 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
    # QLoRA (an NF4, double-quantized base) out of the program: the merged export the same bytes at
    # 1-3 ranks and equal to the reference NF4 merge bit for bit, its notice, eval of the checkpoint
    # = the run's validation loss within 1e-6, another base exit 2 (tests/e2e/export/qlora_export.sh).
    add_test(NAME e2e_qlora_export
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/qlora_export.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_qlora_export PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;mpi"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
    # Instruction data: eval's loss over the counted targets only equals the independent GPT-2's.
    add_test(NAME e2e_instruction_eval_reference
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/instruction_eval.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_instruction_eval_reference PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;mpi;data"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1"
      FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:")
    # Instruction rows trained whole and apart (data.packing): the one-row-at-a-time reference
    # checks itself first (a packed window with a block-diagonal mask, a right-padded batch, float64
    # finite differences; a few seconds, no shardtrain), then eval packed / padded and one SGD step
    # (Llama, LoRA on it, GPT-2) at 1 and 2 ranks equal it; bad input exit 2 from deck check and
    # train (tests/e2e/export/packing.sh).
    add_test(NAME test_packing_reference_self_test
      COMMAND ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR}/tests/python/packing_reference.py self-test)
    set_tests_properties(test_packing_reference_self_test PROPERTIES LABELS "unit;data" TIMEOUT 120
      FIXTURES_SETUP packing_reference FAIL_REGULAR_EXPRESSION "MISMATCH")
    add_test(NAME e2e_packing
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export/packing.sh $<TARGET_FILE:shardtrain>
              ${SHARDTRAIN_EXPORT_PYTHON} ${PROJECT_SOURCE_DIR} ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
    set_tests_properties(e2e_packing PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;mpi;data"
      FIXTURES_REQUIRED packing_reference FAIL_REGULAR_EXPRESSION "MISMATCH|FAIL:"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
  endif()
endif()
