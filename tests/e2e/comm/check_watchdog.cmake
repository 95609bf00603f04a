# Runs the watchdog driver under mpirun and checks the report: exit code 3 within the
# timeout plus a margin, naming the group, the sequence number, the op and the missing rank.
# cmake -DMPIEXEC=.. -DMPIFLAGS=.. -DNP=.. -DEXE=.. -DTIMEOUT_S=.. -P check_watchdog.cmake
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} ${MPIFLAGS} -np ${NP} ${EXE} ${TIMEOUT_S}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}\n${err}")
message("--- job output (exit ${rc}, ${elapsed} s) ---\n${all}\n---")
math(EXPR last "${NP} - 1")
math(EXPR bound "${TIMEOUT_S} + 15")
set(fail "")
if(NOT rc STREQUAL "3")
  string(APPEND fail "exit code is '${rc}', expected 3 (kExitCommTimeout)\n")
endif()
if(elapsed GREATER bound)
  string(APPEND fail "took ${elapsed} s, more than timeout ${TIMEOUT_S} s + 15 s\n")
endif()
foreach(re
    "collective timed out \\(timeout_s = ${TIMEOUT_S}\\) in group 'world' \\(${NP} ranks\\): seq 3 all_reduce\\(sum\\)"
    "group rank ${last} \\(world rank ${last}\\): NOT ARRIVED at seq 3: entered seq 2"
    "ranks of 'world' not arrived at seq 3: ${last} \\(world ${last}\\) at seq 2"
    "group rank 0 \\(world rank 0\\): arrived \\(entered seq 3"
    "flight recorder of 'world'"
    "seq 3 +all_reduce\\(sum\\) .*RUNNING"
    "aborting all ranks with exit code 3")
  if(NOT all MATCHES "${re}")
    string(APPEND fail "output lacks /${re}/\n")
  endif()
endforeach()
if(fail)
  message(FATAL_ERROR "${fail}")
endif()
