// Fixed-tree reduce-scatter and all-reduce over MPI_Sendrecv (see tree_reduce.h).
#include "tree_reduce.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>

#include "half.h"
#include "internal.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::comm::detail {
namespace {

constexpr int kTreeTag = 4712;
// MPI counts are int: long messages go in pieces (the pieces' order does not touch the sums).
constexpr int64_t kMaxPiece = int64_t(1) << 28;

template <typename A>
MPI_Datatype wire_type() {
  return std::is_same<A, double>::value ? MPI_DOUBLE : MPI_FLOAT;
}

template <typename A>
void exchange(MPI_Comm comm, int peer, const A* send, A* recv, int64_t n) {
  for (int64_t off = 0; off < n; off += kMaxPiece) {
    const int len = static_cast<int>(std::min(kMaxPiece, n - off));
    ST_MPI_CHECK(MPI_Sendrecv(send + off, len, wire_type<A>(), peer, kTreeTag, recv + off, len, wire_type<A>(), peer,
                              kTreeTag, comm, MPI_STATUS_IGNORE));
  }
}

template <typename T>
void reduce_scatter(MPI_Comm comm, int r, int n, const T* in, T* out, int64_t c, Scratch& scratch) {
  using A = typename Accum<T>::type;
  if (n == 1) {
    for (int64_t i = 0; i < c; ++i) out[i] = store_as<T, A>(load_as<T, A>(in[i]));
    return;
  }
  const int64_t half = static_cast<int64_t>(n / 2) * c;
  A* base = static_cast<A*>(scratch.get(sizeof(A) * static_cast<size_t>(half) * 3));
  A* work = base;             // the current chunk set, rows in ascending chunk order
  A* send = base + half;
  A* recv = base + 2 * half;
  // Step 0 reads `in` directly; later steps the working set. Rows m of the current set are the
  // chunks c = (r mod 2^k) + m 2^k; bit k of c is the parity of m.
  int64_t rows = n;
  for (int k = 0; (1 << k) < n; ++k) {
    const int bit = (r >> k) & 1, peer = r ^ (1 << k);
    const int64_t keep_rows = rows / 2;
    for (int64_t i = 0; i < keep_rows; ++i) {
      const int64_t m = 2 * i + (1 - bit);
      A* dst = send + i * c;
      if (k == 0) {
        const T* src = in + m * c;
        for (int64_t e = 0; e < c; ++e) dst[e] = load_as<T, A>(src[e]);
      } else {
        std::memcpy(dst, work + m * c, sizeof(A) * static_cast<size_t>(c));
      }
    }
    exchange(comm, peer, send, recv, keep_rows * c);
    for (int64_t i = 0; i < keep_rows; ++i) {  // row 2i+bit >= i: in place, ascending, is safe
      const int64_t m = 2 * i + bit;
      A* dst = work + i * c;
      const A* rv = recv + i * c;
      if (k == 0) {
        const T* src = in + m * c;
        for (int64_t e = 0; e < c; ++e) dst[e] = load_as<T, A>(src[e]) + rv[e];
      } else {
        const A* src = work + m * c;
        for (int64_t e = 0; e < c; ++e) dst[e] = src[e] + rv[e];
      }
    }
    rows = keep_rows;
  }
  for (int64_t e = 0; e < c; ++e) out[e] = store_as<T, A>(work[e]);
}

template <typename T>
void recursive_doubling(MPI_Comm comm, int r, int n, T* data, int64_t c, Scratch& scratch) {
  using A = typename Accum<T>::type;
  A* base = static_cast<A*>(scratch.get(sizeof(A) * static_cast<size_t>(c) * 2));
  A* acc = base;
  A* recv = base + c;
  for (int64_t e = 0; e < c; ++e) acc[e] = load_as<T, A>(data[e]);
  for (int k = 0; (1 << k) < n; ++k) {
    exchange(comm, r ^ (1 << k), acc, recv, c);
    for (int64_t e = 0; e < c; ++e) acc[e] = acc[e] + recv[e];
  }
  for (int64_t e = 0; e < c; ++e) data[e] = store_as<T, A>(acc[e]);
}

template <typename T>
void all_reduce(MPI_Comm comm, int r, int n, T* data, int64_t c, Scratch& scratch, MPI_Datatype storage) {
  if (n == 1) return;
  const int64_t chunk = c / n;
  if (c % n == 0 && chunk >= 4096 && chunk <= INT_MAX) {
    // Reduce-scatter into this rank's slice, then gather the slices back in place. The slice
    // may be the output: reduce_scatter reads `in` only in its first step, before any write.
    reduce_scatter<T>(comm, r, n, data, data + r * chunk, chunk, scratch);
    ST_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, static_cast<int>(chunk), storage, data, static_cast<int>(chunk), storage,
                               comm));
    return;
  }
  recursive_doubling<T>(comm, r, n, data, c, scratch);
}

MPI_Datatype storage_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    default: return MPI_UINT16_T;  // bf16 / fp16: moved as bits
  }
}

}  // namespace

bool is_power_of_two(int n) { return n >= 1 && (n & (n - 1)) == 0; }

void tree_reduce_scatter(MPI_Comm comm, int rank, int size, const void* in, void* out, int64_t count,
                         at::ScalarType dtype, Scratch& scratch) {
  ST_CHECK(is_power_of_two(size), "tree_reduce_scatter: group size ", size, " is not a power of two");
  switch (dtype) {
    case at::kFloat:
      return reduce_scatter(comm, rank, size, static_cast<const float*>(in), static_cast<float*>(out), count, scratch);
    case at::kDouble:
      return reduce_scatter(comm, rank, size, static_cast<const double*>(in), static_cast<double*>(out), count, scratch);
    case at::kBFloat16:
      return reduce_scatter(comm, rank, size, static_cast<const c10::BFloat16*>(in), static_cast<c10::BFloat16*>(out),
                            count, scratch);
    case at::kHalf:
      return reduce_scatter(comm, rank, size, static_cast<const c10::Half*>(in), static_cast<c10::Half*>(out), count,
                            scratch);
    default: ST_CHECK(false, "tree_reduce_scatter: unsupported dtype ", dtype_long_name(dtype));
  }
}

void tree_all_reduce(MPI_Comm comm, int rank, int size, void* data, int64_t count, at::ScalarType dtype,
                     Scratch& scratch) {
  ST_CHECK(is_power_of_two(size), "tree_all_reduce: group size ", size, " is not a power of two");
  const MPI_Datatype st = storage_type(dtype);
  switch (dtype) {
    case at::kFloat: return all_reduce(comm, rank, size, static_cast<float*>(data), count, scratch, st);
    case at::kDouble: return all_reduce(comm, rank, size, static_cast<double*>(data), count, scratch, st);
    case at::kBFloat16: return all_reduce(comm, rank, size, static_cast<c10::BFloat16*>(data), count, scratch, st);
    case at::kHalf: return all_reduce(comm, rank, size, static_cast<c10::Half*>(data), count, scratch, st);
    default: ST_CHECK(false, "tree_all_reduce: unsupported dtype ", dtype_long_name(dtype));
  }
}

}  // namespace shardtrain::comm::detail
