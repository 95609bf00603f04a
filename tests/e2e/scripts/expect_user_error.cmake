# Runs a shardtrain command that must reject its input: exit code 2 and exactly one line on
# stderr that names the culprit. Used as: cmake "-DCOMMAND=exe|arg|..." -DEXPECT=<text> -P <this file>
# ('|' separates the arguments because a ';' does not survive add_test's quoting).
string(REPLACE "|" ";" command "${COMMAND}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "expected exit code 2, got '${rc}'\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(REGEX MATCHALL "\n" newlines "${err}")
list(LENGTH newlines lines)
if(NOT lines EQUAL 1 OR NOT err MATCHES "^error: .*\n$")
  message(FATAL_ERROR "expected a single 'error: ...' line on stderr, got ${lines} lines:\n${err}")
endif()
string(FIND "${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "stderr does not mention '${EXPECT}':\n${err}")
endif()
