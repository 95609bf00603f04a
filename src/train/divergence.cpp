// train.on_nonfinite: the deck's choice and its message.
#include "divergence.h"

#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::train {

NonFinitePolicy nonfinite_policy_from_deck(const deck::Deck& d) {
  NonFinitePolicy p;
  const std::string a = d.get_string("train.on_nonfinite");  // the schema admits only these
  p.action = a == "skip_step" ? NonFinitePolicy::SkipStep : a == "continue" ? NonFinitePolicy::Continue
                                                                             : NonFinitePolicy::Stop;
  p.max_skipped_steps = d.get_int("train.max_skipped_steps");
  return p;
}

std::string describe_nonfinite(int64_t step, double loss, double grad_norm, const NonFinitePolicy& p,
                               int64_t in_a_row, bool give_up, int64_t last_saved_step) {
  std::string s = log::fmt("step ", step, ": loss ", loss, ", gradient norm ", grad_norm, " (not finite): ");
  const std::string last = last_saved_step >= 0 ? log::fmt("step ", last_saved_step) : std::string("none");
  switch (p.action) {
    case NonFinitePolicy::Stop:
      return s + log::fmt("the run diverged; stopping without a checkpoint of this state (train.on_nonfinite = "
                          "\"stop\"), exit ", int(kExitDiverged), ". Last good checkpoint: ", last,
                          ". Lower optimizer.lr, raise lr.warmup_steps or set optimizer.grad_clip, then resume");
    case NonFinitePolicy::SkipStep:
      if (give_up)
        return s + log::fmt(in_a_row, " non-finite steps in a row (train.max_skipped_steps = ", p.max_skipped_steps,
                            "): the run diverged; stopping, exit ", int(kExitDiverged), ". Last good checkpoint: ", last);
      return s + log::fmt("update skipped (train.on_nonfinite = \"skip_step\"; ", in_a_row, " in a row, at most ",
                          p.max_skipped_steps, ")");
    case NonFinitePolicy::Continue:
      return s + "training on (train.on_nonfinite = \"continue\"); non-finite states are not checkpointed";
  }
  return s;
}

bool DivergenceGuard::gives_up(int64_t step, const StepResult& r, double mean_loss, int64_t last_saved_step) {
  in_a_row_ = r.finite ? 0 : in_a_row_ + 1;
  if (r.finite) return false;
  const bool give_up = p_.action == NonFinitePolicy::Stop ||
                       (p_.action == NonFinitePolicy::SkipStep && in_a_row_ >= p_.max_skipped_steps);
  if (rank_ == 0) log::warn(describe_nonfinite(step, mean_loss, r.grad_norm, p_, in_a_row_, give_up, last_saved_step));
  return give_up;
}

}  // namespace shardtrain::train
