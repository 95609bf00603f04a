// flat_range_boxes: a contiguous range of a row-major array as at most 2*ndim-1 boxes.
#pragma once
#include <cstdint>
#include <vector>

namespace shardtrain::ckpt {

// An N-D box: start and count per dimension (HDF5 hyperslab start/count, stride 1).
struct Box {
  std::vector<int64_t> start, count;
  int64_t numel() const;
};

// Flat elements [begin, end) of a row-major array of `shape`, as disjoint boxes in
// increasing flat order (so the boxes' elements, box after box in row-major order,
// are the range in order). At most 2*ndim-1 boxes; none when the range is empty.
// A 0-d shape (scalar) is treated as one element. Throws if the range is outside.
std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

int64_t shape_numel(const std::vector<int64_t>& shape);

}  // namespace shardtrain::ckpt
