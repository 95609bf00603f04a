// make_tokenizer(): the tokenizer names the CLI and meta.json use, and model tokenizers by
// path (a tokenizer.json, a tokenizer.model, or a model directory holding one of them).
#include "shardtrain/data/tokenizer.h"

#include <filesystem>

#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/gpt2_tokenizer.h"
#include "shardtrain/data/hf_tokenizer.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/spm_tokenizer.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir,
                                          const TokenizerOptions& options) {
  if (name == choices::kByteTokenizer) return std::make_unique<ByteTokenizer>();
  if (name == choices::kGpt2Tokenizer) {
    std::string dir = gpt2_dir(data_dir);
    return std::make_unique<Gpt2Tokenizer>(dir + "/encoder.json", dir + "/vocab.bpe");
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  ST_USER_CHECK(!name.empty() && fs::exists(name, ec), "unknown tokenizer '", name, "' (expected ",
                choices::joined(choices::kTokenizers),
                ", or the path of a tokenizer.json, a tokenizer.model or a model directory holding one; no such file "
                "or directory)");
  std::string file = name;
  if (fs::is_directory(name, ec)) {
    // A model directory: tokenizer.json is preferred (it carries the added tokens and the
    // post-processor; tokenizer.model is SentencePiece's file of the same tokenizer).
    const std::string dir = name;
    if (file_exists(dir + "/tokenizer.json")) file = dir + "/tokenizer.json";
    else if (file_exists(dir + "/tokenizer.model")) file = dir + "/tokenizer.model";
    else throw UserError("tokenizer directory '" + dir + "' has neither tokenizer.json nor tokenizer.model");
  }
  const std::string parent = fs::path(file).parent_path().string();
  const std::string config = (parent.empty() ? std::string(".") : parent) + "/tokenizer_config.json";
  const std::string config_path = file_exists(config) ? config : "";
  bool json = ends_with(file, ".json");
  if (!json && !ends_with(file, ".model")) {
    // Another name: a JSON file starts with '{' (SentencePiece models are protobuf).
    const std::string head = read_file(file, kMaxAuxFileBytes, "tokenizer file").substr(0, 4096);
    const auto p = head.find_first_not_of(" \t\r\n");
    json = p != std::string::npos && head[p] == '{';
  }
  if (json) return std::make_unique<HfBpeTokenizer>(HfTokenizerFiles{file, config_path, name}, options);
  return std::make_unique<SpmTokenizer>(file, config_path, name, options);
}

}  // namespace shardtrain::data
