# Singleton starts (no mpirun) at once: Open MPI 4.1 gives every isolated singleton the same
# session directory, and concurrent ones raced on creating and removing it (CI: "mkdir
# /tmp/ompi.<host>.0/jf.0/1: No such file or directory", ~1 in 6 full runs; 16 of 200 starts,
# 40 at a time, before the fix). Each process now has its own (runtime/singleton_session.h):
# 16 starts, 8 at a time, must all succeed and leave TMPDIR empty.
if(TARGET shardtrain)
  add_test(NAME e2e_singleton_starts
    COMMAND ${CMAKE_CURRENT_LIST_DIR}/runtime/singleton_starts.sh $<TARGET_FILE:shardtrain> 8 2 0)
  set_tests_properties(e2e_singleton_starts PROPERTIES PROCESSORS 2 TIMEOUT 180 LABELS "e2e;mpi_start")
endif()
