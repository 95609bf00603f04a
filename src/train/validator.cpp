// Validator: the validation schedule and the evaluation (each rank its part, one all-reduce).
#include "validator.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <vector>

#include "shardtrain/runtime/exchange.h"

namespace shardtrain::train {

Batch on_device(Batch b, const c10::Device& device) {
  if (device.is_cpu()) return b;
  return {b.inputs.to(device, /*non_blocking=*/true), b.targets.to(device, /*non_blocking=*/true), std::move(b.rows)};
}

void Validator::after_step(int64_t step) {
  if (every_ <= 0 || !(step % every_ == 0 || step == max_steps_) || data_.val_batches() <= 0) return;
  torch::autograd::AutoGradMode no_grad(false);
  const int64_t n = std::min(data_.val_batches(), batches_);
  double sums[3] = {0, 0, 0};  // loss x items, items, correct
  for (int64_t i = 0; i < n; ++i) {
    for (int mb = 0; mb < micro_batches_; ++mb) {
      Batch b = on_device(data_.val_batch(i, mb), device_);
      at::Tensor logits = net_.forward(b.inputs, b.rows).to(at::kFloat);
      at::Tensor flat = logits.reshape({-1, logits.size(-1)});
      at::Tensor tgt = b.targets.reshape({-1});
      if (data_.counted_targets_only()) {  // the mean over counted targets (-100: not counted)
        sums[0] += at::cross_entropy_loss(flat, tgt, {}, at::Reduction::Sum, -100).item<double>();
        sums[1] += static_cast<double>(tgt.ne(-100).sum().item<int64_t>());
        continue;
      }
      sums[0] += at::cross_entropy_loss(flat, tgt).item<double>() * tgt.numel();
      sums[1] += static_cast<double>(tgt.numel());
      if (data_.classification()) sums[2] += flat.argmax(-1).eq(tgt).sum().item<double>();
    }
  }
  std::vector<double> tot(sums, sums + 3);
  runtime::sum(world_, tot, "validate.sum");
  if (tot[1] == 0) return;
  loss_ = tot[0] / tot[1];
  acc_ = data_.classification() ? std::optional<double>(tot[2] / tot[1]) : std::nullopt;
  log_.log_eval({step, *loss_, acc_});
}

}  // namespace shardtrain::train
