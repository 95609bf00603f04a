// train_step: the body of one optimizer step (train_step.h).
#include "train_step.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "fault_hook.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/timer.h"
#include "validator.h"

namespace shardtrain::train {
namespace {

// A step that runs out of memory is the deck's doing (batch, sequence, model, strategy), not a
// bug: one line naming what to change, exit 2, instead of a library trace and exit 1. It is
// raised on the ranks that ran out only, so the job aborts (the others wait in a collective).
template <typename F>
auto out_of_memory_is_user_error(int64_t step, F&& fn) -> decltype(fn()) {
  auto hint = [&](const std::string& what) {
    return UserError(log::fmt("step ", step, ": out of memory (", what.substr(0, what.find('\n')),
                              "): lower train.micro_batch (raise train.grad_accum to keep the global batch), "
                              "model.seq_len or the model size, or shard more (parallel.strategy = full_shard, "
                              "fsdp.activation_checkpointing = true); `shardtrain plan DECK --ranks N` estimates "
                              "the peak per rank"));
  };
  try {
    return fn();
  } catch (const std::bad_alloc& e) {
    throw hint(e.what());
  } catch (const c10::OutOfMemoryError& e) {
    throw hint(e.what());
  } catch (const c10::Error& e) {
    const std::string m = e.what();
    if (m.find("can't allocate memory") == std::string::npos && m.find("out of memory") == std::string::npos) throw;
    throw hint(m);
  }
}

StepResult run_step(const StepParts& p, const LoopPosition& at) {
  StepResult r;
  Timer step_timer;
  fsdp::Engine& engine = p.engine;
  const LeafPlan& leaves = p.leaves;
  const bool masked = p.data.counted_targets_only();
  const double comm_before = engine.memory().exposed_comm_seconds;
  r.lr = p.schedule.lr_at(at.step);
  engine.zero_grad();
  // Summed on the device: reading each micro-batch's loss would stall the host (and with
  // it the next micro-batch's launches) on every micro-batch.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(p.device));
  // The step's micro-batches read up front, in one agreement: an id >= vocab_size on any rank
  // is one UserError (file, offset) on every rank.
  std::vector<Batch> batches(static_cast<size_t>(p.grad_accum));
  int64_t counted = 0;  // instruction data: the global batch's counted targets
  p.agree.read([&] {
    for (int mb = 0; mb < p.grad_accum; ++mb) batches[mb] = p.data.train_batch(at.cursor, mb);
    if (masked) counted = p.data.counted_targets(at.cursor);
  });
  // Reproducible: each micro-batch is a leaf; its loss is scaled by 1 / leaves (the engine
  // sums), its dropout keyed by the leaf, and the losses summed in leaf order.
  const double scale = static_cast<double>(leaves.on ? leaves.leaves : p.grad_accum);
  // A loss mask: the step's loss is the mean over the counted targets of the whole global
  // batch, so each micro-batch's summed loss is divided by the global count N, whatever its
  // own count. The engine averages over the world's ranks in the default mode (multiply by
  // the world size to undo that) and sums in the reproducible mode (leaf sum / N, the same
  // bits at every world size). N = 0 (no counted target): loss 0, gradient 0.
  const double per_counted = 1.0 / static_cast<double>(std::max<int64_t>(counted, 1));
  const double mask_scale = leaves.on ? per_counted : static_cast<double>(p.size) * per_counted;
  std::vector<at::Tensor> leaf_losses;
  for (int mb = 0; mb < p.grad_accum; ++mb) {
    engine.set_last_micro_batch(mb == p.grad_accum - 1);
    if (leaves.on) seed_leaf_generator(p.seed, at.step, leaves.leaf_of(mb), p.device);
    const Batch b = on_device(std::move(batches[mb]), p.device);
    if (masked) {
      const at::Tensor sum = p.net.loss_sum(b.inputs, b.targets, b.rows);
      (sum * mask_scale).backward();
      if (leaves.on) leaf_losses.push_back(sum.detach().to(at::kDouble));
      else loss_sum.add_(sum.detach().to(at::kDouble));
      continue;
    }
    const at::Tensor mean = p.net.loss(b.inputs, b.targets);
    at::Tensor loss = mean / scale;
    loss.backward();
    if (leaves.on) leaf_losses.push_back(mean.detach().to(at::kDouble));
    else loss_sum.add_(loss.detach().to(at::kDouble));
  }
  if (leaves.on) {
    const at::Tensor l = at::stack(leaf_losses).cpu();
    const std::vector<double> mine(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
    // Masked: the leaves' summed losses added in leaf order, over N.
    const double sum = p.agree.leaf_loss_sum(mine, leaves);
    r.local_loss = masked ? sum * per_counted : sum / static_cast<double>(leaves.leaves);
    r.loss_is_global = true;
  } else if (masked) {
    // The step logger averages over ranks: this rank's share times the world size.
    r.local_loss = loss_sum.item<double>() * static_cast<double>(p.size) * per_counted;
  } else {
    r.local_loss = loss_sum.item<double>();
  }
  fault_pause("mid_step", at.step + 1, p.rank);
  r.grad_norm = engine.clip_grad_norm(p.grad_clip);
  // Decided by every rank together, before the update could carry NaN into the weights; the same
  // exchange sums the losses and carries the save schedule's inputs to the step boundary.
  r.agreed = p.agree.after_backward(r.local_loss, r.grad_norm);
  r.finite = r.agreed.finite;
  // A global loss is already the same bits on every rank; the sum over ranks would round it.
  r.mean_loss = r.loss_is_global ? r.local_loss : r.agreed.loss_sum / p.size;
  if (p.divergence.apply_update(r.finite)) p.optimizer.step(r.lr);
  // DiLoCo: the fragments due after this inner step take their outer step (nothing under
  // every_step). On the step count, whether or not the update was applied, so the cycle does not
  // depend on the divergence guard.
  fault_pause("outer_sync", at.step + 1, p.rank);
  r.outer_synced = engine.sync_replicas(at.step + 1);
  r.seconds = step_timer.seconds();
  r.comm_seconds = engine.memory().exposed_comm_seconds - comm_before;
  return r;
}

}  // namespace

StepResult train_step(const StepParts& p, const LoopPosition& at) {
  return out_of_memory_is_user_error(at.step + 1, [&] { return run_step(p, at); });
}

}  // namespace shardtrain::train
