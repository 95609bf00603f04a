// Small collectives outside the engine's communicators (see small_collectives.h).
#include "shardtrain/runtime/small_collectives.h"

#include <limits>

#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {

void sum_u64(MPI_Comm comm, std::vector<uint64_t>& values, const char* name) {
  ST_CHECK(values.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), name, ": ", values.size(),
           " values in one sum");
  BlockingRegion region(comm, name);
  ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_UINT64_T, MPI_SUM, comm));
}

void broadcast_string(MPI_Comm comm, std::string& text, int root, const char* name) {
  BlockingRegion region(comm, name);
  uint64_t n = text.size();
  ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm));
  ST_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int>::max()), name, ": a broadcast of ", n, " bytes");
  text.resize(static_cast<size_t>(n));
  if (n > 0) ST_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, root, comm));
}

}  // namespace shardtrain::runtime
