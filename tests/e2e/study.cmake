# jobscripts/scaling-study end to end (label `study`): bad flags fail cleanly; a tiny study
# (tests/e2e/study/tiny-study.toml: 5 runs of 1-2 ranks, 3 steps) runs with the mpirun
# launcher, results.csv has the right rows and columns, report.md and its four PNGs exist;
# the Slurm launcher submits array jobs and a dependent report job (stub sbatch/srun).
# 58-78 s measured on the shared 2-core VM at load average 7-10 (the 7 training runs are most of it;
# much less when the machine is idle). Needs python3 and gnuplot.
if(TARGET shardtrain)
  find_program(SHARDTRAIN_STUDY_PYTHON NAMES python3)
  find_program(SHARDTRAIN_STUDY_GNUPLOT NAMES gnuplot)
  add_test(NAME e2e_study
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/study/check_study.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE})
  set_tests_properties(e2e_study PROPERTIES PROCESSORS 2 TIMEOUT 300 LABELS "e2e;study"
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_ess_singleton_isolated=1")  # no orted per deck show / data prepare
  if(NOT SHARDTRAIN_STUDY_PYTHON OR NOT SHARDTRAIN_STUDY_GNUPLOT)
    set_tests_properties(e2e_study PROPERTIES DISABLED TRUE)
  endif()
endif()
