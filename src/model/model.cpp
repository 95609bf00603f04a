// Model-layer entry points: build_model, spec resolution and presets, parameter counts,
// deterministic initialisation and the default cross-entropy loss.
#include "shardtrain/model/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include "shardtrain/model/gpt2.h"
#include "shardtrain/model/llama.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/model_sizes.h"
#include "shardtrain/model/vit.h"
#include "shardtrain/util/error.h"

namespace shardtrain::model {

at::Tensor Model::loss(const at::Tensor& input, const at::Tensor& targets, const Rows& rows) {
  at::Tensor logits = forward(input, rows);
  // fp32 softmax whatever the compute dtype; [B, T, V] flattens to [B*T, V].
  logits = logits.to(at::kFloat);
  if (logits.dim() == 3) return at::cross_entropy_loss(logits.flatten(0, 1), targets.flatten());
  return at::cross_entropy_loss(logits, targets);
}

int64_t Rows::longest() const {
  int64_t m = 0;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) m = std::max(m, cu_seqlens[i] - cu_seqlens[i - 1]);
  return m;
}

ParamInit Model::init_rule(const std::string& name) const {
  // PEFT's reset_lora_parameters: lora_A kaiming_uniform_(a = sqrt(5)), lora_B zeros.
  static const std::string a = ".lora_A.weight";
  if (is_lora_param(name)) {
    const bool is_a = name.compare(name.size() - a.size(), a.size(), a) == 0;
    return {is_a ? ParamInit::Kind::FanInUniform : ParamInit::Kind::Zeros, 0.0};
  }
  return init_for(name);
}

double Model::weight_flops_per_token(const std::vector<std::string>& lookups) const {
  double flops = 0;
  for (const auto& p : named_parameters(/*recurse=*/true)) {
    if (std::find(lookups.begin(), lookups.end(), p.key()) != lookups.end()) continue;
    flops += (p.value().requires_grad() ? 6.0 : 4.0) * static_cast<double>(p.value().numel());
  }
  return flops;
}

at::Tensor Model::loss_sum(const at::Tensor& input, const at::Tensor& targets, const Rows& rows) {
  at::Tensor logits = forward(input, rows).to(at::kFloat);
  if (logits.dim() == 3) logits = logits.flatten(0, 1);
  return at::cross_entropy_loss(logits, targets.flatten(), {}, at::Reduction::Sum, /*ignore_index=*/-100);
}

namespace {
// One row per architecture: everything outside its own files that knows it exists.
struct Arch {
  const char* name;
  InputKind input;
  int64_t (*parameter_count)(const ModelSpec& resolved);
  std::shared_ptr<Model> (*build)(const ModelSpec& resolved, at::Device device);
};

template <typename M>
std::shared_ptr<Model> make(const ModelSpec& s, at::Device device) {
  return std::make_shared<M>(s, device);
}

const Arch kArchTable[] = {
    {"gpt2", InputKind::Tokens, GPT2::parameter_count, make<GPT2>},
    {"llama", InputKind::Tokens, Llama::parameter_count, make<Llama>},
    {"vit", InputKind::Images, ViT::parameter_count, make<ViT>},
};

const Arch& arch_of(const std::string& name) {
  const auto& table = kArchTable;
  std::string known;
  for (const Arch& a : table) {
    if (name == a.name) return a;
    known += (known.empty() ? "" : &a == std::end(table) - 1 ? " or " : ", ") + std::string(a.name);
  }
  throw UserError("unknown model arch '" + name + "' (expected " + known + ")");
}
}  // namespace

std::vector<std::string> arch_names() {
  std::vector<std::string> out;
  for (const Arch& a : kArchTable) out.push_back(a.name);
  return out;
}

ModelSpec resolve_spec(const ModelSpec& spec) {
  ModelSpec s = spec;
  arch_of(s.arch);  // UserError for an unknown arch
  ST_USER_CHECK(s.d_model > 0 && s.n_layers > 0 && s.n_heads > 0, s.arch,
                ": d_model, n_layers and n_heads must be positive");
  ST_USER_CHECK(s.head_dim >= 0, s.arch, ": head_dim must be >= 0 (0 = d_model / n_heads)");
  check_model_sizes(s);  // before any size is multiplied (util/model_limits.h)
  // head_dim and max_positions stay 0 when derived (head_dim_of, seq_len), so a caller that
  // changes d_model or seq_len of a resolved spec and resolves it again gets them anew.
  if (s.head_dim == 0 || s.arch != "llama") {
    ST_USER_CHECK(s.d_model % s.n_heads == 0, s.arch, ": d_model ", s.d_model,
                  " is not divisible by n_heads ", s.n_heads);
    ST_USER_CHECK(s.head_dim == 0 || s.head_dim == s.d_model / s.n_heads, s.arch,
                  " has no head_dim of its own (head_dim must be 0 or d_model / n_heads)");
  }
  ST_USER_CHECK(s.dropout >= 0.0 && s.dropout < 1.0, s.arch, ": dropout must be in [0, 1)");
  if (s.rope_scaling.empty()) s.rope_scaling = "default";
  if (s.arch == "llama") {
    if (s.n_kv_heads == 0) s.n_kv_heads = s.n_heads;
    ST_USER_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0, "llama: n_kv_heads ",
                  s.n_kv_heads, " must divide n_heads ", s.n_heads);
    ST_USER_CHECK(head_dim_of(s) % 2 == 0, "llama: rotary embeddings need an even head_dim, got ", head_dim_of(s));
    // SwiGLU keeps the parameter count of a 4d MLP: 2/3 of 4d, rounded up to 64.
    if (s.d_ff == 0) s.d_ff = ((8 * s.d_model + 2) / 3 + 63) / 64 * 64;
    ST_USER_CHECK(s.rope_scaling == "default" || s.rope_scaling == "linear" || s.rope_scaling == "llama3",
                  "llama: rope_scaling '", s.rope_scaling, "' is not supported (default, linear or llama3)");
    if (s.rope_scaling != "default")
      ST_USER_CHECK(s.rope_factor > 0, "llama: rope_factor must be positive, got ", s.rope_factor);
    if (s.rope_scaling == "llama3")
      ST_USER_CHECK(s.rope_high_freq_factor > s.rope_low_freq_factor && s.rope_low_freq_factor > 0 &&
                        s.rope_original_max_positions > 0,
                    "llama: rope_scaling llama3 needs 0 < rope_low_freq_factor < rope_high_freq_factor and "
                    "rope_original_max_positions > 0");
    ST_USER_CHECK(s.sliding_window >= 0, "llama: sliding_window must be >= 0 (0 = none)");
    // The window is not implemented: with seq_len within it, windowed attention is full attention.
    ST_USER_CHECK(s.sliding_window == 0 || s.seq_len <= s.sliding_window, "llama: seq_len ", s.seq_len,
                  " exceeds the model's sliding_window ", s.sliding_window,
                  " (windowed attention is not implemented; use a seq_len within the window)");
    ST_USER_CHECK(s.max_positions == 0 || s.seq_len <= s.max_positions, "llama: seq_len ", s.seq_len,
                  " exceeds the model's max_positions (max_position_embeddings) ", s.max_positions);
  } else {
    ST_USER_CHECK(s.n_kv_heads == 0 || s.n_kv_heads == s.n_heads, s.arch,
                  " has no grouped-query attention (n_kv_heads must be 0 or n_heads)");
    s.n_kv_heads = s.n_heads;
    if (s.d_ff == 0) s.d_ff = 4 * s.d_model;
    ST_USER_CHECK(!s.attention_bias && !s.qkv_bias && !s.mlp_bias && s.rope_scaling == "default" &&
                      s.sliding_window == 0,
                  s.arch, " has no attention_bias, qkv_bias, mlp_bias, rope_scaling or sliding_window option");
  }
  if (s.arch == "vit") {
    ST_USER_CHECK(s.patch_size > 0 && s.image_size % s.patch_size == 0, "vit: patch_size ",
                  s.patch_size, " does not tile image_size ", s.image_size);
    ST_USER_CHECK(s.channels > 0 && s.num_classes > 0, "vit: channels and num_classes must be positive");
  } else {
    ST_USER_CHECK(s.vocab_size > 0 && s.seq_len > 0, s.arch, ": vocab_size and seq_len must be positive");
  }
  ST_USER_CHECK(s.d_ff > 0, s.arch, ": d_ff must be positive");
  return s;
}

namespace {
ModelSpec gpt2_preset(int64_t layers, int64_t d, int64_t heads) {
  ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 50257;
  s.seq_len = 1024;
  s.n_layers = layers;
  s.d_model = d;
  s.n_heads = heads;
  return s;
}

const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> table = [] {
    std::map<std::string, ModelSpec> t;
    t["gpt2-124m"] = gpt2_preset(12, 768, 12);
    t["gpt2-355m"] = gpt2_preset(24, 1024, 16);
    t["gpt2-774m"] = gpt2_preset(36, 1280, 20);
    t["gpt2-1.5b"] = gpt2_preset(48, 1600, 25);
    ModelSpec llama;
    llama.arch = "llama";
    llama.vocab_size = 32000;
    llama.seq_len = 2048;
    llama.d_model = 4096;
    llama.n_layers = 32;
    llama.n_heads = 32;
    llama.d_ff = 11008;
    llama.norm_eps = 1e-6;
    llama.tie_embeddings = false;
    t["llama-7b"] = llama;
    ModelSpec vit;
    vit.arch = "vit";
    vit.image_size = 28;
    vit.patch_size = 7;
    vit.channels = 1;
    vit.num_classes = 10;
    vit.d_model = 192;
    vit.n_layers = 6;
    vit.n_heads = 3;
    vit.norm_eps = 1e-6;
    t["vit-mnist"] = vit;
    return t;
  }();
  return table;
}
}  // namespace

ModelSpec preset_spec(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const auto& entry : presets()) known += (known.empty() ? "" : ", ") + entry.first;
    throw UserError("unknown model preset '" + name + "' (known: " + known + ")");
  }
  return it->second;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& entry : presets()) names.push_back(entry.first);
  return names;
}


const std::vector<SpecField>& spec_fields() {
  static const std::vector<SpecField> f = {
      {"vocab_size", &ModelSpec::vocab_size},   {"seq_len", &ModelSpec::seq_len},
      {"d_model", &ModelSpec::d_model},         {"n_layers", &ModelSpec::n_layers},
      {"n_heads", &ModelSpec::n_heads},         {"n_kv_heads", &ModelSpec::n_kv_heads},
      {"d_ff", &ModelSpec::d_ff},               {"norm_eps", nullptr, &ModelSpec::norm_eps},
      {"rope_theta", nullptr, &ModelSpec::rope_theta},
      {"tie_embeddings", nullptr, nullptr, &ModelSpec::tie_embeddings},
      {"dropout", nullptr, &ModelSpec::dropout},
      {"image_size", &ModelSpec::image_size, nullptr, nullptr, true},
      {"patch_size", &ModelSpec::patch_size, nullptr, nullptr, true},
      {"channels", &ModelSpec::channels, nullptr, nullptr, true},
      {"num_classes", &ModelSpec::num_classes, nullptr, nullptr, true},
      {"head_dim", &ModelSpec::head_dim, nullptr, nullptr, false, true},
      {"attention_bias", nullptr, nullptr, &ModelSpec::attention_bias, false, true},
      {"qkv_bias", nullptr, nullptr, &ModelSpec::qkv_bias, false, true},
      {"mlp_bias", nullptr, nullptr, &ModelSpec::mlp_bias, false, true},
      {"rope_scaling", nullptr, nullptr, nullptr, false, true, &ModelSpec::rope_scaling},
      {"rope_factor", nullptr, &ModelSpec::rope_factor, nullptr, false, true},
      {"rope_low_freq_factor", nullptr, &ModelSpec::rope_low_freq_factor, nullptr, false, true},
      {"rope_high_freq_factor", nullptr, &ModelSpec::rope_high_freq_factor, nullptr, false, true},
      {"rope_original_max_positions", &ModelSpec::rope_original_max_positions, nullptr, nullptr, false, true},
      {"max_positions", &ModelSpec::max_positions, nullptr, nullptr, false, true},
      {"sliding_window", &ModelSpec::sliding_window, nullptr, nullptr, false, true},
      {"hf_architecture", nullptr, nullptr, nullptr, false, true, &ModelSpec::hf_architecture},
      {"bos_token_id", nullptr, nullptr, nullptr, false, true, &ModelSpec::bos_token_id},
      {"eos_token_id", nullptr, nullptr, nullptr, false, true, &ModelSpec::eos_token_id},
      {"torch_dtype", nullptr, nullptr, nullptr, false, true, &ModelSpec::torch_dtype},
  };
  return f;
}

int64_t head_dim_of(const ModelSpec& spec) { return spec.head_dim > 0 ? spec.head_dim : spec.d_model / spec.n_heads; }

InputKind input_kind(const ModelSpec& spec) { return arch_of(spec.arch).input; }

int64_t parameter_count(const ModelSpec& spec) {
  const ModelSpec s = resolve_spec(spec);
  return arch_of(s.arch).parameter_count(s);
}

std::shared_ptr<Model> build_model(const ModelSpec& spec, at::Device device) {
  const ModelSpec s = resolve_spec(spec);
  std::shared_ptr<Model> model = arch_of(s.arch).build(s, device);
  apply_finetune(*model, s.finetune);
  if (!device.is_meta()) init_parameters(*model, /*run_seed=*/0);
  return model;
}

uint64_t param_seed(uint64_t run_seed, const std::string& name) {
  // FNV-1a over the name, then a splitmix64 finaliser mixing in the run seed.
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = h ^ (run_seed + 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void init_parameter(at::Tensor& param, const ParamInit& rule, uint64_t seed) {
  at::NoGradGuard no_grad;
  if (param.is_meta()) return;
  using K = ParamInit::Kind;
  // Drawn on the CPU in fp32 and copied, so values are identical on every device and dtype.
  at::Tensor values = at::empty(param.sizes(), at::TensorOptions().dtype(at::kFloat));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  switch (rule.kind) {
    case K::Normal: values.normal_(0.0, rule.scale, gen); break;
    case K::Uniform: values.uniform_(-rule.scale, rule.scale, gen); break;
    case K::Zeros: values.zero_(); break;
    case K::Ones: values.fill_(1.0); break;
    case K::FanInUniform: {
      const double bound = 1.0 / std::sqrt(static_cast<double>(values.dim() > 1 ? values.size(1) : 1));
      values.uniform_(-bound, bound, gen);
      break;
    }
  }
  param.copy_(values);
}

void init_parameters(Model& model, uint64_t run_seed) {
  for (auto& item : model.named_parameters()) {
    at::Tensor& p = item.value();
    init_parameter(p, model.init_rule(item.key()), param_seed(run_seed, item.key()));
  }
}

}  // namespace shardtrain::model
