// What the step loop does when a step's loss or gradient norm is not finite
// (train.on_nonfinite); whether it is, every rank alike, is the step's agreement (step_agreement.h).
#pragma once
#include <cstdint>
#include <string>

#include "shardtrain/deck/deck.h"
#include "step_result.h"

namespace shardtrain::train {

struct NonFinitePolicy {
  enum Action { Stop, SkipStep, Continue } action = Stop;
  int64_t max_skipped_steps = 10;  // SkipStep: give up after this many non-finite steps in a row
};
NonFinitePolicy nonfinite_policy_from_deck(const deck::Deck& d);

// The warning line for a non-finite step (what happened, what the policy does about it, and
// which checkpoint is the last good one).
std::string describe_nonfinite(int64_t step, double loss, double grad_norm, const NonFinitePolicy& p,
                               int64_t in_a_row, bool give_up, int64_t last_saved_step);

// The policy applied step by step: whether a step's update is applied, and whether the run
// gives up after it (a warning on rank 0 either way for a non-finite step).
class DivergenceGuard {
 public:
  DivergenceGuard(NonFinitePolicy p, int rank) : p_(p), rank_(rank) {}
  bool apply_update(bool finite) const { return finite || p_.action == NonFinitePolicy::Continue; }
  // After the step is logged (mean_loss: over the ranks). No communication: `r.finite` is agreed.
  bool gives_up(int64_t step, const StepResult& r, double mean_loss, int64_t last_saved_step);

 private:
  NonFinitePolicy p_;
  int rank_;
  int64_t in_a_row_ = 0;
};

}  // namespace shardtrain::train
