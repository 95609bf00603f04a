# The one way to talk to the other ranks (docs/comm.md, "Exchanges"): outside src/comm and
# src/runtime (and their headers), no source calls MPI's communication functions, collective or
# point-to-point; they use runtime/exchange.h (named, watched, checked) or comm::Comm. Communicator
# handles, MPI_Comm_rank / size / dup / split and MPI-IO stay allowed.
# Usage: cmake -DROOT=<source tree> -P check.cmake (fails naming file:line and the call).
if(NOT ROOT)
  message(FATAL_ERROR "no_raw_mpi/check.cmake: give -DROOT=<source tree>")
endif()
set(calls
  Allreduce Iallreduce Reduce Ireduce Reduce_local Reduce_scatter Reduce_scatter_block Ireduce_scatter
  Ireduce_scatter_block Bcast Ibcast Barrier Ibarrier Allgather Allgatherv Iallgather Iallgatherv Gather
  Gatherv Igather Igatherv Scatter Scatterv Iscatter Iscatterv Alltoall Alltoallv Alltoallw Ialltoall
  Ialltoallv Ialltoallw Scan Exscan Iscan Iexscan Send Ssend Bsend Rsend Isend Issend Ibsend Irsend
  Send_init Recv Irecv Recv_init Sendrecv Sendrecv_replace Probe Iprobe Mprobe Improbe Mrecv Imrecv
  Put Get Accumulate Get_accumulate Fetch_and_op Compare_and_swap Neighbor_allgather Neighbor_alltoall)
list(JOIN calls "|" alternatives)
set(pattern "P?MPI_(${alternatives})[ \t\r\n]*\\(")
file(GLOB_RECURSE files RELATIVE "${ROOT}" "${ROOT}/src/*.cpp" "${ROOT}/src/*.cc" "${ROOT}/src/*.h"
     "${ROOT}/src/*.cu" "${ROOT}/include/*.h")
set(found "")
set(scanned 0)
foreach(f IN LISTS files)
  if(f MATCHES "^(src|include/shardtrain)/(comm|runtime)/")
    continue()
  endif()
  math(EXPR scanned "${scanned} + 1")
  file(READ "${ROOT}/${f}" text)
  # Comments may name the calls; the newlines stay, so line numbers stay true.
  string(REGEX REPLACE "//[^\n]*" "" text "${text}")
  while(text MATCHES "${pattern}")
    set(m "${CMAKE_MATCH_0}")
    set(call "${m}")
    string(FIND "${text}" "${m}" at)
    string(SUBSTRING "${text}" 0 ${at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines line)
    math(EXPR line "${line} + 1")
    string(REGEX REPLACE "[ \t\r\n]*\\($" "" call "${call}")
    string(APPEND found "  ${f}:${line}: ${call}\n")
    # Blank the match (same length, newlines kept) and look for the next one.
    string(LENGTH "${m}" n)
    math(EXPR after "${at} + ${n}")
    string(SUBSTRING "${text}" ${after} -1 rest)
    string(REGEX REPLACE "[^\n]" " " blank "${m}")
    string(CONCAT text "${before}" "${blank}" "${rest}")
  endwhile()
endforeach()
if(found)
  message(FATAL_ERROR "raw MPI communication calls outside src/comm and src/runtime (use "
          "runtime/exchange.h: a named, watched, checked exchange):\n${found}")
endif()
message(STATUS "no raw MPI communication call in ${scanned} files outside src/comm and src/runtime")
