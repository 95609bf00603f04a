// GPT-2 byte-level BPE tokenizer (encoder.json + vocab.bpe), compatible id for id with
// OpenAI's encoder.py and npm gpt-3-encoder.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/choices.h"

namespace shardtrain::data {

// GPT-2's reversible map from bytes to printable code points (bytes_to_unicode()).
// Returns the code point that stands for byte b in encoder.json and vocab.bpe.
char32_t gpt2_byte_to_unicode(unsigned char b);

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads both files; malformed content is a UserError naming the file (and line for vocab.bpe).
  Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path);

  std::unique_ptr<Tokenizer> for_thread() const override;
  std::vector<std::int32_t> encode(std::string_view text) override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(v_->id_to_bytes.size()); }
  std::string name() const override { return choices::kGpt2Tokenizer; }
  std::int32_t eot_id() const override { return v_->eot_id; }
  // "<|endoftext|>", the one special token of GPT-2 (its BOS and EOS in transformers).
  std::int32_t token_id(std::string_view token) const override {
    return token == "<|endoftext|>" ? v_->eot_id : -1;
  }

  std::size_t num_merges() const { return v_->merges.size(); }
  // Raw bytes of one token (for inspection and tests).
  const std::string& token_bytes(std::int32_t id) const;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  // BPE of one pre-token chunk (raw bytes), appended to out; cached per chunk.
  void bpe_chunk(std::string_view chunk, std::vector<std::int32_t>& out);

  // What the two files define; read-only once built, shared by for_thread() copies.
  struct Vocab {
    std::vector<std::string> id_to_bytes;              // token id -> raw bytes
    std::int32_t byte_id[256];                         // single-byte token ids
    std::unordered_map<std::uint64_t, Merge> merges;   // (left id, right id) -> rank, result
    std::int32_t eot_id = -1;
  };
  explicit Gpt2Tokenizer(std::shared_ptr<const Vocab> v) : v_(std::move(v)) {}
  std::shared_ptr<const Vocab> v_;
  // Chunk -> ids. Bounded: cleared when it grows past kMaxCache entries.
  std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
  static constexpr std::size_t kMaxCache = 1 << 20;
  std::vector<std::int32_t> work_, next_;             // scratch for bpe_chunk
};

}  // namespace shardtrain::data
