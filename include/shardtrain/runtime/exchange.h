// The one way code outside comm/ and runtime/ talks to the other ranks: agreements and small
// exchanges over an MPI communicator, typed, each named.
//
// Every function here is collective over `comm`: every rank of it calls the same functions in
// the same order. `name` is a short token ("step.agree", "save.metadata", "manager.list"): the
// exchange runs inside runtime::BlockingRegion(comm, name), so on a watched communicator
// (comm::watch_regions; `shardtrain train` watches the world) one that lasts longer than
// comm.timeout_s ends the job with the watchdog's report, which prints the name, the ranks that
// did not arrive and their hosts (exit 3). That is by construction: no call site opens a region
// for its own exchanges. Every MPI return code is checked (ST_MPI_CHECK: the call, file:line,
// rank). Scalar types: int, int64_t, uint64_t, double. Vector arguments hold at most INT_MAX
// elements.
//
// The engine's collectives are comm::Comm's (comm/comm.h), not these; HDF5's MPI-IO calls stay
// in ckpt/, inside regions of their own (runtime/blocking_region.h).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace shardtrain::runtime {

// True when `mine` is true on every rank / on some rank.
bool all_agree(MPI_Comm comm, bool mine, const char* name);
bool any_rank(MPI_Comm comm, bool mine, const char* name);
// True when every rank holds the same value (one all-reduce of the value and its complement).
bool all_equal(MPI_Comm comm, uint64_t mine, const char* name);

// The sum / minimum / maximum over the ranks (element-wise for a vector, in place). An
// element-wise sum of a vector gives each element the bits that a sum of that element alone gives.
template <typename T> T sum(MPI_Comm comm, T mine, const char* name);
template <typename T> T min(MPI_Comm comm, T mine, const char* name);
template <typename T> T max(MPI_Comm comm, T mine, const char* name);
template <typename T> void sum(MPI_Comm comm, std::vector<T>& values, const char* name);
template <typename T> void min(MPI_Comm comm, std::vector<T>& values, const char* name);
template <typename T> void max(MPI_Comm comm, std::vector<T>& values, const char* name);
// Element-wise bitwise or (uint64_t).
void bit_or(MPI_Comm comm, std::vector<uint64_t>& values, const char* name);
// Element-wise sum over the ranks below this one (zeros on rank 0); int64_t.
std::vector<int64_t> exclusive_sum(MPI_Comm comm, const std::vector<int64_t>& mine, const char* name);

// value := root's value on every rank. Plain values (trivially copyable) travel as their bytes.
void broadcast_bytes(MPI_Comm comm, void* data, size_t bytes, int root, const char* name);
template <typename T> void broadcast(MPI_Comm comm, T& value, int root, const char* name) {
  static_assert(std::is_trivially_copyable_v<T>, "broadcast: a plain value, a std::string or a std::vector");
  broadcast_bytes(comm, &value, sizeof(T), root, name);
}
// A string or a vector of plain values: root's size, then its contents (one region).
void broadcast(MPI_Comm comm, std::string& text, int root, const char* name);
void broadcast_sized(MPI_Comm comm, std::vector<char>& bytes, size_t elem, int root, const char* name);
template <typename T> void broadcast(MPI_Comm comm, std::vector<T>& values, int root, const char* name) {
  static_assert(std::is_trivially_copyable_v<T>, "broadcast: a vector of plain values");
  std::vector<char> b(values.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
  broadcast_sized(comm, b, sizeof(T), root, name);
  values.resize(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(values.data(), b.data(), b.size());
}

// Every rank's values, concatenated in rank order on every rank: rank r's at [r*n, (r+1)*n).
// `mine` has the same length n on every rank (one collective, so not checked: all_gather_bytes
// takes any lengths).
template <typename T> std::vector<T> all_gather(MPI_Comm comm, const std::vector<T>& mine, const char* name);
template <typename T> std::vector<T> all_gather(MPI_Comm comm, T mine, const char* name) {
  return all_gather(comm, std::vector<T>{mine}, name);
}
// Every rank's bytes (any lengths) on every rank, in rank order.
std::vector<std::string> all_gather_bytes(MPI_Comm comm, const std::string& mine, const char* name);
// Every rank's bytes (any lengths) on `root`, in rank order; an empty vector on the others.
std::vector<std::string> gather_to(MPI_Comm comm, int root, const std::string& mine, const char* name);
// Every rank's values (any lengths) on `root`, concatenated in rank order; empty on the others.
std::vector<double> gather_to(MPI_Comm comm, int root, const std::vector<double>& mine, const char* name);

// Every rank has arrived. quiet_barrier sleeps between polls instead of spinning (Open MPI's
// blocking collectives busy-poll): a rank done with its share leaves its core to those still working.
void barrier(MPI_Comm comm, const char* name);
void quiet_barrier(MPI_Comm comm, const char* name);

// Clean-up after a failure every rank already agreed on (a checkpoint abandoned): return codes
// ignored (a second error could only be reported by some ranks) and not a region: the caller's
// own deadline bounds it, with the failure's exit code.
int cleanup_min(MPI_Comm comm, int mine);
void cleanup_barrier(MPI_Comm comm);

}  // namespace shardtrain::runtime
