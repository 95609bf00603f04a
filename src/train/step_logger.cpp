// StepLogger: the logging schedule and the reductions behind one metrics record.
#include "step_logger.h"

#include <algorithm>
#include <vector>

#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {
namespace {
// A logged step's per-rank values, gathered once: the maxima (time, peaks) exactly, and the byte
// counts (integers, below 2^53) summed exactly in any order.
enum Col { kStepS, kCommS, kHwm, kTensor, kDevice, kIntra, kInter, kCols };
std::vector<double> over_ranks(const std::vector<double>& mine, MPI_Comm world) {
  const std::vector<double> all = runtime::all_gather(world, mine, "step.log");
  std::vector<double> out(all.begin(), all.begin() + kCols);
  for (size_t at = kCols; at < all.size(); at += kCols)
    for (int c = 0; c < kCols; ++c) out[c] = c >= kIntra ? out[c] + all[at + c] : std::max(out[c], all[at + c]);
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
  last_loss_ = s.mean_loss;  // agreed in the step
  const fsdp::CommStats cs = engine_.comm_stats();
  const std::vector<double> v = over_ranks(
      {window_s_ / window_steps_, window_comm_ / window_steps_, static_cast<double>(read_process_memory().hwm_bytes),
       static_cast<double>(alloc_counters().peak_bytes + m_.optim_state_bytes),
       static_cast<double>(engine_.memory().device_peak_allocated_bytes),  // -1 on a CPU device: not logged
       static_cast<double>(cs.intra_node_bytes - bytes_mark_.intra_node_bytes),
       static_cast<double>(cs.inter_node_bytes - bytes_mark_.inter_node_bytes)},
      world_);
  const double step_s = v[kStepS], comm_s = v[kCommS];
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
  r.peak_mem_bytes = static_cast<int64_t>(v[kHwm]);
  r.peak_tensor_bytes = static_cast<int64_t>(v[kTensor]);
  r.peak_device_bytes = static_cast<int64_t>(v[kDevice]);  // the CUDA caching allocator's max_memory_allocated
  r.tokens_seen = tokens_seen;
  r.intra_node_bytes = v[kIntra] / window_steps_;
  r.inter_node_bytes = v[kInter] / window_steps_;
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
