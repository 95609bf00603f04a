// Turns an MPI error code into an Error naming the call, file:line and rank.
#include "shardtrain/util/mpi_check.h"

#include <string>

namespace shardtrain::detail {
void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw_internal(file, line, std::string(call) + " failed: " + std::string(text, len));
}
}  // namespace shardtrain::detail
