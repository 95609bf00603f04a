// The dtype vocabulary (see dtype.h).
#include "shardtrain/comm/dtype.h"

#include <string_view>

namespace shardtrain::comm {

const std::vector<DtypeName>& dtype_names() {
  static const std::vector<DtypeName> table = {
      {at::kFloat, "fp32", "float32", "float"},   {at::kDouble, "fp64", "float64", "double"},
      {at::kBFloat16, "bf16", "bfloat16", ""},    {at::kHalf, "fp16", "float16", "half"},
      {at::kLong, "int64", "int64", ""},          {at::kInt, "int32", "int32", ""},
  };
  return table;
}

std::optional<at::ScalarType> dtype_from_name(const std::string& name, bool with_alias) {
  for (const DtypeName& d : dtype_names())
    if (name == d.short_name || name == d.long_name || (with_alias && *d.alias && name == d.alias)) return d.type;
  return std::nullopt;
}

const char* dtype_short_name(at::ScalarType t) {
  for (const DtypeName& d : dtype_names())
    if (d.type == t) return d.short_name;
  return "?";
}

std::string dtype_long_name(at::ScalarType t) {
  for (const DtypeName& d : dtype_names())
    if (d.type == t) return d.long_name;
  return c10::toString(t);
}

std::vector<at::ScalarType> float_dtypes() {
  std::vector<at::ScalarType> out;
  for (const DtypeName& d : dtype_names())
    if (at::isFloatingType(d.type)) out.push_back(d.type);
  return out;
}

std::vector<std::string> float_dtype_short_names() {
  std::vector<std::string> out;
  for (at::ScalarType t : float_dtypes()) out.emplace_back(dtype_short_name(t));
  return out;
}

std::vector<std::string> float_dtype_long_names() {
  std::vector<std::string> out;
  for (at::ScalarType t : float_dtypes()) out.push_back(dtype_long_name(t));
  return out;
}

}  // namespace shardtrain::comm
