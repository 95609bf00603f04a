// import_safetensors: a safetensors file -> a step-0 shardtrain checkpoint for a deck's model.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "shardtrain/ckpt/tools.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/model/model.h"
#include "shardtrain/runtime/runtime.h"

namespace shardtrain::model_io {

// Collective over the world. Builds the deck's model and strategy exactly as `train` would
// (on the meta device, one unit at a time), reads each rank's shard slices of every
// parameter from `in` (no rank ever holds the whole model), and writes `out` as a complete
// checkpoint at step 0: the imported weights, zero optimizer state and the training state a
// fresh run has. Resuming from it (checkpoint.resume = out) trains exactly like a fresh run
// with checkpoint.init_from = in. UserError (every rank) on a missing tensor, a wrong shape,
// an unreadable file; `out` is written atomically (nothing is left behind on failure).
void import_safetensors(runtime::Runtime& rt, const deck::Deck& d, const std::string& in, const std::string& out);

// `ckpt export`: the checkpoint's /model datasets as a safetensors file, after checking them
// against the model its model_spec attribute describes: a missing, misshaped or extra tensor
// is a UserError naming it (exit 2), and nothing is written. Refuses an output that is the
// input. One process.
void export_checkpoint(const std::string& path, const std::string& out);

// `ckpt export --format hf`: a Hugging Face model directory at `out_dir` (absent or an empty
// directory; anything else, a link included, is refused): config.json (the checkpoint's model,
// model::hf_config_json), model.safetensors or shards of at most max_shard_bytes with
// model.safetensors.index.json, generation_config.json, and the tokenizer files of the
// directory the model came from (tokenizer_from, else the checkpoint deck's model.from_hf or
// init_from directory). Tensors in `dtype`: auto = bf16 for a bf16 run, else the source's
// torch_dtype, else fp32. Written into a temporary directory renamed into place: on any error
// nothing is left. The llama arch only. One process.
struct HfExportOptions {
  std::string dtype = "auto";  // auto | fp32 | bf16 | fp16
  bool allow_overflow = false;  // values beyond the dtype's range: saturate instead of refusing
  int64_t max_shard_bytes = 5'000'000'000;
  std::string tokenizer_from;
};
void export_hf_directory(const std::string& path, const std::string& out_dir, const HfExportOptions& o);
// `ckpt export --format peft`: an adapter (LoRA) checkpoint as a Hugging Face PEFT adapter
// directory at `out_dir` (absent or empty): adapter_config.json and adapter_model.safetensors with
// PEFT's names (base_model.model.<parameter>), F32. A checkpoint of a whole model is refused.
// Written atomically. One process.
void export_peft_directory(const std::string& path, const std::string& out_dir);

// `ckpt export --format hf` of an adapter checkpoint: the merged model, W + s B A for every
// adapted layer (lora.train_also's parameters from the checkpoint), in the base's layout and
// `o.dtype`, as export_hf_directory writes a whole model. Collective over world: each rank reads
// its rows of each base tensor (checkpoint.init_from, or run.seed's init), merges them and writes
// its byte ranges, so a rank holds about one tensor's share at a time; the base is checked against
// the checkpoint's record as it is read (UserError naming what differs; nothing is left).
void export_merged_hf_directory(MPI_Comm world, const std::string& path, const std::string& out_dir,
                                const HfExportOptions& o);

// Whether a checkpoint holds a LoRA adapter (its base identified, not held). One process.
bool is_adapter_checkpoint(const std::string& path);

// The parameters of the model `spec` describes, each once (a tied weight once), in model order;
// for an adapter model those its checkpoints hold (what trains).
std::vector<ckpt::ExpectedTensor> expected_tensors(const model::ModelSpec& spec);
// The same of a model already built (on the meta device or not).
std::vector<ckpt::ExpectedTensor> expected_tensors(const model::Model& net);

// The files a safetensors source consists of (ckpt::safetensors_files, plus the index or the
// path itself), for refusing an output that would overwrite one of them.
std::vector<std::string> safetensors_inputs(const std::string& in);

}  // namespace shardtrain::model_io
