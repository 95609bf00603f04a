// Fused SGD with momentum over a flat fp32 shard, with torch::optim::SGD's semantics
// (L2 weight decay added to the gradient, dampening 0, optional Nesterov).
#pragma once
#include <cstdint>
#include <vector>

#include "shardtrain/optim/decay_mask.h"

namespace shardtrain::optim {

// As for AdamW, the learning rate comes from LrSchedule and is passed to each step.
struct SGDConfig {
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2, only on the elements a DecayMask selects
  bool nesterov = false;
  void validate() const;      // throws UserError on values torch would reject
};

// One SGD step on n elements; step is 1-based. Per element, exactly as torch:
//   d  = g + wd*p                                     (decayed elements; d = g otherwise)
//   b  = step == 1 ? d : momentum*b + d               (only when momentum != 0)
//   d  = nesterov ? d + momentum*b : b                (only when momentum != 0)
//   p -= lr*d
// momentum_buffer may be null when momentum is 0. Kokkos must be running (KokkosScope).
void sgd_step(float* param, const float* grad, float* momentum_buffer, int64_t n,
              const DecayMask& decay, const SGDConfig& cfg, float lr, int64_t step);

// Owns the momentum buffer of one shard (empty when momentum is 0) and counts its steps.
class FusedSGD {
 public:
  FusedSGD(int64_t n, SGDConfig cfg);
  void step(float* param, const float* grad, int64_t n, const DecayMask& decay, float lr);

  int64_t size() const { return n_; }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps);
  const SGDConfig& config() const { return cfg_; }
  float* momentum_buffer() { return momentum_.empty() ? nullptr : momentum_.data(); }

 private:
  SGDConfig cfg_;
  int64_t n_;
  int64_t steps_taken_ = 0;
  std::vector<float> momentum_;
};

}  // namespace shardtrain::optim
