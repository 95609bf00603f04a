// PEFT adapter_config.json: read, checked and written (see peft.h).
#include "shardtrain/ckpt/peft.h"

#include <nlohmann/json.hpp>

#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::ckpt {

PeftConfig read_peft_config(const std::string& dir) {
  const std::string path = dir + "/" + kPeftConfigFile;
  const std::string text = read_small_file(path, 16 * kMiB, "PEFT adapter config");
  check_json_depth(text, kMaxJsonDepth, path);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& key, const std::string& why) { return UserError(path + ": " + key + " " + why); };
  if (!j.is_object()) throw bad("(the file)", "is not a JSON object");
  const std::string type = j.value("peft_type", std::string());
  if (type != "LORA") throw bad("peft_type", "is \"" + type + "\": only LoRA adapters (\"LORA\") are read");
  PeftConfig c;
  auto number = [&](const char* key, double lo, double hi) -> double {
    const nlohmann::json& v = j[key];
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
      throw bad(key, "= " + v.dump() + " is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v.get<double>();
  };
  if (j.contains("r")) {
    if (!j["r"].is_number_integer() || j["r"].get<int64_t>() < 1 || j["r"].get<int64_t>() > (1 << 16))
      throw bad("r", "= " + j["r"].dump() + " is not a rank in [1, 65536]");
    c.r = j["r"].get<int64_t>();
  }
  if (j.contains("lora_alpha")) c.lora_alpha = number("lora_alpha", 1e-12, 1e6);
  if (j.contains("lora_dropout")) c.lora_dropout = number("lora_dropout", 0, 0.999999);
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) throw bad(key, "is not true or false");
    return j[key].get<bool>();
  };
  c.use_rslora = flag("use_rslora");
  auto names = [&](const char* key, std::vector<std::string>& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (j[key].is_string())
      throw bad(key, "is a regular expression (\"" + j[key].get<std::string>() +
                         "\"); list the module names instead (lora.targets takes names, dotted suffixes and globs)");
    if (!j[key].is_array() || j[key].size() > 65536) throw bad(key, "is not a list of module names");
    for (const auto& e : j[key]) {
      if (!e.is_string() || e.get<std::string>().empty() || e.get<std::string>().size() > 4096)
        throw bad(key, "holds " + e.dump().substr(0, 64) + ", not a module name");
      out.push_back(e.get<std::string>());
    }
  };
  names("target_modules", c.target_modules);
  if (c.target_modules.empty()) throw bad("target_modules", "is missing or empty: name the modules the adapter is on");
  names("modules_to_save", c.modules_to_save);
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  // What PEFT can do and this program does not: refused, never silently trained otherwise.
  if (flag("use_dora")) throw bad("use_dora", "is true: DoRA adapters are not implemented");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_object() && j[key].empty()))
      throw bad(key, "gives some modules their own rank or alpha, which is not implemented");
  for (const char* key : {"layers_to_transform", "layer_replication"})
    if (j.contains(key) && !j[key].is_null()) throw bad(key, "is set, which is not implemented");
  if (j.contains("bias") && j["bias"] != "none") throw bad("bias", "= " + j["bias"].dump() + ": trained biases are not implemented (\"none\")");
  return c;
}

std::string peft_config_json(const PeftConfig& c) {
  nlohmann::ordered_json j;  // keys sorted by hand below, as PEFT's json.dump(sort_keys=True)
  j["alpha_pattern"] = nlohmann::json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["fan_in_fan_out"] = c.fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = nlohmann::json::object();
  j["lora_alpha"] = c.lora_alpha;
  j["lora_dropout"] = c.lora_dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = c.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.modules_to_save);
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  j["target_modules"] = c.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = c.use_rslora;
  return j.dump(2) + "\n";
}

std::string peft_tensor_name(const std::string& param) { return "base_model.model." + param; }

std::string modules_to_save_pattern(const std::string& module) { return "*" + module + ".*"; }

}  // namespace shardtrain::ckpt
