// check_model_sizes: each size field and the two-field widths of a spec against util/model_limits.h.
#include "shardtrain/model/model_sizes.h"

#include "shardtrain/util/error.h"
#include "shardtrain/util/model_limits.h"

namespace shardtrain::model {

void check_model_sizes(const ModelSpec& s, const std::string& where, const FieldName& name) {
  auto called = [&](const std::string& field) { return name ? name(field) : "model." + field; };
  auto field_value = [&](std::string_view field) -> int64_t {
    for (const SpecField& f : spec_fields())
      if (f.int_field && field == f.name) return s.*f.int_field;
    throw Error("check_model_sizes: no int field '" + std::string(field) + "' in ModelSpec");
  };
  for (const limits::SizeLimit& l : limits::kModelSizes) {
    const int64_t v = field_value(l.field);
    if (v > l.max)
      throw UserError(where + called(std::string(l.field)) + " = " + std::to_string(v) + " exceeds the limit " +
                      std::to_string(l.max) + " (model." + std::string(l.field) +
                      "'s largest value; docs/security.md, files from the hub)");
  }
  // Widths made of two fields; each factor is within its own limit here, so no product overflows.
  auto width = [&](int64_t v, const std::string& what) {
    if (v > limits::kMaxWidth)
      throw UserError(where + what + " = " + std::to_string(v) + " exceeds the limit " +
                      std::to_string(limits::kMaxWidth) + " of a layer's width (docs/security.md, files from the hub)");
  };
  if (s.arch == "llama" && s.n_heads > 0) {
    const int64_t hd = s.head_dim > 0 ? s.head_dim : s.d_model / s.n_heads;
    const std::string hd_name = s.head_dim > 0 ? called("head_dim") : called("d_model") + " / " + called("n_heads");
    width(s.n_heads * hd, called("n_heads") + " x " + hd_name);
    width(s.n_kv_heads * hd, called("n_kv_heads") + " x " + hd_name);
  }
  if (s.arch == "vit" && s.patch_size > 0) {
    width(s.channels * s.patch_size * s.patch_size, called("channels") + " x " + called("patch_size") + "^2");
    const int64_t side = s.image_size / s.patch_size;
    width(side * side, "(" + called("image_size") + " / " + called("patch_size") + ")^2 patches");
  }
}

}  // namespace shardtrain::model
