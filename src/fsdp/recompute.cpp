// RecomputeNode: an autograd node that re-runs a unit's forward during backward.
#include "recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/Context.h>
#include <mutex>

namespace shardtrain::fsdp {
namespace {

// The default generator's state of a device, read and written under its lock.
at::Tensor generator_state(const c10::Device& d) {
  at::Generator g = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void set_generator_state(const c10::Device& d, const at::Tensor& state) {
  at::Generator g = at::globalContext().defaultGenerator(d);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

struct RecomputeNode : torch::autograd::Node {
  UnitBody body;
  at::Tensor input;  // detached
  bool input_requires_grad = false;
  // The generator as the first forward found it: the recomputation draws the same dropout
  // masks (else backward differentiates a forward that never ran), and the generator's own
  // sequence continues afterwards as if nothing had been redrawn.
  c10::Device device = c10::kCPU;
  at::Tensor rng_before;

  std::string name() const override { return "shardtrain::RecomputeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor x = input.detach();
    if (input_requires_grad) x.requires_grad_(true);
    at::Tensor out;
    {
      const at::Tensor now = generator_state(device);
      set_generator_state(device, rng_before);
      struct Restore {
        const c10::Device& d;
        const at::Tensor& s;
        ~Restore() { set_generator_state(d, s); }
      } restore{device, now};
      torch::autograd::AutoGradMode enable(true);
      out = body(x);
    }
    // Nested backward: parameters' AccumulateGrad nodes (and the engine's hooks on
    // them) run inside it; the input's gradient lands in x.grad().
    torch::autograd::backward({out}, {grads[0]}, /*keep_graph=*/false, /*create_graph=*/false);
    return {input_requires_grad ? x.grad() : at::Tensor()};
  }
};

}  // namespace

at::Tensor run_with_recompute(const at::Tensor& input, const UnitBody& body) {
  const c10::Device device = input.device();
  const at::Tensor rng_before = torch::autograd::GradMode::is_enabled() ? generator_state(device) : at::Tensor();
  at::Tensor out;
  {
    torch::autograd::AutoGradMode disable(false);
    out = body(input);
  }
  if (!torch::autograd::GradMode::is_enabled()) return out;
  auto node = std::shared_ptr<RecomputeNode>(new RecomputeNode(), torch::autograd::deleteNode);
  node->body = body;
  node->input = input.detach();
  node->input_requires_grad = input.requires_grad();
  node->device = device;
  node->rng_before = rng_before;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace shardtrain::fsdp
