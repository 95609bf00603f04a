// Hookable: the seam through which FSDP runs code around a module's forward.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace shardtrain::fsdp {

// Installed by the FSDP engine on the modules that became units. run() must call
// body() exactly once and return its result (possibly with autograd hooks attached):
// typically unshard, body(), reshard, register a pre-backward hook on the output.
class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  virtual at::Tensor run(const std::function<at::Tensor()>& body) = 0;
};

// Mixin for modules that may become FSDP units (transformer blocks, whole models).
// Their forward is written as `return hooked([&] { ...compute... });`.
// Rule for hookable modules and everything below them: read parameters from the
// module's parameter dict at forward time (never cache Tensor members), because the
// engine replaces meta parameters with views of its flat buffers.
class Hookable {
 public:
  virtual ~Hookable() = default;
  void set_forward_hook(std::shared_ptr<ForwardHook> hook) { hook_ = std::move(hook); }
  ForwardHook* forward_hook() const { return hook_.get(); }

 protected:
  at::Tensor hooked(const std::function<at::Tensor()>& body) { return hook_ ? hook_->run(body) : body(); }

 private:
  std::shared_ptr<ForwardHook> hook_;
};

}  // namespace shardtrain::fsdp
