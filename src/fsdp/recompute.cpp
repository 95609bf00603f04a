// RecomputeNode: an autograd node that re-runs a unit's forward during backward.
#include "recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace shardtrain::fsdp {
namespace {

struct RecomputeNode : torch::autograd::Node {
  UnitBody body;
  at::Tensor input;  // detached
  bool input_requires_grad = false;

  std::string name() const override { return "shardtrain::RecomputeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor x = input.detach();
    if (input_requires_grad) x.requires_grad_(true);
    at::Tensor out;
    {
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
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace shardtrain::fsdp
