// The names of a checkpoint file's attributes (docs/checkpoint-format.md), defined once: the
// writer (save.cpp, which also keys rank 0's broadcast metadata by them) and every reader use these.
#pragma once

namespace shardtrain::ckpt::attr {

// On the root group /.
constexpr const char* kFormat = "format";                    // kFormatName
constexpr const char* kVersion = "version";                  // kFormatVersion
constexpr const char* kStep = "step";                        // also on /train
constexpr const char* kTokensSeen = "tokens_seen";           // also on /train
constexpr const char* kWorldSize = "world_size";
constexpr const char* kShardGroupSize = "shard_group_size";
constexpr const char* kReplicateSize = "replicate_size";
constexpr const char* kStrategy = "strategy";
constexpr const char* kCreated = "created";
constexpr const char* kLibraryVersions = "library_versions";
constexpr const char* kModelSpec = "model_spec";
constexpr const char* kDeck = "deck";
constexpr const char* kRunId = "run_id";                     // only in files of a run (with kSaveSeq)
constexpr const char* kSaveSeq = "save_seq";
constexpr const char* kBase = "base";                        // only in adapter checkpoints (BaseIdentity JSON)
// On /optim.
constexpr const char* kOptimizerName = "name";
constexpr const char* kStepsTaken = "steps_taken";
// On /train.
constexpr const char* kLrStep = "lr_step";
constexpr const char* kExtra = "extra";

}  // namespace shardtrain::ckpt::attr
