// What one optimizer step produced: what the loop's components (metrics, divergence guard)
// look at after it.
#pragma once
#include <vector>

namespace shardtrain::train {

// What the ranks agreed on in a step (StepAgreement::after_backward), the same on every rank.
struct StepAgreed {
  bool finite = true;  // loss and gradient norm finite on every rank
  double loss_sum = 0; // the ranks' local losses summed
  int signal = 0;      // the highest stop signal a rank got (0: none)
  bool clock_due = false;  // rank 0's clock: checkpoint.every_minutes has passed
};

struct StepResult {
  double local_loss = 0;    // this rank's mean micro-batch loss (not yet reduced), or, with
  bool loss_is_global = false;  // this set (train.reproducible), the global batch's mean loss
  double grad_norm = 0;     // global, before clipping
  float lr = 0;
  bool finite = true;       // agreed on every rank: loss and gradient norm finite everywhere
  double mean_loss = 0;     // agreed: the loss over the ranks (what the log and the guard print)
  StepAgreed agreed;        // the step's agreement, which the step boundary decides on
  double seconds = 0;       // wall time of the step on this rank
  double comm_seconds = 0;  // exposed communication during it
  std::vector<int> outer_synced;  // DiLoCo: the fragments whose outer step ran after this step
};

}  // namespace shardtrain::train
