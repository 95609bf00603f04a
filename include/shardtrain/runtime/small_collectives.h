// Small collectives outside the engine's communicators (counters summed over the world,
// checksums), each issued inside a named BlockingRegion: the watchdog's report names it.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::runtime {

// values := their element-wise sum over comm (mod 2^64). Collective; `name` is the region's.
void sum_u64(MPI_Comm comm, std::vector<uint64_t>& values, const char* name);
// text := root's text on every rank of comm. Collective.
void broadcast_string(MPI_Comm comm, std::string& text, int root, const char* name);

}  // namespace shardtrain::runtime
