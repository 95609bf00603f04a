// The frozen base of an adapter (LoRA) run. Its weights are not in the run's checkpoints, so
// every command that builds such a model (train, eval, generate, the merged export) loads the
// base first: checkpoint.init_from's tensors but the adapters, else the seeded init of run.seed,
// which the engine already holds. A checkpoint records the base's identity (ckpt::BaseIdentity);
// a resume, an eval or an export on another base is refused, naming what differs.
#pragma once
#include <mpi.h>

#include <string>

#include "shardtrain/ckpt/base.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/model/model.h"

namespace shardtrain::train {

// Whether a model's checkpoints are adapter checkpoints (LoRA on: the base is identified, not held).
inline bool is_adapter_run(const model::ModelSpec& spec) { return spec.finetune.lora.on(); }

// Loads the base into the engine (an engine built with train::seeded_init(run.seed) already holds
// a seeded base) and returns its identity. `verbose`: rank 0 says where it came from. Collective.
ckpt::BaseIdentity load_adapter_base(const deck::Deck& d, fsdp::Engine& engine, MPI_Comm world, bool verbose);

// lora.init_from: a PEFT adapter directory's tensors into every trained parameter (the
// adapters and lora.train_also, PEFT's modules_to_save); a missing tensor, a shape that does not
// fit or a tensor for a layer this run does not adapt is a UserError naming it. Collective.
void load_peft_adapter(const std::string& dir, fsdp::Engine& engine, MPI_Comm world, bool verbose);

// UserError naming the checkpoint and the first tensors that differ when `recorded_json` (the
// checkpoint's base attribute) is not `now`. `action`: what is refused ("resume", "eval", ...).
void check_adapter_base(const std::string& ckpt_path, const std::string& recorded_json, const ckpt::BaseIdentity& now,
                        const std::string& action);

}  // namespace shardtrain::train
