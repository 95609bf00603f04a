// LrSchedule: the learning rate as a pure function of the 0-based training step.
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain::optim {

enum class LrDecay { Constant, Cosine, Linear };

// Parses "constant", "cosine" or "linear"; anything else is a UserError naming the choices.
LrDecay parse_lr_decay(const std::string& name);
const char* to_string(LrDecay decay);

// nanoGPT's get_lr with llm.c's warm-up, for step = 0, 1, 2, ...:
//   step <  warmup_steps:  lr * (step+1) / warmup_steps          (reaches lr at warmup_steps-1)
//   constant:              lr
//   step >= decay_steps:   min_lr
//   otherwise, with r = (step - warmup_steps) / (decay_steps - warmup_steps):
//     cosine:              min_lr + 0.5*(1 + cos(pi*r)) * (lr - min_lr)
//     linear:              lr - r * (lr - min_lr)
// decay_steps counts from step 0, warm-up included (nanoGPT's lr_decay_iters); it is usually the
// length of the run. The optimizers' bias corrections use step+1.
struct LrSchedule {
  LrDecay decay = LrDecay::Cosine;
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // ignored by Constant

  void validate() const;  // throws UserError
  float lr_at(int64_t step) const;
};

}  // namespace shardtrain::optim
