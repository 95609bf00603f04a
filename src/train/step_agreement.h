// The one agreement object of a training step: what every rank decides together in a step, in
// two named exchanges (runtime/exchange.h): the step's batches read on every rank or one error on
// all ("step.data", before forward), and one small all-reduce after backward ("step.agree") that
// carries whether the loss and gradient norm are finite on every rank, the sum of the ranks'
// losses (the logged mean) and the save schedule's inputs (a stop signal on any rank, rank 0's
// clock), so the step boundary decides without another collective.
#pragma once
#include <mpi.h>

#include <functional>
#include <vector>

#include "save_schedule.h"
#include "shardtrain/train/leaf_plan.h"

namespace shardtrain::train {

class StepAgreement {
 public:
  // The schedule outlives this object (its clock is read at each agreement).
  StepAgreement(MPI_Comm world, const SaveSchedule& schedule);
  // Collective: runs read() on every rank; a failure on any is the same error on all.
  void read(const std::function<void()>& read) const;
  // Collective, train.reproducible: the leaves' losses of every rank added in leaf order
  // ("step.leaf_losses", one all-gather; the same bits at any world size).
  double leaf_loss_sum(const std::vector<double>& mine, const LeafPlan& leaves) const;
  // Collective: one all-reduce (an element-wise sum of doubles: the loss's bits are those of a
  // sum of the loss alone, and the counts are exact).
  StepAgreed after_backward(double local_loss, double grad_norm) const;

 private:
  MPI_Comm world_;
  const SaveSchedule& schedule_;
};

}  // namespace shardtrain::train
