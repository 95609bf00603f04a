// read_hf_config / hf_config_json: Hugging Face config.json <-> ModelSpec (see hf_config.h).
// Keys and defaults follow transformers' LlamaConfig, MistralConfig and Qwen2Config and the
// modelling code that reads them (which options give which biases, head_dim, rope_scaling).
#include "shardtrain/model/hf_config.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "shardtrain/model/model_sizes.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::model {
namespace {

using json = nlohmann::json;

// A config.json is a few KB; anything near this is not one.
constexpr uint64_t kMaxConfigBytes = 16 * kMiB;

// What differs between the three architectures.
struct Family {
  const char* architecture;
  const char* model_type;
  int64_t default_kv_heads;  // num_key_value_heads when absent (0 = num_attention_heads)
  bool qkv_bias;             // q, k, v always have biases (Qwen2)
  bool reads_attention_bias; // attention_bias / mlp_bias keys exist (Llama)
  const char* window_key;    // how sliding_window is switched on ("" = no window; "always"; "use_sliding_window")
  double default_rms_eps;
  int64_t default_max_positions;
};

const Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", 0, false, true, "", 1e-6, 2048},
    {"MistralForCausalLM", "mistral", 8, false, false, "always", 1e-6, 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 32, true, false, "use_sliding_window", 1e-6, 32768},
};

const Family* family_of(const std::string& architecture) {
  for (const Family& f : kFamilies)
    if (architecture == f.architecture) return &f;
  return nullptr;
}

std::string known_architectures() {
  std::string s;
  for (const Family& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.architecture);
  return s;
}

// Typed reads of one key, each error naming the file and the key.
class Reader {
 public:
  Reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(path_ + ": " + key + " " + what);
  }
  const json* find(const json& obj, const std::string& key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json* find(const std::string& key) const { return find(j_, key); }

  int64_t required_int(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "is missing (needed to build the model)");
    return positive_int(key, *v);
  }
  int64_t int_or(const std::string& key, int64_t def) const {
    const json* v = find(key);
    return v ? positive_int(key, *v) : def;
  }
  // Any positive int64: how large a size may be is the limits table's to say (check_model_sizes,
  // naming the key), once everything is read.
  int64_t positive_int(const std::string& key, const json& v) const {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) || v.get<int64_t>() <= 0)
      fail(key, "= " + v.dump() + " is not a positive integer (of at most 63 bits)");
    return v.get<int64_t>();
  }
  double number(const std::string& key, const json& v) const {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      fail(key, "= " + v.dump() + " is not a positive number");
    return v.get<double>();
  }
  double number_or(const std::string& key, double def) const {
    const json* v = find(key);
    return v ? number(key, *v) : def;
  }
  bool bool_or(const std::string& key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, "= " + v->dump() + " is not true or false");
    return v->get<bool>();
  }
  // An int, a list of ints, or absent/null (""), kept as JSON text.
  std::string token_ids(const std::string& key) const {
    const json* v = find(key);
    if (!v) return "";
    auto ok = [](const json& x) { return x.is_number_integer() && x.get<int64_t>() >= 0; };
    bool good = ok(*v);
    if (v->is_array()) {
      good = !v->empty();
      for (const json& x : *v) good = good && ok(x);
    }
    if (!good) fail(key, "= " + v->dump() + " is not a token id or a list of token ids");
    return v->dump();
  }

 private:
  const json& j_;
  std::string path_;
};

// A spec's bos/eos text (from config.json, or typed as a deck key) as JSON.
nlohmann::ordered_json token_json(const std::string& text, const char* key) {
  nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  bool ok = v.is_number_integer();
  if (v.is_array()) {
    ok = !v.empty();
    for (const auto& x : v) ok = ok && x.is_number_integer();
  }
  ST_USER_CHECK(ok, "model.", key, " = \"", text, "\" is not a token id or a JSON list of token ids");
  return v;
}

}  // namespace

std::string HfConfig::source_of(const std::string& field) const {
  for (const auto& [f, key] : sources)
    if (f == field) return key;
  return "";
}

std::string hf_config_path(const std::string& dir_or_file) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir_or_file, ec)) return (std::filesystem::path(dir_or_file) / "config.json").string();
  return dir_or_file;
}

bool has_hf_config(const std::string& dir_or_file) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir_or_file, ec))
    return std::filesystem::exists(std::filesystem::path(dir_or_file) / "config.json", ec);
  return std::filesystem::path(dir_or_file).filename() == "config.json";
}

HfConfig read_hf_config(const std::string& dir_or_file) {
  HfConfig c;
  c.path = hf_config_path(dir_or_file);
  const std::string text = read_small_file(c.path, kMaxConfigBytes, "model config");
  check_json_depth(text, kMaxJsonDepth, c.path);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw UserError(c.path + ": not valid JSON (truncated or not a config.json)");
  if (!j.is_object()) throw UserError(c.path + ": not a JSON object (expected a Hugging Face config.json)");
  Reader r(j, c.path);
  auto from = [&](const char* field, const std::string& key, bool given) {
    c.sources.emplace_back(field, given ? key : key + " (default)");
  };

  // The architecture: architectures[0], or model_type when there is no list.
  std::string architecture;
  if (const json* a = r.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      r.fail("architectures", "= " + a->dump() + " is not a list of class names");
    architecture = (*a)[0].get<std::string>();
  } else if (const json* t = r.find("model_type")) {
    if (t->is_string())
      for (const Family& f : kFamilies)
        if (t->get<std::string>() == f.model_type) architecture = f.architecture;
    if (architecture.empty()) r.fail("model_type", "= " + t->dump() + " is not a supported model (" + known_architectures() + ")");
  } else {
    r.fail("architectures", "is missing (expected one of " + known_architectures() + ")");
  }
  const Family* fam = family_of(architecture);
  if (!fam) r.fail("architectures", "= \"" + architecture + "\" is not supported (supported: " + known_architectures() + ")");

  ModelSpec& s = c.spec;
  s.arch = "llama";
  s.hf_architecture = architecture;
  from("arch", "architectures", true);
  from("hf_architecture", "architectures", true);
  s.d_model = r.required_int("hidden_size");
  from("d_model", "hidden_size", true);
  s.d_ff = r.required_int("intermediate_size");
  from("d_ff", "intermediate_size", true);
  s.n_layers = r.required_int("num_hidden_layers");
  from("n_layers", "num_hidden_layers", true);
  s.n_heads = r.required_int("num_attention_heads");
  from("n_heads", "num_attention_heads", true);
  s.vocab_size = r.required_int("vocab_size");
  from("vocab_size", "vocab_size", true);
  s.n_kv_heads = r.int_or("num_key_value_heads", fam->default_kv_heads ? fam->default_kv_heads : s.n_heads);
  from("n_kv_heads", "num_key_value_heads", r.find("num_key_value_heads"));
  // head_dim: given, or hidden_size / num_attention_heads (which must then divide).
  if (r.find("head_dim")) {
    s.head_dim = r.int_or("head_dim", 0);
  } else {
    if (s.d_model % s.n_heads != 0)
      r.fail("hidden_size", "= " + std::to_string(s.d_model) + " is not divisible by num_attention_heads = " +
                                std::to_string(s.n_heads) + " and there is no head_dim");
    s.head_dim = s.d_model / s.n_heads;
  }
  from("head_dim", "head_dim", r.find("head_dim"));
  if (s.n_heads % s.n_kv_heads != 0)
    r.fail("num_key_value_heads", "= " + std::to_string(s.n_kv_heads) + " does not divide num_attention_heads = " +
                                      std::to_string(s.n_heads));
  if (s.head_dim % 2 != 0) r.fail("head_dim", "= " + std::to_string(s.head_dim) + " is odd (rotary embeddings need an even width)");
  s.norm_eps = r.number_or("rms_norm_eps", fam->default_rms_eps);
  from("norm_eps", "rms_norm_eps", r.find("rms_norm_eps"));
  s.tie_embeddings = r.bool_or("tie_word_embeddings", false);
  from("tie_embeddings", "tie_word_embeddings", r.find("tie_word_embeddings"));
  if (const json* act = r.find("hidden_act"))
    if (!act->is_string() || act->get<std::string>() != "silu")
      r.fail("hidden_act", "= " + act->dump() + " is not supported (the llama arch's MLP is SwiGLU: \"silu\")");

  // Biases: Llama's attention_bias (q, k, v, o) and mlp_bias; Qwen2's q, k, v always.
  s.qkv_bias = fam->qkv_bias;
  from("qkv_bias", std::string("architectures (") + architecture + (fam->qkv_bias ? ": q/k/v biases)" : ": no q/k/v-only biases)"), true);
  if (fam->reads_attention_bias) {
    s.attention_bias = r.bool_or("attention_bias", false);
    s.mlp_bias = r.bool_or("mlp_bias", false);
  }
  from("attention_bias", "attention_bias", r.find("attention_bias"));
  from("mlp_bias", "mlp_bias", r.find("mlp_bias"));

  // Rotary embeddings: rope_theta and rope_scaling (transformers v5 writes rope_parameters).
  const json* scaling = r.find("rope_scaling");
  std::string scaling_key = "rope_scaling";
  if (!scaling && r.find("rope_parameters")) {
    scaling = r.find("rope_parameters");
    scaling_key = "rope_parameters";
  }
  s.rope_theta = r.number_or("rope_theta", 10000.0);
  if (scaling && scaling->is_object() && !r.find("rope_theta") && r.find(*scaling, "rope_theta"))
    s.rope_theta = r.number(scaling_key + ".rope_theta", *r.find(*scaling, "rope_theta"));
  from("rope_theta", "rope_theta", r.find("rope_theta"));
  s.max_positions = r.int_or("max_position_embeddings", fam->default_max_positions);
  from("max_positions", "max_position_embeddings", r.find("max_position_embeddings"));
  s.rope_scaling = "default";
  if (scaling) {
    if (!scaling->is_object()) r.fail(scaling_key, "= " + scaling->dump() + " is not an object");
    // transformers: rope_type, else the older "type", else default.
    std::string type_key = scaling_key + ".rope_type";
    const json* type = r.find(*scaling, "rope_type");
    if (!type) {
      type = r.find(*scaling, "type");
      type_key = scaling_key + ".type";
    }
    if (type) {
      if (!type->is_string()) r.fail(type_key, "= " + type->dump() + " is not a string");
      s.rope_scaling = type->get<std::string>();
    }
    auto need = [&](const char* k) -> double {
      const json* v = r.find(*scaling, k);
      if (!v) r.fail(scaling_key + "." + k, "is missing (needed by rope type " + s.rope_scaling + ")");
      return r.number(scaling_key + "." + k, *v);
    };
    if (s.rope_scaling == "linear") {
      s.rope_factor = need("factor");
    } else if (s.rope_scaling == "llama3") {
      s.rope_factor = need("factor");
      s.rope_low_freq_factor = need("low_freq_factor");
      s.rope_high_freq_factor = need("high_freq_factor");
      const json* omp = r.find(*scaling, "original_max_position_embeddings");
      s.rope_original_max_positions =
          omp ? r.positive_int(scaling_key + ".original_max_position_embeddings", *omp) : s.max_positions;
      if (s.rope_high_freq_factor <= s.rope_low_freq_factor)
        r.fail(scaling_key + ".high_freq_factor", "must exceed low_freq_factor");
    } else if (s.rope_scaling != "default") {
      r.fail(type_key, "= \"" + s.rope_scaling + "\" is not supported (supported: default, linear, llama3)");
    }
  }
  for (const char* f : {"rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                        "rope_original_max_positions"})
    from(f, scaling_key, scaling != nullptr);

  // Sliding-window attention: Mistral's sliding_window (null = none); Qwen2's only with
  // use_sliding_window = true.
  const std::string window_mode = fam->window_key;
  bool windowed = window_mode == "always" || (window_mode == "use_sliding_window" && r.bool_or("use_sliding_window", false));
  if (windowed && r.find("sliding_window")) s.sliding_window = r.int_or("sliding_window", 0);
  from("sliding_window", window_mode == "use_sliding_window" ? "use_sliding_window / sliding_window" : "sliding_window",
       r.find("sliding_window") != nullptr);

  s.bos_token_id = r.token_ids("bos_token_id");
  s.eos_token_id = r.token_ids("eos_token_id");
  from("bos_token_id", "bos_token_id", r.find("bos_token_id"));
  from("eos_token_id", "eos_token_id", r.find("eos_token_id"));
  // torch_dtype (transformers v5: dtype): the dtype the weights were saved in.
  for (const char* k : {"torch_dtype", "dtype"}) {
    const json* v = r.find(k);
    if (!v || !s.torch_dtype.empty()) continue;
    if (!v->is_string()) r.fail(k, "= " + v->dump() + " is not a string");
    const std::string t = v->get<std::string>();
    if (t != "float32" && t != "bfloat16" && t != "float16")
      r.fail(k, "= \"" + t + "\" is not supported (float32, bfloat16 or float16)");
    s.torch_dtype = t;
  }
  from("torch_dtype", "torch_dtype", !s.torch_dtype.empty());

  // The training context: the model's whole range unless the deck sets model.seq_len.
  s.seq_len = s.sliding_window > 0 ? std::min(s.max_positions, s.sliding_window) : s.max_positions;
  s.dropout = 0.0;
  // Every size against the deck's limits, named by its key here, before anything is built from it.
  check_model_sizes(s, c.path + ": ", [&](const std::string& field) {
    std::string key = c.source_of(field);
    if (key.size() > 10 && key.compare(key.size() - 10, 10, " (default)") == 0) key.resize(key.size() - 10);
    if (field == "seq_len") return std::string("max_position_embeddings");
    if (field == "rope_original_max_positions") return scaling_key + ".original_max_position_embeddings";
    return key.empty() ? "model." + field : key;
  });
  return c;
}

std::string hf_config_json(const ModelSpec& s, const std::string& torch_dtype) {
  ST_USER_CHECK(s.arch == "llama", "a Hugging Face config.json is written for the llama arch only (this model is ",
                s.arch, ")");
  std::string arch = s.hf_architecture;
  if (arch.empty()) {
    if (s.qkv_bias && !s.attention_bias) arch = "Qwen2ForCausalLM";
    else if (s.sliding_window > 0) arch = "MistralForCausalLM";
    else arch = "LlamaForCausalLM";
  }
  const Family* fam = family_of(arch);
  ST_USER_CHECK(fam != nullptr, "model.hf_architecture = \"", arch, "\" is not supported (", known_architectures(), ")");
  // What each family can express.
  if (fam->qkv_bias)
    ST_USER_CHECK(s.qkv_bias && !s.attention_bias && !s.mlp_bias, arch,
                  " has q/k/v biases and no others: the model needs qkv_bias = true, attention_bias = false, mlp_bias = false");
  else
    ST_USER_CHECK(!s.qkv_bias || s.attention_bias, arch, " cannot have q/k/v biases without an o_proj bias (qkv_bias)");
  if (!fam->reads_attention_bias)
    ST_USER_CHECK(!s.attention_bias && !s.mlp_bias, arch, " has no attention_bias or mlp_bias");
  ST_USER_CHECK(s.sliding_window == 0 || fam->window_key[0] != '\0', arch, " has no sliding_window");

  nlohmann::ordered_json j;
  j["architectures"] = {arch};
  j["model_type"] = fam->model_type;
  j["hidden_size"] = s.d_model;
  j["intermediate_size"] = s.d_ff;
  j["num_hidden_layers"] = s.n_layers;
  j["num_attention_heads"] = s.n_heads;
  j["num_key_value_heads"] = s.n_kv_heads;
  j["head_dim"] = head_dim_of(s);
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = s.max_positions > 0 ? s.max_positions : s.seq_len;
  j["rms_norm_eps"] = s.norm_eps;
  j["rope_theta"] = s.rope_theta;
  if (s.rope_scaling == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.rope_factor}};
  } else if (s.rope_scaling == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_factor},
                         {"low_freq_factor", s.rope_low_freq_factor},
                         {"high_freq_factor", s.rope_high_freq_factor},
                         {"original_max_position_embeddings", s.rope_original_max_positions}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = s.tie_embeddings;
  if (fam->reads_attention_bias) {
    j["attention_bias"] = s.attention_bias;
    j["mlp_bias"] = s.mlp_bias;
  }
  if (std::string(fam->window_key) == "always") {
    j["sliding_window"] = s.sliding_window > 0 ? nlohmann::ordered_json(s.sliding_window) : nlohmann::ordered_json(nullptr);
  } else if (std::string(fam->window_key) == "use_sliding_window") {
    j["use_sliding_window"] = s.sliding_window > 0;
    j["sliding_window"] = s.sliding_window > 0 ? s.sliding_window : j["max_position_embeddings"].get<int64_t>();
    j["max_window_layers"] = s.n_layers;
  }
  j["vocab_size"] = s.vocab_size;
  if (!s.bos_token_id.empty()) j["bos_token_id"] = token_json(s.bos_token_id, "bos_token_id");
  if (!s.eos_token_id.empty()) j["eos_token_id"] = token_json(s.eos_token_id, "eos_token_id");
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::string hf_generation_config_json(const ModelSpec& s) {
  nlohmann::ordered_json j;
  j["_from_model_config"] = true;
  if (!s.bos_token_id.empty()) j["bos_token_id"] = token_json(s.bos_token_id, "bos_token_id");
  if (!s.eos_token_id.empty()) j["eos_token_id"] = token_json(s.eos_token_id, "eos_token_id");
  return j.dump(2) + "\n";
}

}  // namespace shardtrain::model
