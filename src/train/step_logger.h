// StepLogger: decides which steps are logged (every log.every steps, the first and the last,
// and any non-finite one), reduces the window's timings and peaks over the ranks, and writes
// the record (console line + metrics.jsonl through MetricsLog).
#pragma once
#include <mpi.h>

#include <cstdint>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/train/metrics.h"
#include "step_result.h"

namespace shardtrain::train {

struct ThroughputModel {
  int64_t items_per_step = 0;  // tokens (language models) or images per optimizer step
  bool items_are_tokens = true;
  double flops_per_item = 0;   // training FLOPs per item
  double peak_tflops = 0;      // per rank, for MFU: the hardware's (train/peak_flops.h)
  double matmul_tflops = 0;    // per rank, the measured matmul (0 = not measured)
  int64_t optim_state_bytes = 0;  // host optimizer state the tensor counter does not see
};

class StepLogger {
 public:
  StepLogger(MetricsLog& log, fsdp::Engine& engine, ThroughputModel m, int64_t every, int64_t max_steps,
             MPI_Comm world);
  // Collective when the step is logged (all ranks take the same decision).
  void after_step(int64_t step, int64_t tokens_seen, const StepResult& r);
  double last_loss() const { return last_loss_; }  // mean over ranks at the last logged step

 private:
  MetricsLog& log_;
  fsdp::Engine& engine_;
  ThroughputModel m_;
  int64_t every_, max_steps_;
  MPI_Comm world_;
  int size_ = 1;
  double window_s_ = 0, window_comm_ = 0;
  int64_t window_steps_ = 0;
  double last_loss_ = 0;
  fsdp::CommStats bytes_mark_;  // the engine's counters at the last record
};

}  // namespace shardtrain::train
