# Comm watchdog end to end: a rank skips a collective; the job must end with a report.
add_executable(comm_watchdog_driver ${CMAKE_CURRENT_LIST_DIR}/comm/watchdog_driver.cpp)
target_link_libraries(comm_watchdog_driver PRIVATE shardtrain::comm)
shardtrain_torch_pch(comm_watchdog_driver)
foreach(np 2 3)
  add_test(NAME comm_watchdog_np${np}
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DMPIFLAGS=${SHARDTRAIN_MPIRUN_FLAGS}"
            -DNP=${np} -DEXE=$<TARGET_FILE:comm_watchdog_driver> -DTIMEOUT_S=3
            -P ${CMAKE_CURRENT_LIST_DIR}/comm/check_watchdog.cmake)
  set_tests_properties(comm_watchdog_np${np} PROPERTIES PROCESSORS ${np} TIMEOUT 120
    LABELS "e2e;comm" ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
