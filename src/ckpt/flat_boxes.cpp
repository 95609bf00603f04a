// flat_range_boxes: head partial row, full rows, tail partial row, recursing on the inner dims.
#include "shardtrain/ckpt/flat_boxes.h"

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t c : count) n *= c;
  return n;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
// Appends boxes for [begin, end) of shape[dim..], with `prefix` fixing dims before dim.
void decompose(const std::vector<int64_t>& shape, size_t dim, int64_t begin, int64_t end,
               const std::vector<int64_t>& prefix, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t nd = shape.size();
  auto box = [&](int64_t row_start, int64_t rows) {
    Box b;
    b.start = prefix;
    b.count.assign(prefix.size(), 1);
    b.start.push_back(row_start);
    b.count.push_back(rows);
    for (size_t d = dim + 1; d < nd; ++d) {
      b.start.push_back(0);
      b.count.push_back(shape[d]);
    }
    out.push_back(std::move(b));
  };
  int64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  if (dim + 1 == nd) {
    box(begin, end - begin);
    return;
  }
  int64_t row_a = begin / inner, row_b = end / inner;
  std::vector<int64_t> p = prefix;
  p.push_back(0);
  if (row_a == row_b) {  // inside one row
    p.back() = row_a;
    decompose(shape, dim + 1, begin % inner, end % inner, p, out);
    return;
  }
  if (begin % inner != 0) {  // head: the rest of row_a
    p.back() = row_a;
    decompose(shape, dim + 1, begin % inner, inner, p, out);
    ++row_a;
  }
  if (row_b > row_a) box(row_a, row_b - row_a);  // whole rows
  if (end % inner != 0) {  // tail: the start of row_b
    p.back() = row_b;
    decompose(shape, dim + 1, 0, end % inner, p, out);
  }
}
}  // namespace

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const int64_t n = shape_numel(shape);
  ST_CHECK(0 <= begin && begin <= end && end <= n, "range [", begin, ",", end, ") outside ", n, " elements");
  std::vector<Box> out;
  if (begin == end) return out;
  if (shape.empty()) {
    out.push_back(Box{});
    return out;
  }
  decompose(shape, 0, begin, end, {}, out);
  return out;
}

}  // namespace shardtrain::ckpt
