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
  return j.dump();
}

}  // namespace shardtrain::train
