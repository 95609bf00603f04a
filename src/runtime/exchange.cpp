// Agreements and small exchanges (exchange.h): each a named BlockingRegion around checked MPI calls.
#include "shardtrain/runtime/exchange.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>
#include <utility>

#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {
namespace {

template <typename T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<int>() { return MPI_INT; }
template <> MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <> MPI_Datatype mpi_type<uint64_t>() { return MPI_UINT64_T; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<char>() { return MPI_CHAR; }

int count_of(size_t n, const char* name) {
  ST_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()), name, ": ", n, " elements in one exchange");
  return static_cast<int>(n);
}

int size_of(MPI_Comm comm) {
  int n = 1;
  ST_MPI_CHECK(MPI_Comm_size(comm, &n));
  return n;
}

template <typename T> T reduce_one(MPI_Comm comm, T mine, MPI_Op op, const char* name) {
  T out{};
  BlockingRegion region(comm, name);
  ST_MPI_CHECK(MPI_Allreduce(&mine, &out, 1, mpi_type<T>(), op, comm));
  return out;
}

template <typename T> void reduce_all(MPI_Comm comm, std::vector<T>& values, MPI_Op op, const char* name) {
  const int n = count_of(values.size(), name);
  BlockingRegion region(comm, name);
  if (n == 0) return;  // still a region: every rank enters the same ones
  ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, mpi_type<T>(), op, comm));
}

// Lengths, then the bytes with displacements (MPI_Gatherv on root / MPI_Allgatherv).
std::vector<std::string> split(const std::vector<char>& all, const std::vector<int>& counts) {
  std::vector<std::string> out(counts.size());
  size_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    out[r].assign(all.data() + at, static_cast<size_t>(counts[r]));
    at += static_cast<size_t>(counts[r]);
  }
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts, const char* name) {
  std::vector<int> d(counts.size(), 0);
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    d[r] = count_of(static_cast<size_t>(at), name);
    at += counts[r];
  }
  count_of(static_cast<size_t>(at), name);
  return d;
}

// Every rank's `n` values of T on root, one rank's after the other, and their counts (both
// empty on the other ranks): MPI_Gather of the lengths, then MPI_Gatherv.
template <typename T>
std::pair<std::vector<T>, std::vector<int>> gather_v(MPI_Comm comm, int root, const T* mine, size_t count,
                                                     const char* name) {
  const int size = size_of(comm);
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int n = count_of(count, name);
  std::vector<int> counts(rank == root ? static_cast<size_t>(size) : 0, 0);
  BlockingRegion region(comm, name);
  ST_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  std::vector<int> displs;
  std::vector<T> all;
  if (rank == root) {
    displs = displacements(counts, name);
    all.resize(static_cast<size_t>(displs.back()) + static_cast<size_t>(counts.back()));
  }
  ST_MPI_CHECK(MPI_Gatherv(mine, n, mpi_type<T>(), all.data(), counts.data(), displs.data(), mpi_type<T>(), root, comm));
  return {std::move(all), std::move(counts)};
}

}  // namespace

bool all_agree(MPI_Comm comm, bool mine, const char* name) { return reduce_one<int>(comm, mine ? 1 : 0, MPI_MIN, name) == 1; }
bool any_rank(MPI_Comm comm, bool mine, const char* name) { return reduce_one<int>(comm, mine ? 1 : 0, MPI_MAX, name) == 1; }

bool all_equal(MPI_Comm comm, uint64_t mine, const char* name) {
  // max(~x) = ~min(x): one all-reduce gives both ends.
  std::vector<uint64_t> v = {mine, ~mine};
  reduce_all(comm, v, MPI_MAX, name);
  return v[0] == ~v[1];
}

template <typename T> T sum(MPI_Comm comm, T mine, const char* name) { return reduce_one(comm, mine, MPI_SUM, name); }
template <typename T> T min(MPI_Comm comm, T mine, const char* name) { return reduce_one(comm, mine, MPI_MIN, name); }
template <typename T> T max(MPI_Comm comm, T mine, const char* name) { return reduce_one(comm, mine, MPI_MAX, name); }
template <typename T> void sum(MPI_Comm comm, std::vector<T>& v, const char* name) { reduce_all(comm, v, MPI_SUM, name); }
template <typename T> void min(MPI_Comm comm, std::vector<T>& v, const char* name) { reduce_all(comm, v, MPI_MIN, name); }
template <typename T> void max(MPI_Comm comm, std::vector<T>& v, const char* name) { reduce_all(comm, v, MPI_MAX, name); }

void bit_or(MPI_Comm comm, std::vector<uint64_t>& values, const char* name) { reduce_all(comm, values, MPI_BOR, name); }

std::vector<int64_t> exclusive_sum(MPI_Comm comm, const std::vector<int64_t>& mine, const char* name) {
  const int n = count_of(mine.size(), name);
  std::vector<int64_t> out(mine.size(), 0);
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  BlockingRegion region(comm, name);
  if (n == 0) return out;
  ST_MPI_CHECK(MPI_Exscan(mine.data(), out.data(), n, MPI_INT64_T, MPI_SUM, comm));
  if (rank == 0) std::fill(out.begin(), out.end(), 0);  // MPI_Exscan leaves rank 0's result undefined
  return out;
}

void broadcast_bytes(MPI_Comm comm, void* data, size_t bytes, int root, const char* name) {
  const int n = count_of(bytes, name);
  BlockingRegion region(comm, name);
  if (n > 0) ST_MPI_CHECK(MPI_Bcast(data, n, MPI_BYTE, root, comm));
}

void broadcast(MPI_Comm comm, std::string& text, int root, const char* name) {
  BlockingRegion region(comm, name);
  uint64_t n = text.size();
  ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm));
  text.resize(static_cast<size_t>(n));
  const int c = count_of(static_cast<size_t>(n), name);
  if (c > 0) ST_MPI_CHECK(MPI_Bcast(text.data(), c, MPI_CHAR, root, comm));
}

void broadcast_sized(MPI_Comm comm, std::vector<char>& bytes, size_t elem, int root, const char* name) {
  BlockingRegion region(comm, name);
  uint64_t n = bytes.size() / elem;
  ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm));
  bytes.resize(static_cast<size_t>(n) * elem);
  const int c = count_of(bytes.size(), name);
  if (c > 0) ST_MPI_CHECK(MPI_Bcast(bytes.data(), c, MPI_BYTE, root, comm));
}

template <typename T> std::vector<T> all_gather(MPI_Comm comm, const std::vector<T>& mine, const char* name) {
  const int n = count_of(mine.size(), name);
  const int size = size_of(comm);
  std::vector<T> all(mine.size() * static_cast<size_t>(size));
  count_of(all.size(), name);
  BlockingRegion region(comm, name);
  if (n > 0) ST_MPI_CHECK(MPI_Allgather(mine.data(), n, mpi_type<T>(), all.data(), n, mpi_type<T>(), comm));
  return all;
}

std::vector<std::string> all_gather_bytes(MPI_Comm comm, const std::string& mine, const char* name) {
  const int size = size_of(comm);
  int n = count_of(mine.size(), name);
  std::vector<int> counts(static_cast<size_t>(size), 0);
  BlockingRegion region(comm, name);
  ST_MPI_CHECK(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
  const std::vector<int> displs = displacements(counts, name);
  std::vector<char> all(static_cast<size_t>(displs.back()) + static_cast<size_t>(counts.back()));
  ST_MPI_CHECK(MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm));
  return split(all, counts);
}

std::vector<std::string> gather_to(MPI_Comm comm, int root, const std::string& mine, const char* name) {
  auto [all, counts] = gather_v(comm, root, mine.data(), mine.size(), name);
  if (counts.empty()) return {};
  return split(all, counts);
}

std::vector<double> gather_to(MPI_Comm comm, int root, const std::vector<double>& mine, const char* name) {
  return gather_v(comm, root, mine.data(), mine.size(), name).first;
}

void barrier(MPI_Comm comm, const char* name) {
  BlockingRegion region(comm, name);
  ST_MPI_CHECK(MPI_Barrier(comm));
}

void quiet_barrier(MPI_Comm comm, const char* name) {
  BlockingRegion region(comm, name);
  MPI_Request req = MPI_REQUEST_NULL;
  ST_MPI_CHECK(MPI_Ibarrier(comm, &req));
  for (int done = 0;;) {
    ST_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int cleanup_min(MPI_Comm comm, int mine) {
  int out = 0;
  (void)MPI_Allreduce(&mine, &out, 1, MPI_INT, MPI_MIN, comm);
  return out;
}

void cleanup_barrier(MPI_Comm comm) { (void)MPI_Barrier(comm); }

#define ST_EXCHANGE_TYPE(T)                                                      \
  template T sum<T>(MPI_Comm, T, const char*);                                   \
  template T min<T>(MPI_Comm, T, const char*);                                   \
  template T max<T>(MPI_Comm, T, const char*);                                   \
  template void sum<T>(MPI_Comm, std::vector<T>&, const char*);                  \
  template void min<T>(MPI_Comm, std::vector<T>&, const char*);                  \
  template void max<T>(MPI_Comm, std::vector<T>&, const char*);                  \
  template std::vector<T> all_gather<T>(MPI_Comm, const std::vector<T>&, const char*);
ST_EXCHANGE_TYPE(int)
ST_EXCHANGE_TYPE(int64_t)
ST_EXCHANGE_TYPE(uint64_t)
ST_EXCHANGE_TYPE(double)
#undef ST_EXCHANGE_TYPE

}  // namespace shardtrain::runtime
