// Helpers for the comm tests: deterministic per-rank inputs and locally computed references.
#pragma once
#include <ATen/ATen.h>
#include <mpi.h>

#include "shardtrain/comm/comm.h"

#include <memory>
#include <string>
#include <vector>

namespace shardtrain::comm::testing {

inline int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
inline int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

// The MPI backend over MPI_COMM_WORLD, with a timeout that ends a hung test.
inline std::unique_ptr<Comm> world_comm() {
  CommOptions o;
  o.timeout_s = 120;
  return make_mpi_comm(MPI_COMM_WORLD, "world", o);
}

// Small integers in [-5, 5] that depend on the rank and the index, so that sums over a
// few ranks are exact in every dtype (bf16 included) and a misplaced chunk is visible.
inline at::Tensor rank_values(int rank, int64_t numel, at::ScalarType dtype) {
  at::Tensor i = at::arange(numel, at::kLong);
  return ((i * 3 + rank * 7) % 11 - 5).to(dtype);
}

// Padded length the FSDP engine uses: numel rounded up to a multiple of the group size.
inline int64_t padded(int64_t numel, int n) { return (numel + n - 1) / n * n; }

// rank_values(rank, numel) followed by zeros up to `total` elements (FSDP padding).
inline at::Tensor padded_values(int rank, int64_t numel, int64_t total, at::ScalarType dtype) {
  at::Tensor t = at::zeros({total}, dtype);
  if (numel > 0) t.narrow(0, 0, numel).copy_(rank_values(rank, numel, dtype));
  return t;
}

inline const std::vector<at::ScalarType>& float_dtypes() {
  static std::vector<at::ScalarType> v{at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};
  return v;
}

// Sizes the engine meets: empty, one element, odd (padding at 2-4 ranks), a few thousand.
// Cheap enough for every dtype x op x in-place combination.
inline const std::vector<int64_t>& small_sizes() {
  static std::vector<int64_t> v{0, 1, 7, 1001};
  return v;
}

// Large and odd: padded at 2, 3 and 4 ranks, and each rank's shard spans more than one 256 KiB
// segment of the ring reduce-scatter plus a shorter last one at 2, 3 and 4 ranks (65536
// elements per segment for fp32/bf16/fp16, which accumulate in fp32; 32768 for fp64).
// Also past OpenMPI's large-message thresholds (8 B x 300007 = 2.3 MiB).
constexpr int64_t kLargeOdd = 300007;

// Exact comparison of values (as double, NaN-free inputs).
inline bool same_values(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() && a.to(at::kDouble).equal(b.to(at::kDouble));
}
// Close comparison for averages (rounding differs by at most one unit of the dtype).
inline bool close_values(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  double tol = (dtype == at::kBFloat16) ? 1e-2 : (dtype == at::kHalf) ? 1e-3 : 1e-6;
  return a.numel() == b.numel() && at::allclose(a.to(at::kDouble), b.to(at::kDouble), tol, tol);
}

inline std::string dtype_str(at::ScalarType t) { return c10::toString(t); }

}  // namespace shardtrain::comm::testing
