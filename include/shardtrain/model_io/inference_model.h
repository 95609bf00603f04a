// InferenceModel: a trained model for `eval` and `generate`: the deck's (or the checkpoint's
// own) model sharded over the world exactly as training shards it, its weights read from a
// checkpoint written at any world size and strategy.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/train/job.h"

namespace shardtrain::model_io {

// A checkpoint file, or a checkpoint directory (the file its `latest` names). UserError naming
// `what` (the flag or key it came from) when neither exists.
std::string resolve_checkpoint_path(const std::string& path_or_dir, const std::string& what);

// The deck a checkpoint was trained with (its resolved deck), re-read with the keys that only
// placed the training job (strategy, mesh, offload, recomputation, device, comms) back at their
// defaults so the model loads at any world size, and run.threads = 1 (bits independent of the
// world size); `overrides` are applied last. Every rank reads
// the file; UserError naming the file.
deck::Deck checkpoint_deck(const std::string& ckpt_path, const std::vector<std::string>& overrides = {});

struct InferenceModel {
  train::ShardedJob job;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<fsdp::ShardedOptimizer> optimizer;  // load_checkpoint reads its state too
  ckpt::TrainState state;                              // the checkpoint's step, tokens seen
  std::string path;
  model::Model& net() { return *job.net; }
};

// Collective over world: builds the deck's model, sharded, and loads `ckpt_path` into it (every
// digest checked). A checkpoint of another model is one UserError on every rank. With LoRA
// (lora.rank > 0): an adapter checkpoint is loaded on its base (checkpoint.init_from or run.seed,
// checked against the checkpoint's record); a whole model's checkpoint, or no checkpoint at all
// (ckpt_path "": the deck's checkpoint.init_from or run.seed), is the base of lora.init_from's
// adapters.
std::unique_ptr<InferenceModel> open_inference_model(MPI_Comm world, const deck::Deck& d, const std::string& ckpt_path);

}  // namespace shardtrain::model_io
