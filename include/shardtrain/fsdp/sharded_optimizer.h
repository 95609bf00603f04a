// ShardedOptimizer: the fused AdamW/SGD kernels applied to every flat shard of an Engine.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/decay_mask.h"
#include "shardtrain/optim/sgd.h"

namespace shardtrain::fsdp {

// The optimizers, in choices::kOptimizers' order; parsed once from optimizer.name.
enum class OptimizerKind { AdamW, Sgd };
OptimizerKind parse_optimizer(const std::string& name);  // UserError naming optimizer.name otherwise

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | sgd (choices::kOptimizers)
  optim::AdamWConfig adamw;
  optim::SGDConfig sgd;
  // Parameter-name substrings that take no weight decay (biases, norms).
  std::vector<std::string> no_decay = {".bias", "norm", "ln_"};
  // Host threads for the AdamW step on host shards (CPU offload of a large model: the Kokkos
  // Serial kernel is one core's worth). The shards are cut into chunks, each stepped by the
  // same kernel on its part of the mask, so the result does not depend on this number.
  // 0 = libtorch's intra-op thread count (at::get_num_threads()).
  int host_threads = 1;
  // Run the device implementation (state as tensors beside the masters) even for host shards:
  // how the host tests check the device path's logic (libtorch operations on a CPU master).
  bool state_as_tensors = false;
};

// Owns the optimizer state of this rank's shards (fp32, same length as each shard).
// Weight decay is expressed as element ranges over each flat layout, cut to the shard.
// Where the masters live decides where it steps: host memory (CPU runs, cpu_offload) -> the
// Kokkos kernels on host arrays; a CUDA device -> the state as tensors on that device, AdamW
// by the fused CUDA kernel (adamw_cuda.h; in builds without nvcc, and for SGD, by libtorch
// operations in the kernels' operation order).
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
  // A state array as a tensor of shard_numel fp32 on the masters' device (host state: a view
  // of the kernel's array). Checkpoints copy through it.
  at::Tensor state_tensor(size_t flat_index, size_t state_index);
  // The same as a host pointer; only for state in host memory.
  float* state(size_t flat_index, size_t state_index);
  // True when the state lives in tensors (device masters, or state_as_tensors).
  bool state_in_tensors() const { return on_device_; }
  const optim::DecayMask& decay_mask(size_t flat_index) const { return masks_.at(flat_index); }

 private:
  Engine& engine_;
  OptimizerConfig cfg_;
  OptimizerKind kind_;
  std::vector<FlatParam*> flats_;
  std::vector<optim::DecayMask> masks_;
  std::vector<std::unique_ptr<optim::FusedAdamW>> adamw_;
  std::vector<std::unique_ptr<optim::FusedSGD>> sgd_;
  // Masters on a CUDA device: the state and the decay mask's bounds live there too.
  struct DeviceState {
    at::Tensor exp_avg, exp_avg_sq, bounds;  // adamw; bounds: int64 [b0, e0, b1, e1, ...]
    at::Tensor momentum;                     // sgd with momentum
  };
  bool on_device_ = false;
  int64_t device_steps_ = 0;
  std::vector<DeviceState> dev_;
  void step_on_device(float lr);
  int host_threads() const;
  void step_host_threaded(float lr);
};

// The decay mask of a flat parameter's shard: every element of every parameter whose
// name matches none of `no_decay`, restricted to [rank*L, (rank+1)*L).
optim::DecayMask shard_decay_mask(const FlatParam& fp, const std::vector<std::string>& no_decay);

}  // namespace shardtrain::fsdp
