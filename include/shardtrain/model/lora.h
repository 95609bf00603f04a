// LoRA and frozen parameters on a built model: which linear layers LoRA can target, the adapters
// attached to the targets, and which parameters train (requires_grad) under a Finetune.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/model/layers.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model {

// A linear layer LoRA may target: its module path ("model.layers.0.self_attn.q_proj"), whether
// it is inside a block (what "all-linear" takes), and the layer.
struct LinearSite {
  std::string path;
  bool in_block = false;
  LinearLayer* layer = nullptr;
};
std::vector<LinearSite> linear_sites(Model& m);

// The distinct local names of the model's linear layers in the blocks ("q_proj, k_proj, ...")
// then those outside them: what an error about lora.targets lists.
std::string linear_names(const std::vector<LinearSite>& sites);

// Whether a parameter is a LoRA adapter's (<layer>.lora_A.weight / .lora_B.weight).
bool is_lora_param(const std::string& name);

// Applies spec.finetune to a model built from spec (build_model calls it): attaches LoRA to every
// target and sets requires_grad false on every parameter that does not train. UserError naming
// the deck key for a target, freeze or train_also pattern that matches nothing (listing the
// model's linear layers or some of its parameter names), a rank above min(in, out) of a target,
// train_also without LoRA, and a model left with nothing to train.
void apply_finetune(Model& m, const Finetune& f);

// QLoRA: the parameters a base in NF4 stores as codes: the weights of the blocks' linear layers
// that do not train (as bitsandbytes replaces every nn.Linear but the output layer); embeddings,
// norms, the head, biases and what trains stay in fsdp.param_dtype.
std::vector<std::string> nf4_base_params(Model& m);
// lora.nf4_block's rule (bitsandbytes' block sizes): a power of two from 32 to 4096.
bool valid_nf4_block(int64_t block);

// Elements of the parameters that train (requires_grad): all of them without a finetune; and of
// all parameters, adapters included (parameter_count(spec) counts the architecture's).
int64_t trainable_parameter_count(Model& m);
int64_t total_parameter_count(Model& m);

}  // namespace shardtrain::model
