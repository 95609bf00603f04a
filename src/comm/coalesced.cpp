// Comm::all_reduce_coalesced, the default: one collective per tensor, one Work for them all.
#include "shardtrain/comm/comm.h"

namespace shardtrain::comm {
namespace {

class MultiWork final : public Work {
 public:
  explicit MultiWork(std::vector<WorkPtr> works)
      : Work(works.empty() ? 0 : works.back()->seq()), works_(std::move(works)) {}
  void wait() override {
    for (auto& w : works_) w->wait();
  }
  bool is_completed() override {
    for (auto& w : works_)
      if (!w->is_completed()) return false;
    return true;
  }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

WorkPtr Comm::all_reduce_coalesced(const std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<WorkPtr> works;
  works.reserve(tensors.size());
  for (const auto& t : tensors) works.push_back(all_reduce(t, op));
  return std::make_shared<MultiWork>(std::move(works));
}

}  // namespace shardtrain::comm
