// A Hugging Face model directory being written (ckpt export --format hf / peft): the output's
// rules (absent, or an empty directory; a link or a file is refused), a temporary directory
// beside it that is renamed into place at the end (a failure leaves nothing, no reader sees half
// a model), and the files beside the weights (config, generation config, the source's tokenizer).
#pragma once
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model_io {

class HfOutput {
 public:
  // Checks the output (UserError naming `what`, e.g. "ckpt export"); creates nothing.
  HfOutput(const std::string& out_dir, std::string what);
  // The temporary directory beside the output (mode as mkdir would give it).
  void create();
  // Another rank's: the directory its rank 0 created.
  void adopt(const std::string& tmp) { tmp_ = tmp; }
  const std::string& tmp() const { return tmp_; }
  const std::string& out() const { return out_; }
  // fsync, rename onto the output, fsync its parent. UserError when something appeared meanwhile.
  void commit();
  // Removes the temporary directory (without following links inside).
  void abandon() noexcept;

 private:
  std::string out_, what_, tmp_;
};

// The export's safetensors dtype (F32, BF16, F16): the flag (auto, fp32, bf16, fp16); for auto
// bf16 for a bf16 run (the deck as trained), else the source's torch_dtype, else F32.
std::string choose_hf_dtype(const std::string& flag, const deck::Deck* d, const model::ModelSpec& spec);
const char* torch_dtype_name(const std::string& safetensors_dtype);

// config.json (model::hf_config_json), generation_config.json and the tokenizer files of
// `source` (a model directory: tokenizer_from, else the deck's model.from_hf / init_from) into
// dir; returns the names written. `named`: the source came from --tokenizer-from (it must exist).
std::vector<std::string> write_hf_side_files(const std::string& dir, const model::ModelSpec& spec,
                                             const std::string& dtype, std::string source, bool named);

}  // namespace shardtrain::model_io
