// What the `shardtrain data ...` subcommands do, as library functions (testable without MPI).
// Each returns a one-paragraph human summary; bad input is a UserError.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/choices.h"

namespace shardtrain::data {

// data extract-austen: the six novels as <out_dir>/<name>.txt (default <data_dir>/austen).
std::string cmd_extract_austen(const std::string& data_dir, const std::string& out_dir);

struct PrepareArgs {
  std::string data_dir;
  // A built-in name (choices::kTokenizers) or a tokenizer.json / tokenizer.model / model dir
  // (ignored for mnist).
  std::string tokenizer = choices::kTokenizers[0];
  TokenizerOptions tokenizer_options;   // --special-tokens match | text
  std::vector<std::string> sources;     // "austen", "mnist", or text files
  std::string out_dir;
  double val_fraction = 0;              // checked to lie in [0, 1) when given
  bool val_fraction_given = false;      // false: default (0.05 for text, 0.2 for mnist)
  std::string text_field = "text";      // JSONL: the field that holds a document's text
  bool skip_bad = false;                // JSONL: skip (and count) malformed lines instead of failing
  int threads = 0;                      // tokenizer threads per rank; 0 = cores / ranks on the host
  double progress_every_s = 5;          // progress lines on long inputs (<= 0: none)
  // Instruction data (docs/data.md "Instruction data"): JSONL rows {"prompt", "completion"} or
  // {"messages": [...]} rendered in a chat format, with a loss mask. "" = text corpus.
  std::string chat_format;              // plain | llama3 | llama3.1 | chatml | qwen2 | qwen2.5 | auto
  std::string tokenizer_config;         // auto: tokenizer_config.json ("" = beside the tokenizer)
  std::string chat_date;                // Llama 3.2-style templates: the "Today Date" to render
};
// data prepare: a token dataset (austen / text files) or an image dataset (mnist).
std::string cmd_prepare(const PrepareArgs& a);

// data encode / decode: raw little-endian ids (dtype "" = smallest that fits the vocab).
std::string cmd_encode(const std::string& data_dir, const std::string& tokenizer, const std::string& in,
                       const std::string& out, std::string dtype, const TokenizerOptions& options = {});
std::string cmd_decode(const std::string& data_dir, const std::string& tokenizer, const std::string& in,
                       const std::string& out, std::string dtype);

// data info DIR: validates a dataset (token or image) and describes it.
std::string cmd_info(const std::string& dir);

}  // namespace shardtrain::data
