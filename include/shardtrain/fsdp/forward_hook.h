// Hookable: the seam through which FSDP runs code around a module's forward.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace shardtrain::fsdp {

using UnitBody = std::function<at::Tensor(const at::Tensor&)>;

// Installed by the FSDP engine on the modules that became units. run() calls body at
// least once with `input` (possibly cast to the compute dtype, or under recomputation)
// and returns its result (possibly with autograd hooks attached): typically unshard,
// body(input), reshard, register a pre-backward hook on the output.
class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  virtual at::Tensor run(const at::Tensor& input, const UnitBody& body) = 0;
};

// Mixin for modules that may become FSDP units (transformer blocks, whole models).
// Their forward is written as `return hooked(x, [&](const at::Tensor& x) { ... });`
// where everything the body computes depends on its argument (so that activation
// recomputation and input casting work). Modules whose input is not a single float
// activation (token ids) use `hooked(ids, body)` too: the engine casts only floats.
// Rule for hookable modules and everything below them: read parameters from the
// module's parameter dict at forward time (never cache Tensor members), because the
// engine replaces meta parameters with tensors over its flat buffers.
class Hookable {
 public:
  virtual ~Hookable() = default;
  void set_forward_hook(std::shared_ptr<ForwardHook> hook) { hook_ = std::move(hook); }
  ForwardHook* forward_hook() const { return hook_.get(); }

 protected:
  at::Tensor hooked(const at::Tensor& input, const UnitBody& body) {
    return hook_ ? hook_->run(input, body) : body(input);
  }
  // Older form without an input: no recomputation or input casting is possible.
  at::Tensor hooked(const std::function<at::Tensor()>& body) {
    return hooked(at::Tensor(), [&](const at::Tensor&) { return body(); });
  }

 private:
  std::shared_ptr<ForwardHook> hook_;
};

}  // namespace shardtrain::fsdp
