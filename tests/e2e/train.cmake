# Checkpoints in the training job, end to end: exact resume (max_steps split, SIGUSR1 -> exit
# 42), resharding on resume (4 -> 2, 3 ranks, hybrid_shard) and faults (kill -9 mid-step and
# mid-write, damaged checkpoints), safetensors import / init_from. Bash scripts in train/, tiny GPT on byte tokens.
if(TARGET shardtrain)
  find_program(SHARDTRAIN_H5DIFF h5diff)
  # LD_PRELOAD shim that stalls a rank inside a checkpoint write (e2e_train_fault_kill).
  add_library(shardtrain_test_write_stall SHARED ${CMAKE_CURRENT_LIST_DIR}/train/write_stall.cpp)
  target_link_libraries(shardtrain_test_write_stall PRIVATE ${CMAKE_DL_LIBS})
  function(add_train_e2e_test name script np labels)
    add_test(NAME ${name}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/${script} $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
              ${SHARDTRAIN_MPIRUN_FLAGS})
    # The helper commands without mpirun (data prepare, ckpt verify/export/inspect) start as
    # isolated singletons: no orted is spawned for each (a second or two apiece on a busy machine).
    set_tests_properties(${name} PROPERTIES PROCESSORS ${np} TIMEOUT 180 LABELS "e2e;train;${labels}"
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1;SHARDTRAIN_WRITE_STALL_LIB=$<TARGET_FILE:shardtrain_test_write_stall>")
    if(NOT SHARDTRAIN_H5DIFF)
      set_tests_properties(${name} PROPERTIES DISABLED TRUE)  # the scripts compare files with h5diff
    endif()
  endfunction()
  add_train_e2e_test(e2e_train_exact_resume exact_resume.sh 2 "ckpt")
  add_train_e2e_test(e2e_train_reshard_resume reshard_resume.sh 4 "ckpt")
  add_train_e2e_test(e2e_train_reproducible reproducible.sh 8 "ckpt;reproducible")
  set_tests_properties(e2e_train_reproducible PROPERTIES TIMEOUT 420)
  add_train_e2e_test(e2e_train_zeropp zeropp.sh 4 "ckpt;fsdp")
  # ~30-60 s on a quiet 2-core machine; 180 s ran out once beside two builds (load 8).
  set_tests_properties(e2e_train_zeropp PROPERTIES TIMEOUT 420)
  # DiLoCo (issue 30): H=1 == hybrid_shard, exact mid-cycle resume, streaming fragments, refusals.
  add_train_e2e_test(e2e_train_diloco diloco.sh 4 "ckpt;fsdp;reproducible")
  set_tests_properties(e2e_train_diloco PROPERTIES TIMEOUT 600)
  add_train_e2e_test(e2e_train_fault_kill fault_kill.sh 2 "ckpt;fault")
  add_train_e2e_test(e2e_train_fault_corrupt fault_corrupt.sh 2 "ckpt;fault")
  add_train_e2e_test(e2e_train_import_finetune import_finetune.sh 3 "ckpt")
  add_train_e2e_test(e2e_train_device device.sh 2 "device")
  add_train_e2e_test(e2e_train_bf16_gemm bf16_gemm.sh 2 "bf16")
  add_train_e2e_test(e2e_train_held_signal held_signal.sh 2 "jobscripts")
  add_train_e2e_test(e2e_train_data_keys data_keys.sh 2 "data")
  add_train_e2e_test(e2e_train_ownership ownership.sh 2 "ckpt;fault")
  add_train_e2e_test(e2e_train_divergence divergence.sh 2 "ckpt;fault")
  # A new user's first hour (issue 29): nothing-to-train changes no file, move_aside moves the
  # whole run, the console's deck summary, --help without the benchmark, errors with their fix.
  add_train_e2e_test(e2e_train_newcomer newcomer.sh 2 "docs;ckpt")
  # Hosts of 2 + 1 ranks: strategies over all ranks train, hybrid ones are refused (issue #27).
  add_train_e2e_test(e2e_train_unequal_hosts unequal_hosts.sh 3 "fsdp")
  # data prepare on JSONL / gzip / text corpora: the same bytes at 1, 2, 4 ranks and 1 or 3 threads.
  add_train_e2e_test(e2e_data_prepare_corpus prepare_corpus.sh 2 "data;mpi")
  set_tests_properties(e2e_train_ownership PROPERTIES TIMEOUT 300)  # 9 runs, two of them racing
  # Instruction data (--chat-format plain, a loss mask): the dataset, bad rows, the loss as the
  # mean over counted targets, and the same training at 1x8, 2x4, 4x2 (bits with reproducible).
  add_train_e2e_test(e2e_train_instruction instruction.sh 4 "data")
  set_tests_properties(e2e_train_instruction PROPERTIES TIMEOUT 420)
  # Hostile decks, data and checkpoints: exit 2 and one error line each, never a hang (issue #18).
  add_test(NAME e2e_train_hostile_inputs
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/hostile_inputs.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_train_hostile_inputs PROPERTIES PROCESSORS 1 TIMEOUT 300 LABELS "e2e;train;deck;data"
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_ess_singleton_isolated=1;H5PY_PYTHON=/usr/bin/python3;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # Shared directories and files from others (issue #27): planted links at every writer's
  # names, checkpoints with soft/external links, a shell-syntax run directory for `report`,
  # path keys and `latest` outside their base, NUL in a deck string: exit 2, nothing written.
  add_test(NAME e2e_train_shared_files
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/shared_files.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_train_shared_files PROPERTIES PROCESSORS 1 TIMEOUT 400 LABELS "e2e;train;ckpt;security"
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_ess_singleton_isolated=1;H5PY_PYTHON=/usr/bin/python3;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # Files from the hub (issue 39): crafted config.json, safetensors and tokenizer files through
  # deck check, plan, ckpt import, eval, generate and train: exit 2 naming file, key and limit,
  # nothing written, in bounded time; HF's weights precedence, fp16 export overflow, DiLoCo's
  # rules in deck check, a 0-byte JSONL. Python's standard library makes the directories.
  add_test(NAME e2e_hub_files
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/hub_files.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_hub_files PROPERTIES PROCESSORS 1 TIMEOUT 400 LABELS "e2e;train;ckpt;security"
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_ess_singleton_isolated=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # Exit codes command by command against docs/troubleshooting.md's table: bad input, an output
  # in a missing or read-only directory (2, before any work), a full file system (5). The
  # mounts need root (skipped otherwise, after the other cases).
  add_test(NAME e2e_exit_codes
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/exit_codes.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_exit_codes PROPERTIES PROCESSORS 1 TIMEOUT 300 LABELS "e2e;train;ckpt;io" SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_ess_singleton_isolated=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
