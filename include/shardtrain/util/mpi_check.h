// ST_MPI_CHECK: every MPI call goes through it, so a failure names the call, file:line and rank.
#pragma once
#include <mpi.h>

#include "shardtrain/util/error.h"

namespace shardtrain::detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}

#define ST_MPI_CHECK(call)                                                              \
  do {                                                                                  \
    int st_mpi_rc_ = (call);                                                            \
    if (st_mpi_rc_ != MPI_SUCCESS)                                                      \
      ::shardtrain::detail::throw_mpi_error(st_mpi_rc_, #call, __FILE__, __LINE__);     \
  } while (0)
