// Names and numbers of the checkpoint file format (docs/checkpoint-format.md describes it).
#pragma once
#include <cstdint>

namespace shardtrain::ckpt {

constexpr const char* kFormatName = "shardtrain-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr const char* kModelGroup = "model";  // /model/<parameter name>, fp32, logical shape
constexpr const char* kOptimGroup = "optim";  // /optim/<state>/<parameter name>
constexpr const char* kTrainGroup = "train";  // /train/data_cursor, /train/rng_state
constexpr const char* kDigestAttr = "digest"; // uint64[2] on every dataset (see digest.h)
// A parameter dimension above this is not a real model (guards size arithmetic on hostile files).
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int kMaxRank = 8;

}  // namespace shardtrain::ckpt
