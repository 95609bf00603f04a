// One optimizer step over the global batch: forward/backward per micro-batch, clipping, the
// agreed finiteness test and the update (unless the divergence guard withholds it). What the
// step loop (trainer.cpp) calls once per step.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>

#include "data_source.h"
#include "divergence.h"
#include "step_agreement.h"
#include "shardtrain/train/resume_state.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/model.h"
#include "shardtrain/optim/lr_schedule.h"
#include "shardtrain/train/leaf_plan.h"
#include "step_result.h"

namespace shardtrain::train {

// What a step works on: the engine, the data and the one agreement object (the references
// outlive the loop).
struct StepParts {
  fsdp::Engine& engine;
  fsdp::ShardedOptimizer& optimizer;
  model::Model& net;
  const DataSource& data;
  const optim::LrSchedule& schedule;
  const LeafPlan& leaves;  // train.reproducible: each micro-batch a leaf of the fixed tree
  DivergenceGuard& divergence;
  const StepAgreement& agree;
  int64_t grad_accum = 1;
  uint64_t seed = 0;
  double grad_clip = 0;
  c10::Device device = c10::kCPU;
  int rank = 0, size = 1;
};

// Collective. The step at `at` (its position before the step). Running out of memory is the
// deck's doing, not a bug: a UserError naming what to change (raised on the ranks that ran out).
StepResult train_step(const StepParts& p, const LoopPosition& at);

}  // namespace shardtrain::train
