// Fused AdamW over a flat fp32 shard: one pass reads param, grad and both moments and writes
// param and moments. Semantics are torch::optim::AdamW's (decoupled weight decay, no amsgrad).
#pragma once
#include <cstdint>
#include <vector>

#include "shardtrain/optim/adamw_math.h"
#include "shardtrain/optim/decay_mask.h"

namespace shardtrain::optim {

// The learning rate is not part of the config: it changes every step and comes from LrSchedule,
// so the caller passes it to each step and there is one source of truth for it.
struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;  // applied only to the elements a DecayMask selects
  void validate() const;       // throws UserError on values torch would reject
};

// One AdamW step on n elements; step is 1-based (the bias corrections use beta^step). Per
// element, torch's update (per-step scalars computed in double, then rounded to float):
//   p  *= 1 - lr*wd                                   (decayed elements only)
//   m   = beta1*m + (1-beta1)*g
//   v   = beta2*v + (1-beta2)*g*g
//   p  -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step) + eps)
// The last line is evaluated with one division instead of torch's two (see adamw.cpp), so the
// results agree with torch to a rounding (~1e-7 relative), not bit for bit.
// Kokkos must be running (KokkosScope). The arrays must not overlap.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const DecayMask& decay, const AdamWConfig& cfg, float lr, int64_t step);

// The per-step scalars of step `step` (1-based), as every implementation uses them.
AdamWScalars adamw_scalars(const AdamWConfig& cfg, float lr, int64_t step);
// A mask's decayed ranges flattened to sorted bounds [b0, e0, b1, e1, ...] for the per-element
// lookup of the device kernel (in_decayed_range); empty when cfg.weight_decay == 0.
std::vector<int64_t> decay_bounds(const DecayMask& decay, const AdamWConfig& cfg);
// The CUDA kernel's loop run on the host (sequential, per-element range lookup): the reference
// the device kernel is tested against, itself tested bit for bit against adamw_step. No Kokkos.
void adamw_step_host_loop(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                          const int64_t* bounds, int64_t n_bounds, const AdamWScalars& s);

// Owns the moments of one shard and counts its steps; the stateless kernel above is what
// checkpointing and CPU offload use directly on their own buffers.
class FusedAdamW {
 public:
  FusedAdamW(int64_t n, AdamWConfig cfg);
  // Takes step number steps_taken()+1.
  void step(float* param, const float* grad, int64_t n, const DecayMask& decay, float lr);

  int64_t size() const { return static_cast<int64_t>(exp_avg_.size()); }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps);  // when restoring moments from a checkpoint
  const AdamWConfig& config() const { return cfg_; }
  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  const float* exp_avg() const { return exp_avg_.data(); }
  const float* exp_avg_sq() const { return exp_avg_sq_.data(); }

 private:
  AdamWConfig cfg_;
  int64_t steps_taken_ = 0;
  std::vector<float> exp_avg_;
  std::vector<float> exp_avg_sq_;
};

}  // namespace shardtrain::optim
