// The byte-level fallback tokenizer: one id per byte, vocab 256, lossless, no files.
#pragma once
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/choices.h"

namespace shardtrain::data {

class ByteTokenizer final : public Tokenizer {
 public:
  std::unique_ptr<Tokenizer> for_thread() const override { return std::make_unique<ByteTokenizer>(); }
  std::vector<std::int32_t> encode(std::string_view text) override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return 256; }
  std::string name() const override { return choices::kByteTokenizer; }
  std::int32_t eot_id() const override { return -1; }
};

}  // namespace shardtrain::data
