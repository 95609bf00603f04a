// StepLogger: the logging schedule and the reductions behind one metrics record.
#include "step_logger.h"

#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {
namespace {
double allreduce(double v, MPI_Op op, MPI_Comm c) {
  double out = 0;
  runtime::BlockingRegion region(c, "step.log");
  ST_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, c));
  return out;
}
}  // namespace

StepLogger::StepLogger(MetricsLog& log, fsdp::Engine& engine, ThroughputModel m, int64_t every, int64_t max_steps,
                       MPI_Comm world)
    : log_(log), engine_(engine), m_(m), every_(every), max_steps_(max_steps), world_(world) {
  ST_MPI_CHECK(MPI_Comm_size(world_, &size_));
  bytes_mark_ = engine_.comm_stats();
}

void StepLogger::after_step(int64_t step, int64_t tokens_seen, const StepResult& s) {
  window_s_ += s.seconds;
  window_comm_ += s.comm_seconds;
  ++window_steps_;
  if (!s.outer_synced.empty()) {
    // DiLoCo: which fragments took their outer step after this step (the same on every rank).
    std::string which;
    for (int f : s.outer_synced) which += (which.empty() ? "" : " ") + std::to_string(f);
    log_.log_event(step, "outer_sync", "fragments " + which);
  }
  if (!(step % every_ == 0 || step == max_steps_ || step == 1 || !s.finite)) return;
  // A global loss is already the same bits on every rank; a sum over ranks would round.
  last_loss_ = s.loss_is_global ? s.local_loss : allreduce(s.local_loss, MPI_SUM, world_) / size_;
  const double step_s = allreduce(window_s_ / window_steps_, MPI_MAX, world_);
  const double comm_s = allreduce(window_comm_ / window_steps_, MPI_MAX, world_);
  StepRecord r;
  r.step = step;
  r.max_steps = max_steps_;
  r.loss = last_loss_;
  r.lr = s.lr;
  r.grad_norm = s.grad_norm;
  r.items_per_s = m_.items_per_step / step_s;
  r.items_are_tokens = m_.items_are_tokens;
  r.step_ms = 1e3 * step_s;
  r.tflops = m_.flops_per_item * m_.items_per_step / step_s / size_ / 1e12;
  r.mfu = m_.peak_tflops > 0 ? r.tflops / m_.peak_tflops : 0;
  r.mfu_matmul = m_.matmul_tflops > 0 ? r.tflops / m_.matmul_tflops : 0;
  r.comm_share = step_s > 0 ? comm_s / step_s : 0;
  r.peak_mem_bytes = static_cast<int64_t>(allreduce(static_cast<double>(read_process_memory().hwm_bytes), MPI_MAX, world_));
  r.peak_tensor_bytes = static_cast<int64_t>(
      allreduce(static_cast<double>(alloc_counters().peak_bytes + m_.optim_state_bytes), MPI_MAX, world_));
  // The CUDA caching allocator's max_memory_allocated (-1 on a CPU device: not logged).
  r.peak_device_bytes = static_cast<int64_t>(
      allreduce(static_cast<double>(engine_.memory().device_peak_allocated_bytes), MPI_MAX, world_));
  r.tokens_seen = tokens_seen;
  const fsdp::CommStats cs = engine_.comm_stats();
  r.intra_node_bytes =
      allreduce(static_cast<double>(cs.intra_node_bytes - bytes_mark_.intra_node_bytes), MPI_SUM, world_) / window_steps_;
  r.inter_node_bytes =
      allreduce(static_cast<double>(cs.inter_node_bytes - bytes_mark_.inter_node_bytes), MPI_SUM, world_) / window_steps_;
  bytes_mark_ = cs;
  // The guard's numbers are the same on every rank (agreed over the shard group, replicas equal).
  r.quantized = engine_.options().compression.any();
  r.quant_weight_err = cs.weight_rel_error;
  r.quant_grad_err = cs.grad_rel_error;
  r.quant_fallbacks = cs.weight_fallbacks + cs.grad_fallbacks;
  r.diloco = engine_.options().replica_sync.diloco();
  r.outer_steps = cs.outer_steps;
  r.fragment_syncs = cs.fragment_syncs;
  r.outer_quant_err = cs.outer_rel_error;
  r.outer_fallbacks = cs.outer_fallbacks;
  log_.log_step(r);
  window_s_ = window_comm_ = 0;
  window_steps_ = 0;
}

}  // namespace shardtrain::train
