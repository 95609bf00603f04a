# The jobscripts of jobscripts/ under a real one-host Slurm that the test starts in its temporary
# folder and stops by pid (tests/slurm/local-slurm.sh; scripts/setup installs slurmctld, slurmd,
# slurm-client and munge). ~2-3 minutes on 2 cores, most of it the time-limited job's first
# allocation. Skipped (exit 77) only when Slurm cannot run here (not root); missing packages fail.
if(TARGET shardtrain)
  find_program(SHARDTRAIN_H5DIFF h5diff)
  add_test(NAME slurm_jobscripts
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/jobscripts.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  # PROCESSORS 2: its jobs and the reference run keep both cores of a small machine busy.
  set_tests_properties(slurm_jobscripts PROPERTIES LABELS "slurm" PROCESSORS 2 TIMEOUT 480
    SKIP_RETURN_CODE 77 RESOURCE_LOCK shardtrain_local_slurm ENVIRONMENT "OMP_NUM_THREADS=1")
  if(NOT SHARDTRAIN_H5DIFF)
    set_tests_properties(slurm_jobscripts PROPERTIES DISABLED TRUE)  # compares checkpoints with h5diff
  endif()
endif()
