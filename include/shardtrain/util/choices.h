// The enumerations decks and command lines spell, each named once: the deck schema's allowed
// values, the parsers (fsdp::parse_strategy, fsdp::parse_dtype), the device and backend checks
// (fsdp::open_groups), the tokenizer factory (data::make_tokenizer) and `shardtrain deck
// reference --json` (which jobscripts/scaling-study reads) all take the names from here. The order is the order of the C++ enums that mirror them
// (fsdp::Strategy, fsdp::OptimizerKind).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "shardtrain/util/error.h"

namespace shardtrain::choices {

inline constexpr std::array<const char*, 5> kStrategies = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard",
                                                           "hybrid_shard_zero2"};
inline constexpr std::array<const char*, 3> kDtypes = {"fp32", "bf16", "fp16"};
inline constexpr std::array<const char*, 3> kDevices = {"auto", "cpu", "cuda"};
inline constexpr std::array<const char*, 3> kBackends = {"auto", "mpi", "nccl"};
inline constexpr std::array<const char*, 2> kOptimizers = {"adamw", "sgd"};  // fsdp::OptimizerKind

// parallel.replica_sync: how the replicas of the hybrid strategies stay in step (every optimizer
// step, or DiLoCo's outer step every diloco.inner_steps) and diloco.outer_dtype, the wire format
// of DiLoCo's outer gradients between replicas (int8 / int4: per-block scales, fsdp/quantize.h).
inline constexpr std::array<const char*, 2> kReplicaSync = {"every_step", "diloco"};
inline constexpr std::array<const char*, 4> kOuterDtypes = {"fp32", "bf16", "int8", "int4"};

// fsdp.wrap (train::engine_options_from_deck: block = the model's block types, size =
// fsdp.min_num_params, none = the whole model one unit) and fsdp.backward_prefetch
// (fsdp::BackwardPrefetch: Pre, Post, None).
inline constexpr std::array<const char*, 3> kWrapPolicies = {"block", "size", "none"};
inline constexpr std::array<const char*, 3> kBackwardPrefetch = {"pre", "post", "none"};

// data.packing (data::Packing: Stream, Packed, Padded; the deck also takes "auto", resolved by
// the dataset: train::resolve_packing) and data.overlong.
inline constexpr const char* kPackingAuto = "auto";
inline constexpr std::array<const char*, 3> kPackings = {"stream", "packed", "padded"};
inline constexpr std::array<const char*, 2> kOverlong = {"truncate", "error"};

// data.tokenizer's (and data prepare --tokenizer's) built-in tokenizers (data::make_tokenizer);
// any other value is a model tokenizer's path. The first is the default.
inline constexpr const char* kGpt2Tokenizer = "gpt2";
inline constexpr const char* kByteTokenizer = "byte";
inline constexpr std::array<const char*, 2> kTokenizers = {kGpt2Tokenizer, kByteTokenizer};

// Index of `s` in names, or -1.
template <size_t N>
int index_of(const std::array<const char*, N>& names, const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<int>(i);
  return -1;
}
template <size_t N>
std::vector<std::string> as_list(const std::array<const char*, N>& names) {
  return std::vector<std::string>(names.begin(), names.end());
}
// "a, b, c" for messages.
template <size_t N>
std::string joined(const std::array<const char*, N>& names) {
  std::string out;
  for (const char* n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// The value of enum E named `s`, E declared in the order of `names` (each such enum's .cpp
// static_asserts its size against the list); else a UserError "unknown <what> 's' (a, b, c)".
template <typename E, size_t N>
E parse_choice(const std::array<const char*, N>& names, const std::string& s, const char* what) {
  const int i = index_of(names, s);
  if (i < 0) throw UserError("unknown " + std::string(what) + " '" + s + "' (" + joined(names) + ")");
  return static_cast<E>(i);
}

}  // namespace shardtrain::choices
