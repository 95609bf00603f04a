# I/O faults end cleanly on every rank (issue #18): a checkpoint directory or run.out_dir
# that fills up during training, read-only directories, a `latest` that is a directory, too
# little space for one checkpoint. The scripts (train/io_*.sh) mount small tmpfs file systems
# of their own (root with CAP_SYS_ADMIN; otherwise they report "skip", exit 77) and put every
# run under `timeout`, so a regression to the old hang fails instead of stalling the suite.
if(TARGET shardtrain)
  function(add_io_e2e_test name script np)
    add_test(NAME ${name}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train/${script} $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
              ${SHARDTRAIN_MPIRUN_FLAGS})
    # Helper commands without mpirun (data prepare, ckpt verify) start as isolated singletons.
    set_tests_properties(${name} PROPERTIES PROCESSORS ${np} TIMEOUT 240 LABELS "e2e;fault;io" SKIP_RETURN_CODE 77
      ENVIRONMENT "IO_NP=${np};OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
  endfunction()
  add_io_e2e_test(e2e_io_ckpt_full_np1 io_ckpt_full.sh 1)
  add_io_e2e_test(e2e_io_ckpt_full_np2 io_ckpt_full.sh 2)
  add_io_e2e_test(e2e_io_ckpt_full_np3 io_ckpt_full.sh 3)
  add_io_e2e_test(e2e_io_metrics_full io_metrics_full.sh 2)
  add_io_e2e_test(e2e_io_preflight io_preflight.sh 2)
endif()
