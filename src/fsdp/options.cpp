// Parsing and naming of FSDP options.
#include "shardtrain/fsdp/options.h"

#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

Strategy parse_strategy(const std::string& s) {
  if (s == "full_shard") return Strategy::FullShard;
  if (s == "shard_grad_op") return Strategy::ShardGradOp;
  if (s == "no_shard") return Strategy::NoShard;
  if (s == "hybrid_shard") return Strategy::HybridShard;
  if (s == "hybrid_shard_zero2") return Strategy::HybridShardZero2;
  throw UserError("unknown parallel.strategy '" + s +
                  "' (full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2)");
}

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::FullShard: return "full_shard";
    case Strategy::ShardGradOp: return "shard_grad_op";
    case Strategy::NoShard: return "no_shard";
    case Strategy::HybridShard: return "hybrid_shard";
    case Strategy::HybridShardZero2: return "hybrid_shard_zero2";
  }
  return "?";
}

BackwardPrefetch parse_backward_prefetch(const std::string& s) {
  if (s == "pre") return BackwardPrefetch::Pre;
  if (s == "post") return BackwardPrefetch::Post;
  if (s == "none") return BackwardPrefetch::None;
  throw UserError("unknown fsdp.backward_prefetch '" + s + "' (pre, post, none)");
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw UserError("unknown dtype '" + s + "' (fp32, bf16, fp16)");
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
