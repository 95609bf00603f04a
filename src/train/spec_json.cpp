// model_spec_json: ModelSpec -> JSON (informational; loading checks shapes, not this text).
#include "spec_json.h"

#include <nlohmann/json.hpp>

namespace shardtrain::train {

std::string model_spec_json(const model::ModelSpec& s) {
  nlohmann::json j = {{"arch", s.arch}};
  const bool images = model::input_kind(s) == model::InputKind::Images;
  for (const model::SpecField& f : model::spec_fields()) {
    if ((f.images_only && !images) || (f.llama_only && s.arch != "llama")) continue;
    if (f.int_field) j[f.name] = s.*f.int_field;
    if (f.float_field) j[f.name] = s.*f.float_field;
    if (f.bool_field) j[f.name] = s.*f.bool_field;
    if (f.string_field) j[f.name] = s.*f.string_field;
  }
  // What trains (LoRA, train.freeze): an adapter checkpoint's model is the base plus these.
  const model::Finetune& ft = s.finetune;
  if (ft.any())
    j["finetune"] = {{"lora_rank", ft.lora.rank},     {"lora_alpha", ft.lora.alpha},   {"lora_dropout", ft.lora.dropout},
                     {"lora_targets", ft.lora.targets}, {"lora_rslora", ft.lora.rslora}, {"freeze", ft.freeze},
                     {"train_also", ft.train_also}};
  if (ft.lora.nf4()) {
    j["finetune"]["lora_nf4_block"] = ft.lora.nf4_block;
    j["finetune"]["lora_nf4_double_quant"] = ft.lora.nf4_double_quant;
  }
  return j.dump();
}

}  // namespace shardtrain::train
