// What one optimizer step produced: what the loop's components (metrics, divergence guard)
// look at after it.
#pragma once
#include <vector>

namespace shardtrain::train {

struct StepResult {
  double local_loss = 0;    // this rank's mean micro-batch loss (not yet reduced), or, with
  bool loss_is_global = false;  // this set (train.reproducible), the global batch's mean loss
  double grad_norm = 0;     // global, before clipping
  float lr = 0;
  bool finite = true;       // agreed on every rank: loss and gradient norm finite everywhere
  double seconds = 0;       // wall time of the step on this rank
  double comm_seconds = 0;  // exposed communication during it
  std::vector<int> outer_synced;  // DiLoCo: the fragments whose outer step ran after this step
};

}  // namespace shardtrain::train
