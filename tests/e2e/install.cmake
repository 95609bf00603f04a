# The installed shardtrain (cmake/Install.cmake): prefix, Lmod module, jobscripts, CMake package.
# Installs this build's targets, so it runs after a full build (scripts/test); label install.
if(TARGET shardtrain)
  add_test(NAME e2e_install_module
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/install/module.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR} ${PROJECT_VERSION}
            ${MPIEXEC_EXECUTABLE} ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(e2e_install_module PROPERTIES PROCESSORS 2 TIMEOUT 600 SKIP_RETURN_CODE 77
    LABELS "e2e;install")
  # `shardtrain --version`: version, git revision (or "unknown"), libtorch, MPI, HDF5 on one line
  # (ckpt::software_versions; e2e_install_module checks a checkpoint records the same line).
  add_test(NAME e2e_version COMMAND $<TARGET_FILE:shardtrain> --version)
  set_tests_properties(e2e_version PROPERTIES TIMEOUT 60 LABELS "e2e;install"
    ENVIRONMENT "OMPI_MCA_ess_singleton_isolated=1"
    PASS_REGULAR_EXPRESSION "^shardtrain ${PROJECT_VERSION} \\(git [^)]+\\); libtorch [0-9][^;]* \\((CPU|CUDA)\\); [^;]+; HDF5 [0-9]+\\.[0-9]+\\.[0-9]+ \\(parallel\\)")
endif()
