// Ring reduce-scatter over MPI point-to-point, accumulating in fp32 (fp64 for fp64).
#pragma once
#include <c10/core/ScalarType.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardtrain/comm/comm.h"

namespace shardtrain::comm::detail {

// Grow-only scratch memory and request slots owned by one worker thread (no page faults and
// no allocation per call after warm-up).
class Scratch {
 public:
  void* get(size_t bytes);
  MPI_Request* requests(size_t n);  // at least n slots

 private:
  std::unique_ptr<char[]> mem_;
  size_t size_ = 0;
  std::vector<MPI_Request> requests_;
};

// Why not MPI_Reduce_scatter_block: Open MPI 4.1 runs it as reduce-to-root + scatter,
// about 4x slower than a ring here. The ring sends n-1 partial sums of `count` elements
// to the right neighbour, in segments so that each received segment is reduced while
// still in cache. Partial sums travel in the accumulation type, so bf16/fp16 inputs are
// summed in fp32 and rounded once. `in` holds size*count elements; `out` (count
// elements) may be any rank's slice of `in`. Avg divides the sum by size at the end.
// Collective over comm; only one thread may use comm.
void ring_reduce_scatter(MPI_Comm comm, int rank, int size, const void* in, void* out,
                         int64_t count, at::ScalarType dtype, ReduceOp op, Scratch& scratch);

// Segment size in bytes of accumulation type (default 256 KiB; SHARDTRAIN_RING_SEGMENT_KB).
size_t ring_segment_bytes();

}  // namespace shardtrain::comm::detail
