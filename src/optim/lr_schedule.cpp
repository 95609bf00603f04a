// LrSchedule: warm-up, then constant, cosine or linear decay to min_lr (nanoGPT's get_lr).
#include "shardtrain/optim/lr_schedule.h"

#include <cmath>

#include "shardtrain/util/error.h"

namespace shardtrain::optim {

LrDecay parse_lr_decay(const std::string& name) {
  if (name == "constant") return LrDecay::Constant;
  if (name == "cosine") return LrDecay::Cosine;
  if (name == "linear") return LrDecay::Linear;
  throw UserError("unknown lr decay '" + name + "': choose constant, cosine or linear");
}

const char* to_string(LrDecay decay) {
  switch (decay) {
    case LrDecay::Constant: return "constant";
    case LrDecay::Cosine: return "cosine";
    case LrDecay::Linear: return "linear";
  }
  return "?";
}

void LrSchedule::validate() const {
  ST_USER_CHECK(lr >= 0.0f, "lr must be >= 0, got ", lr);
  ST_USER_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got ", warmup_steps);
  if (decay == LrDecay::Constant) return;
  ST_USER_CHECK(min_lr >= 0.0f && min_lr <= lr, "min_lr must be in [0, lr = ", lr, "], got ",
                min_lr);
  ST_USER_CHECK(decay_steps > warmup_steps, "decay_steps (", decay_steps,
                ", counted from step 0) must exceed warmup_steps (", warmup_steps, ")");
}

float LrSchedule::lr_at(int64_t step) const {
  ST_CHECK(step >= 0, "lr schedule steps start at 0, got ", step);
  const double peak = lr, floor = min_lr;
  if (step < warmup_steps) return static_cast<float>(peak * double(step + 1) / double(warmup_steps));
  if (decay == LrDecay::Constant) return lr;
  if (step >= decay_steps) return min_lr;
  const double r = double(step - warmup_steps) / double(decay_steps - warmup_steps);
  if (decay == LrDecay::Linear) return static_cast<float>(peak - r * (peak - floor));
  const double pi = 3.14159265358979323846;
  return static_cast<float>(floor + 0.5 * (1.0 + std::cos(pi * r)) * (peak - floor));
}

}  // namespace shardtrain::optim
