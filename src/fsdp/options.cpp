// Parsing and naming of FSDP options.
#include "shardtrain/fsdp/options.h"

#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

// The enum's order is choices::kStrategies' order.
static_assert(static_cast<int>(Strategy::HybridShardZero2) + 1 == static_cast<int>(choices::kStrategies.size()));

Strategy parse_strategy(const std::string& s) {
  const int i = choices::index_of(choices::kStrategies, s);
  if (i < 0) throw UserError("unknown parallel.strategy '" + s + "' (" + choices::joined(choices::kStrategies) + ")");
  return static_cast<Strategy>(i);
}

const char* to_string(Strategy s) {
  const int i = static_cast<int>(s);
  return i >= 0 && i < static_cast<int>(choices::kStrategies.size()) ? choices::kStrategies[i] : "?";
}

BackwardPrefetch parse_backward_prefetch(const std::string& s) {
  if (s == "pre") return BackwardPrefetch::Pre;
  if (s == "post") return BackwardPrefetch::Post;
  if (s == "none") return BackwardPrefetch::None;
  throw UserError("unknown fsdp.backward_prefetch '" + s + "' (pre, post, none)");
}

at::ScalarType parse_dtype(const std::string& s) {
  // choices::kDtypes' order, and torch's long names as aliases.
  static constexpr at::ScalarType kTypes[] = {at::kFloat, at::kBFloat16, at::kHalf};
  static_assert(std::size(kTypes) == choices::kDtypes.size());
  int i = choices::index_of(choices::kDtypes, s);
  if (i < 0) i = choices::index_of(std::array<const char*, 3>{"float32", "bfloat16", "float16"}, s);
  if (i < 0) throw UserError("unknown dtype '" + s + "' (" + choices::joined(choices::kDtypes) + ")");
  return kTypes[i];
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return "?";
  }
}

bool is_hybrid(Strategy s) { return s == Strategy::HybridShard || s == Strategy::HybridShardZero2; }
bool reshards_after_forward(Strategy s) { return s == Strategy::FullShard || s == Strategy::HybridShard; }

}  // namespace shardtrain::fsdp
