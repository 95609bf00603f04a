// Token datasets on disk: DIR/train.bin, DIR/val.bin (raw little-endian uint16 or uint32 ids),
// for instruction data DIR/train.mask, DIR/val.mask (one byte per token: 1 = the token counts
// as a target in the loss), DIR/train.rows, DIR/val.rows (where each row or document starts),
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
// Datasets with a loss mask are written as version 2, so a reader that does not know masks
// refuses them instead of training on every token.
inline constexpr int kMaskedTokenFormatVersion = 2;
// Datasets with row boundaries (DIR/train.rows, DIR/val.rows: where each instruction row or text
// document starts) are version 3, with or without a mask: what data.packing = "packed" /
// "padded" and data.document_mask need. data prepare writes every token dataset so.
inline constexpr int kRowsTokenFormatVersion = 3;
// data prepare refuses sources whose training split has fewer tokens (one input + its target).
inline constexpr std::int64_t kMinTrainTokens = 2;

// One record of DIR/<split>.rows (16 bytes, little-endian): the token index at which a row
// starts in its split, and where it came from (meta.json's source index and, for a JSONL
// source, the 1-based line; 0 for a whole text document).
struct RowRecord {
  std::int64_t start = 0;
  std::int64_t origin = 0;  // source << 32 | line
  static std::int64_t make_origin(std::int64_t source, std::int64_t line) {
    return (source << 32) | (line & 0xFFFFFFFFLL);
  }
  std::int64_t source() const { return origin >> 32; }
  std::int64_t line() const { return origin & 0xFFFFFFFFLL; }
};
inline constexpr int kRowRecordBytes = 16;

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
  // Instruction data: each split has a mask file (train.mask, val.mask) of one byte per token,
  // 1 when the token counts as a target (a completion / assistant token), else 0. The target
  // at position t of a window (token t+1) counts iff the mask byte of token t+1 is 1.
  bool masked = false;
  std::int64_t train_counted = 0, val_counted = 0;  // mask bytes that are 1 (masked only)
  std::string chat_format;                          // "plain", "llama3", ... (masked only)
  std::string split_rule;                           // "" = the per-document token split (text corpora)
  // Row boundaries (version 3): DIR/train.rows and DIR/val.rows, `*_rows` records each.
  bool rows = false;
  std::int64_t train_rows = 0, val_rows = 0;
  std::string row_kind;  // "rows" (instruction rows) | "documents" (text)

  int bytes_per_token() const { return dtype == "uint16" ? 2 : 4; }
};

// "uint16" when every id fits (vocab_size <= 65536), else "uint32".
std::string dtype_for_vocab(std::int64_t vocab_size);

// Tokenizes each document; the last floor(val_fraction * n) tokens of each document's n
// tokens go to val, the rest to train; documents are concatenated in order, each followed by
// the tokenizer's end-of-text id when it has one. Writes train.bin, val.bin, train.rows,
// val.rows (each document's part a row, with its eot), meta.json (version 3).
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
  // A dataset with a loss mask (meta.json "mask"): the split's .mask file, validated against
  // the token count (one byte per token, every byte 0 or 1, as many 1s as meta.json says).
  bool masked() const { return meta_.masked; }
  const std::string& mask_path() const { return mask_path_; }
  // Mask bytes [begin, begin + n) into out (bounds-checked; masked() only).
  void read_mask(std::int64_t begin, std::int64_t n, std::uint8_t* out) const;
  // Number of mask bytes that are 1 in [begin, begin + n) (masked() only).
  std::int64_t counted(std::int64_t begin, std::int64_t n) const;
  // Row boundaries (meta.json version 3): the split's .rows file, validated (starts strictly
  // increasing from 0, each below the token count, as many records as meta.json says).
  bool has_rows() const { return meta_.rows; }
  std::int64_t row_count() const { return rows_; }
  RowRecord row(std::int64_t i) const;           // bounds-checked
  std::int64_t row_end(std::int64_t i) const;    // start of row i + 1, or the split's size
  const std::string& rows_path() const { return rows_path_; }

 private:
  void map_mask(const std::string& dir, const std::string& split);
  void map_rows(const std::string& dir, const std::string& split);
  TokenDatasetMeta meta_;
  std::string path_;
  std::int64_t tokens_ = 0;
  const unsigned char* data_ = nullptr;
  std::size_t mapped_ = 0;
  std::string mask_path_;
  const unsigned char* mask_ = nullptr;
  std::string rows_path_;
  std::int64_t rows_ = 0;
  const unsigned char* rows_data_ = nullptr;
};

// Writes DIR/<split>.rows from row records (little-endian, 16 bytes each).
void write_rows(const std::string& path, const std::vector<RowRecord>& rows);
std::string encode_rows(const std::vector<RowRecord>& rows);

// Writes DIR/<split>.mask (bytes 0/1, one per token).
void write_mask(const std::string& path, const std::vector<std::uint8_t>& mask);

// Raw id files for `data encode` / `data decode`: little-endian uint16 or uint32.
void write_ids(const std::string& path, const std::vector<std::int32_t>& ids, const std::string& dtype);
std::vector<std::int32_t> read_ids(const std::string& path, const std::string& dtype);

}  // namespace shardtrain::data
