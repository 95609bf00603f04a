// import_safetensors: a safetensors file -> a step-0 shardtrain checkpoint for a deck's model.
#pragma once
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
// The parameters of the model `spec` describes, each once (a tied weight once), in model order.
std::vector<ckpt::ExpectedTensor> expected_tensors(const model::ModelSpec& spec);
// The same of a model already built (on the meta device or not).
std::vector<ckpt::ExpectedTensor> expected_tensors(const model::Model& net);

// The files a safetensors source consists of (ckpt::safetensors_files, plus the index or the
// path itself), for refusing an output that would overwrite one of them.
std::vector<std::string> safetensors_inputs(const std::string& in);

}  // namespace shardtrain::model_io
