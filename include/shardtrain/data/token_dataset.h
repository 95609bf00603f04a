// Token datasets on disk: DIR/train.bin, DIR/val.bin (raw little-endian uint16 or uint32 ids)
// and DIR/meta.json that describes them (see docs/data.md, "Token dataset format").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/tokenizer.h"

namespace shardtrain::data {

inline constexpr const char* kTokenFormat = "shardtrain-tokens";
inline constexpr int kTokenFormatVersion = 1;
// data prepare refuses sources whose training split has fewer tokens (one input + its target).
inline constexpr std::int64_t kMinTrainTokens = 2;

struct TokenSourceInfo {
  std::string name;
  std::int64_t bytes = 0;
  std::string fnv1a64;  // of the source text
  std::int64_t train_tokens = 0, val_tokens = 0;
  // Corpus files (data prepare with files, directories or globs); not written when empty / -1.
  std::string format;              // "text", "jsonl" (+ ".gz")
  std::int64_t documents = -1;     // documents taken from the file
  std::int64_t skipped = -1;       // malformed lines skipped (--skip-bad)
};

struct TokenDatasetMeta {
  std::string tokenizer;
  std::int64_t vocab_size = 0;
  std::string dtype;  // "uint16" (vocab <= 65536) or "uint32"
  std::int32_t eot_id = -1;
  double val_fraction = 0;
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::vector<TokenSourceInfo> sources;

  int bytes_per_token() const { return dtype == "uint16" ? 2 : 4; }
};

// "uint16" when every id fits (vocab_size <= 65536), else "uint32".
std::string dtype_for_vocab(std::int64_t vocab_size);

// Tokenizes each document; the last floor(val_fraction * n) tokens of each document's n
// tokens go to val, the rest to train; documents are concatenated in order, each followed by
// the tokenizer's end-of-text id when it has one. Writes train.bin, val.bin, meta.json.
TokenDatasetMeta prepare_token_dataset(const std::vector<TextDocument>& docs, Tokenizer& tok,
                                       const std::string& out_dir, double val_fraction);

// Reads and validates DIR/meta.json (UserError naming the file on any problem).
TokenDatasetMeta read_token_meta(const std::string& dir);
void write_token_meta(const std::string& dir, const TokenDatasetMeta& meta);

// One split of a token dataset, memory-mapped read-only.
class TokenDataset {
 public:
  // Validates meta.json against the file's size and dtype and spot-checks ids < vocab_size
  // (all ids when the split has <= 16 Mi tokens, else 1 Mi ids spread over the file).
  TokenDataset(const std::string& dir, const std::string& split);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  std::int64_t size() const { return tokens_; }
  const TokenDatasetMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  std::int32_t at(std::int64_t i) const;
  // Copies ids [begin, begin + n) into out (bounds-checked). UserError naming the file, the
  // token index and its byte offset when an id is >= vocab_size.
  void read(std::int64_t begin, std::int64_t n, std::int32_t* out) const;

 private:
  TokenDatasetMeta meta_;
  std::string path_;
  std::int64_t tokens_ = 0;
  const unsigned char* data_ = nullptr;
  std::size_t mapped_ = 0;
};

// Raw id files for `data encode` / `data decode`: little-endian uint16 or uint32.
void write_ids(const std::string& path, const std::vector<std::int32_t>& ids, const std::string& dtype);
std::vector<std::int32_t> read_ids(const std::string& path, const std::string& dtype);

}  // namespace shardtrain::data
