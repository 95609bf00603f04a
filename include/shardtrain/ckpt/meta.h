// read_checkpoint_meta: a checkpoint's root attributes (step, strategy, versions, ...), without
// libtorch: what a program that only inspects checkpoints includes (checkpoint.h includes it too).
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain::ckpt {

// The root attributes, read by one process (no MPI-IO). UserError if not a checkpoint.
struct CheckpointMeta {
  int64_t version = 0, step = 0, tokens_seen = 0, world_size = 0, shard_group_size = 0, replicate_size = 0;
  std::string strategy, created, library_versions, model_spec_json, deck_text, optimizer;
  int64_t optimizer_steps = 0;
  std::string run_id;    // "" in files written before run ids
  int64_t save_seq = 0;
  std::string base_json;  // an adapter checkpoint's base (ckpt/base.h); "" when it holds the whole model
};
CheckpointMeta read_checkpoint_meta(const std::string& path);

}  // namespace shardtrain::ckpt
