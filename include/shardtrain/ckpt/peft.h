// Hugging Face PEFT's LoRA adapter directory: adapter_config.json and adapter_model.safetensors,
// read (lora.init_from, an adapter from the hub or from `ckpt export --format peft`) and written.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::ckpt {

inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

// The adapter_config.json keys this program reads and writes (LoraConfig).
struct PeftConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  bool use_rslora = false;
  bool fan_in_fan_out = false;  // GPT-2's Conv1D stores W as [in, out] (PEFT's flag; the factors are the same)
  // Module names PEFT matches as "equal to, or ending in '.' + name" (PEFT >= 0.15 writes
  // "all-linear" as the full names it expanded to).
  std::vector<std::string> target_modules;
  // Modules trained in full besides the adapters; PEFT matches them as plain suffixes of module
  // names ("norm" is every module whose name ends in "norm").
  std::vector<std::string> modules_to_save;
  std::string base_model_name_or_path;
};

// dir/adapter_config.json. UserError naming the file and key: not a LoRA config, a value out
// of range, or a PEFT option this program does not implement (DoRA, rank or alpha patterns,
// layers_to_transform, trained biases, a regular expression as target_modules).
PeftConfig read_peft_config(const std::string& dir);
// adapter_config.json as PEFT 0.10-0.14's save_pretrained writes it (every LoraConfig key of
// those versions, sorted, indent 2; no key older PEFT would refuse).
std::string peft_config_json(const PeftConfig& c);

// A parameter's name in adapter_model.safetensors: PEFT's "base_model.model." prefix (the
// adapter name "default" is not part of saved names; modules_to_save keep the module's own).
std::string peft_tensor_name(const std::string& param);
// A modules_to_save entry as a parameter-name pattern (util/names.h): every parameter of a
// module whose name ends with it.
std::string modules_to_save_pattern(const std::string& module);

}  // namespace shardtrain::ckpt
