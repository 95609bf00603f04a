// make_tokenizer(): the tokenizer names the CLI and meta.json use.
#include "shardtrain/data/tokenizer.h"

#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/gpt2_tokenizer.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir,
                                          const TokenizerOptions& options) {
  (void)options;  // only model tokenizers (tokenizer.json, tokenizer.model) have special tokens
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") {
    std::string dir = gpt2_dir(data_dir);
    return std::make_unique<Gpt2Tokenizer>(dir + "/encoder.json", dir + "/vocab.bpe");
  }
  throw UserError("unknown tokenizer '" + name + "' (expected 'gpt2' or 'byte')");
}

}  // namespace shardtrain::data
