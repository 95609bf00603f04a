// LeafSum: a flat's gradient under train.reproducible, summed over the step's leaves (virtual
// micro-batches) in one fixed binary tree, whatever the world size (docs/reproducibility.md).
//
// Each push is the sum of one complete subtree of equal size (a leaf-level reduce-scatter over
// the shard group sums S consecutive leaves); consecutive pushes are siblings. A binary counter
// keeps at most one partial sum per level and adds equal levels as soon as both exist, which
// is the pairwise tree over the pushes: 4 pushes give ((p0 + p1) + (p2 + p3)) at any S.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace shardtrain::fsdp {

class LeafSum {
 public:
  // Takes ownership of x (fp32; it becomes a partial sum and is added into in place).
  void push(at::Tensor x) {
    size_t level = 0;
    while (level < partials_.size() && partials_[level].defined()) {
      partials_[level].add_(x);  // a + b == b + a in IEEE: only the association matters
      x = std::move(partials_[level]);
      partials_[level] = at::Tensor();
      ++level;
    }
    if (level == partials_.size()) partials_.emplace_back();
    partials_[level] = std::move(x);
    ++pushes_;
  }
  int64_t pushes() const { return pushes_; }
  // The whole tree's sum, and the counter emptied. Defined only for a power-of-two number of
  // pushes (one partial left); anything else is a bug in the caller's leaf plan.
  at::Tensor take() {
    at::Tensor top;
    int left = 0;
    for (auto& p : partials_)
      if (p.defined()) {
        top = std::move(p);
        ++left;
      }
    partials_.clear();
    pushes_ = 0;
    return left == 1 ? top : at::Tensor();
  }

 private:
  std::vector<at::Tensor> partials_;  // partials_[l]: the sum of 2^l pushes, or undefined
  int64_t pushes_ = 0;
};

}  // namespace shardtrain::fsdp
