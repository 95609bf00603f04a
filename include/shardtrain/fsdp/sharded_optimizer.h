// ShardedOptimizer: the fused AdamW/SGD kernels applied to every flat shard of an Engine.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/decay_mask.h"
#include "shardtrain/optim/sgd.h"

namespace shardtrain::fsdp {

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | sgd
  optim::AdamWConfig adamw;
  optim::SGDConfig sgd;
  // Parameter-name substrings that take no weight decay (biases, norms).
  std::vector<std::string> no_decay = {".bias", "norm", "ln_"};
  // Host threads for the AdamW step on host shards (CPU offload of a large model: the Kokkos
  // Serial kernel is one core's worth). The shards are cut into chunks, each stepped by the
  // same kernel on its part of the mask, so the result does not depend on this number.
  int host_threads = 1;
};

// Owns the optimizer state of this rank's shards (fp32, same length as each shard).
// Weight decay is expressed as element ranges over each flat layout, cut to the shard.
// Where the masters live decides where it steps: host memory (CPU runs, cpu_offload) -> the
// Kokkos kernels; a CUDA device -> the fused CUDA AdamW kernel (adamw_cuda.h) with the moments
// on the device, or, in builds without nvcc, the same update as libtorch operations
// (not bit-equal to the kernel). SGD runs on the host only.
class ShardedOptimizer {
 public:
  ShardedOptimizer(Engine& engine, OptimizerConfig cfg);
  // One step on every shard with this learning rate, then marks parameters stale so
  // the next forward re-gathers them.
  void step(float lr);
  int64_t steps_taken() const;
  void set_steps_taken(int64_t steps);
  int64_t state_bytes() const;
  // State arrays per flat param, for checkpoints: {"exp_avg", "exp_avg_sq"} or {"momentum"}.
  std::vector<std::string> state_names() const;
  float* state(size_t flat_index, size_t state_index);
  const optim::DecayMask& decay_mask(size_t flat_index) const { return masks_.at(flat_index); }

 private:
  Engine& engine_;
  OptimizerConfig cfg_;
  std::vector<FlatParam*> flats_;
  std::vector<optim::DecayMask> masks_;
  std::vector<std::unique_ptr<optim::FusedAdamW>> adamw_;
  std::vector<std::unique_ptr<optim::FusedSGD>> sgd_;
  // Masters on a CUDA device: moments and the decay mask's bounds live there too.
  struct DeviceState {
    at::Tensor exp_avg, exp_avg_sq, bounds;  // bounds: int64 [b0, e0, b1, e1, ...]
  };
  bool on_device_ = false;
  int64_t device_steps_ = 0;
  std::vector<DeviceState> dev_;
  void step_on_device(float lr);
  void step_host_threaded(float lr);
};

// The decay mask of a flat parameter's shard: every element of every parameter whose
// name matches none of `no_decay`, restricted to [rank*L, (rank+1)*L).
optim::DecayMask shard_decay_mask(const FlatParam& fp, const std::vector<std::string>& no_decay);

}  // namespace shardtrain::fsdp
