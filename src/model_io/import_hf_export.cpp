// export_hf_directory: a checkpoint -> a Hugging Face model directory (config.json, safetensors
// shards and index, generation_config.json, the source's tokenizer files), written atomically.
#include <cstdio>
#include <memory>

#include "hf_output.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model_io/import.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/deck/deck.h"
#include "spec_from_json.h"

namespace shardtrain::model_io {

void export_hf_directory(const std::string& path, const std::string& out_dir, const HfExportOptions& o) {
  HfOutput output(out_dir, "ckpt export");
  const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(path);
  const model::ModelSpec spec = model_spec_from_json(meta.model_spec_json, "checkpoint " + path);
  ST_USER_CHECK(spec.arch == "llama", "ckpt export --format hf: ", path, " holds a ", spec.arch,
                " model; a Hugging Face directory is written for the llama arch (Llama, Mistral, Qwen2)");
  std::unique_ptr<deck::Deck> d;
  try {
    // The deck as trained (checkpoint_deck would swap a Hugging Face source for the recorded
    // spec): its model.from_hf / init_from directory holds the tokenizer files to copy.
    d = std::make_unique<deck::Deck>(deck::Deck::parse(meta.deck_text, path + " (its resolved deck)", {}));
  } catch (const UserError& e) {
    log::warn(log::fmt("ckpt export: the checkpoint's deck is not readable (", e.what(), "); using the defaults"));
  }
  const std::string dtype = choose_hf_dtype(o.dtype, d.get(), spec);
  model::hf_config_json(spec, torch_dtype_name(dtype));  // its errors before any file
  // Where the tokenizer files come from: the flag, or the directory the model came from.
  const bool named = !o.tokenizer_from.empty();
  const std::string source = named ? o.tokenizer_from : d ? train::hf_model_source(*d) : std::string();
  const std::vector<ckpt::ExpectedTensor> expected = expected_tensors(spec);
  output.create();
  try {
    std::vector<std::string> files =
        ckpt::write_safetensors_shards(path, output.tmp(), expected, dtype, o.max_shard_bytes, o.allow_overflow);
    const std::vector<std::string> side = write_hf_side_files(output.tmp(), spec, dtype, source, named);
    files.insert(files.end(), side.begin(), side.end());
    output.commit();
    std::printf("exported %s -> %s: %s (%s), %zu files:", path.c_str(), out_dir.c_str(),
                spec.hf_architecture.empty() ? "llama" : spec.hf_architecture.c_str(), dtype.c_str(), files.size());
    for (const std::string& f : files) std::printf(" %s", f.c_str());
    std::printf("\n");
    std::fflush(stdout);
  } catch (...) {
    output.abandon();
    throw;
  }
}

}  // namespace shardtrain::model_io
