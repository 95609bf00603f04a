// Model: the interface every model (GPT-2, Llama-style decoder, ViT) offers to the engine.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/model/costs.h"
#include "shardtrain/model/rows.h"

namespace shardtrain::model {

// How one parameter is initialised. The engine fills each parameter from a generator
// seeded by (run seed, parameter name), so values do not depend on the world size.
struct ParamInit {
  // FanInUniform: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = size(1): torch's
  // kaiming_uniform_(a = sqrt(5)), PEFT's init of lora_A.
  enum class Kind { Normal, Zeros, Ones, Uniform, FanInUniform } kind = Kind::Normal;
  double scale = 0.02;  // Normal: std; Uniform: bound (values in [-scale, scale])
};

// LoRA on a model's linear layers with Hugging Face PEFT's semantics (the deck's [lora]):
// y = W x (+ b) + s * B(A(dropout(x))) on every target, s = alpha / rank (alpha / sqrt(rank)
// with rslora), A [rank, in] Kaiming-uniform, B [out, rank] zero.
struct LoraSpec {
  int64_t rank = 0;                  // 0 = off
  double alpha = 8.0;
  double dropout = 0.0;
  // Module names ("q_proj": every module so named, or a dotted suffix of its path), globs over
  // module paths ("model.layers.1*.self_attn.q_proj"), or "all-linear" (every linear layer of
  // the blocks, as PEFT: not the output layer); empty = the architecture's default_lora_targets.
  std::vector<std::string> targets;
  bool rslora = false;
  // QLoRA (lora.base_dtype = "nf4"): the frozen linear weights of the blocks stored as NF4 in
  // blocks of nf4_block values (0 = in fsdp.param_dtype), double-quantized statistics with
  // nf4_double_quant. How the engine stores the base, recorded so that eval, generate, resume and
  // the merged export use the base the run trained on.
  int64_t nf4_block = 0;
  bool nf4_double_quant = false;
  bool on() const { return rank > 0; }
  bool nf4() const { return on() && nf4_block > 0; }
  double scale() const;
};

// What a fine-tune trains. With LoRA only the adapters and train_also train; train.freeze
// freezes parameters by name in any run (a partial fine-tune). Frozen parameters have
// requires_grad false: the FSDP engine keeps them apart (fsdp::FlatPlan::frozen).
struct Finetune {
  LoraSpec lora;
  std::vector<std::string> freeze;      // train.freeze: parameter-name patterns (util/names.h)
  std::vector<std::string> train_also;  // lora.train_also: parameters trained beside the adapters
  bool any() const { return lora.on() || !freeze.empty(); }
};

struct ModelSpec {
  std::string arch = "gpt2";   // gpt2 | llama | vit
  int64_t vocab_size = 50257;  // gpt2/llama
  int64_t seq_len = 1024;      // gpt2: n_positions; llama: max sequence
  int64_t d_model = 768;
  int64_t n_layers = 12;
  int64_t n_heads = 12;
  int64_t n_kv_heads = 0;      // llama GQA; 0 = n_heads
  int64_t d_ff = 0;            // 0 = arch default (gpt2: 4d; llama: SwiGLU 8d/3 rounded to 64)
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = true;  // gpt2 always ties
  // llama only (Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM options):
  int64_t head_dim = 0;          // width of one attention head; 0 = d_model / n_heads
  bool attention_bias = false;   // biases on q, k, v and o projections (Llama attention_bias)
  bool qkv_bias = false;         // biases on q, k and v only (Qwen2)
  bool mlp_bias = false;         // biases on gate, up and down projections (Llama mlp_bias)
  std::string rope_scaling = "default";  // default | linear | llama3 (transformers' rope_type)
  double rope_factor = 1.0;                 // linear, llama3: the scaling factor
  double rope_low_freq_factor = 1.0;        // llama3
  double rope_high_freq_factor = 4.0;       // llama3
  int64_t rope_original_max_positions = 8192;  // llama3: original_max_position_embeddings
  int64_t max_positions = 0;     // max_position_embeddings (seq_len may not exceed it); 0 = seq_len
  int64_t sliding_window = 0;    // attention window (Mistral, Qwen2); 0 = none; seq_len may not exceed it
  std::string hf_architecture;   // architectures[0] of config.json ("" = LlamaForCausalLM for llama)
  std::string bos_token_id, eos_token_id;  // config.json's values as JSON text ("2", "[128001, 128009]"); "" = none
  std::string torch_dtype;       // config.json's torch_dtype (float32 | bfloat16 | float16); "" = not given
  // vit
  int64_t image_size = 28, patch_size = 7, channels = 1, num_classes = 10;
  double dropout = 0.0;
  // Not an architecture field (no model.<name> key): LoRA and what trains, applied by build_model,
  // recorded with the spec in checkpoints so that eval, generate and resume build the same model.
  Finetune finetune;
};

// Every ModelSpec field by name: the deck's `model.<name>` key and the checkpoint's model_spec
// JSON key. The deck reader and the JSON writer/reader enumerate this list, so a new field is
// added here once (arch is read on its own).
struct SpecField {
  const char* name;
  int64_t ModelSpec::*int_field = nullptr;
  double ModelSpec::*float_field = nullptr;
  bool ModelSpec::*bool_field = nullptr;
  bool images_only = false;  // meaningful only for image models (written to JSON for those only)
  bool llama_only = false;   // meaningful only for arch llama (written to JSON for it only)
  std::string ModelSpec::*string_field = nullptr;
};
const std::vector<SpecField>& spec_fields();

// What forward() takes: token ids [B, T] (language models) or images [B, C, H, W] (classifiers).
enum class InputKind { Tokens, Images };
// spec.arch's input (UserError for an unknown arch).
InputKind input_kind(const ModelSpec& spec);

// A model built on a device (at::kMeta for sharded construction). forward() and the
// wrappable blocks go through fsdp::Hookable so the engine can run code around them.
class Model : public torch::nn::Module, public fsdp::Hookable {
 public:
  explicit Model(ModelSpec spec) : spec_(std::move(spec)) {}
  const ModelSpec& spec() const { return spec_; }

  // Language models: tokens [B, T] int64 -> logits [B, T, V]; with `rows`, each row of the
  // windows as if alone (its own causal attention and positions from 0).
  // ViT: images [B, C, H, W] float -> logits [B, num_classes] (no rows).
  virtual at::Tensor forward(const at::Tensor& input, const Rows& rows) = 0;
  at::Tensor forward(const at::Tensor& input) { return forward(input, Rows{}); }
  // Mean cross-entropy of forward(input) against targets ([B, T] or [B]).
  at::Tensor loss(const at::Tensor& input, const at::Tensor& targets, const Rows& rows = {});
  // Summed cross-entropy of forward(input) over the targets that count: a target of -100 (the
  // cross-entropy's ignore index; instruction data's prompt tokens) adds nothing. For losses
  // weighed by counted tokens across micro-batches and ranks (train's loss mask).
  at::Tensor loss_sum(const at::Tensor& input, const at::Tensor& targets, const Rows& rows = {});
  // Init rule of a parameter, by its qualified name (as in named_parameters()): LoRA's adapters
  // by PEFT's rule, every other parameter by the architecture's init_for.
  ParamInit init_rule(const std::string& name) const;
  // The architecture's own init rules (its parameters, not LoRA's).
  virtual ParamInit init_for(const std::string& name) const = 0;
  // The modules LoRA targets when lora.targets is empty: PEFT's default for the architecture.
  virtual std::vector<std::string> default_lora_targets() const = 0;
  // Module class names the default wrap policy turns into units (e.g. "GPT2Block").
  virtual std::vector<std::string> block_types() const = 0;
  // Parameter-name patterns of parameters that should stay fp32 (norms), for mixed precision.
  virtual std::vector<std::string> norm_param_patterns() const { return {"norm", "ln_"}; }
  // Parameter-name patterns that take no weight decay (biases, norms, embeddings per arch).
  virtual std::vector<std::string> no_decay_patterns() const { return {".bias", "norm", "ln_"}; }
  // Model FLOPs for one training step per token, for MFU: weight_flops_per_token (6N without a
  // fine-tune) + attention.
  virtual double train_flops_per_token(int64_t seq_len) const = 0;
  // Per item of a batch: a sequence's token (language models: train_flops_per_token(seq_len)),
  // or a whole image (ViT: every patch and the class token pass through every block).
  virtual double train_flops_per_item() const { return train_flops_per_token(spec_.seq_len); }
  // What one micro-batch saves for backward and works in (costs.h), next to the forward that
  // allocates it; the memory planner's per-architecture input.
  virtual ActivationBytes activation_bytes(const CostQuery& q) const = 0;

 protected:
  // The weights' FLOPs per token of a training step, over every parameter but the `lookups`
  // (embeddings read by index, not multiplied): 2 per element forward and 2 for the input's
  // gradient, and 2 more for the weight's own gradient when it trains (requires_grad): 6N without
  // a fine-tune, 4 per frozen element, 6 per LoRA adapter element (model/lora.h).
  double weight_flops_per_token(const std::vector<std::string>& lookups) const;
  ModelSpec spec_;
};

// Builds spec.arch on `device`, with spec.finetune applied (model/lora.h: the adapters, and
// requires_grad false on what does not train). On at::kMeta nothing is allocated (the engine
// materialises units itself); on any other device the parameters are filled by
// init_parameters(model, /*seed=*/0) so the model is usable as is.
std::shared_ptr<Model> build_model(const ModelSpec& spec, at::Device device);

// The width of one attention head: head_dim, or d_model / n_heads when it is 0.
int64_t head_dim_of(const ModelSpec& spec);

// The spec with arch defaults filled in (d_ff, n_kv_heads; head_dim and max_positions stay 0
// when derived: head_dim_of, seq_len) after checking that the
// sizes fit together (heads divide d_model, patches tile the image, ...); UserError if not.
ModelSpec resolve_spec(const ModelSpec& spec);

// Named sizes: gpt2-124m, gpt2-355m, gpt2-774m, gpt2-1.5b (HF GPT-2 family),
// llama-7b (Llama-1 7B shape), vit-mnist (28x28x1, 10 classes). UserError if unknown.
ModelSpec preset_spec(const std::string& name);
std::vector<std::string> preset_names();
// The architectures build_model knows, in its table's order ("gpt2", "llama", "vit").
std::vector<std::string> arch_names();

// Number of parameters build_model(spec, ...) registers, computed from the spec alone.
int64_t parameter_count(const ModelSpec& spec);

// Deterministic initialisation by the model's init_for() rules. Each parameter draws
// from its own CPU generator seeded by param_seed(seed, name), so its values depend
// on neither the device nor the order of construction nor the world size.
uint64_t param_seed(uint64_t run_seed, const std::string& name);
void init_parameter(at::Tensor& param, const ParamInit& rule, uint64_t seed);
void init_parameters(Model& model, uint64_t run_seed);

}  // namespace shardtrain::model
