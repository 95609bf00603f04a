// CountingComm: a Comm that forwards every collective to the one it wraps and counts the bytes
// this rank sends, inside its node and between nodes, under a ring model of each collective
// (engine.h CommStats). The engine wraps its communicators in these, so every collective it
// issues (gathers, reductions, the replica average, the norm) is counted in one place.
#pragma once
#include <atomic>
#include <memory>

#include "shardtrain/comm/comm.h"

namespace shardtrain::fsdp {

struct ByteCounters {
  std::atomic<int64_t> intra{0}, inter{0};
};

class CountingComm final : public comm::Comm {
 public:
  // Collective over `inner`'s group: all-gathers the members' host ids (host_id: this rank's,
  // -1 unknown) to find whether this rank's ring successor is on another host. `device`: where
  // the inner backend's tensors live.
  CountingComm(comm::Comm& inner, int host_id, const c10::Device& device, ByteCounters& counters);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  comm::Backend backend() const override { return inner_.backend(); }
  comm::WorkPtr all_gather(const at::Tensor& out, const at::Tensor& in) override;
  comm::WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, comm::ReduceOp op) override;
  comm::WorkPtr all_reduce(const at::Tensor& tensor, comm::ReduceOp op) override;
  comm::WorkPtr all_reduce_coalesced(const std::vector<at::Tensor>& tensors, comm::ReduceOp op) override;
  // The fixed-tree sums (train.reproducible), counted as their ring counterparts: the
  // reduce-scatter sends the same bytes; the all-reduce as much as reduce-scatter + all-gather
  // (recursive doubling, taken for small or uneven tensors, sends more).
  comm::WorkPtr reduce_scatter_tree(const at::Tensor& out, const at::Tensor& in) override;
  comm::WorkPtr all_reduce_tree(const at::Tensor& tensor) override;
  comm::WorkPtr broadcast(const at::Tensor& tensor, int root) override;
  comm::WorkPtr barrier() override { return inner_.barrier(); }
  std::vector<comm::FlightRecord> flight_records() const override { return inner_.flight_records(); }

  // Whether this rank's ring successor lives on another host.
  bool successor_remote() const { return remote_; }

 private:
  void count(double bytes);
  comm::Comm& inner_;
  ByteCounters& counters_;
  bool remote_ = false;
  int successor_ = 0;
};

}  // namespace shardtrain::fsdp
