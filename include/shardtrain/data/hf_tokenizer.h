// HfBpeTokenizer: a Hugging Face tokenizer.json with a BPE model, read and run natively.
// Supported (anything else is a UserError naming the file and the key):
//   normalizer     null | Prepend | Replace (String pattern) | NFC | NFD | NFKC | NFKD | Sequence
//   pre_tokenizer  null | Split (Regex or String, any behavior, invert) | ByteLevel (last step) |
//                  Metaspace | Digits | Sequence
//   model          BPE: vocab, merges ("a b" or ["a","b"]), byte_fallback, fuse_unk, unk_token,
//                  ignore_merges (no continuing_subword_prefix / end_of_word_suffix / dropout)
//   post_processor null | TemplateProcessing | ByteLevel | RobertaProcessing | BertProcessing | Sequence
//   decoder        null | ByteLevel | Metaspace | Replace | ByteFallback | Fuse | Strip | Sequence
//   added_tokens   matched in the text first (see added_tokens.h)
// This covers GPT-2, Llama 3, Qwen2 (ByteLevel BPE with a split regex) and Llama 2 / Mistral
// (SentencePiece-style BPE: "▁" for spaces, <0xNN> byte fallback).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardtrain/data/tokenizer.h"

namespace shardtrain::data {

struct HfTokenizerFiles {
  std::string tokenizer_json;    // the file read
  std::string tokenizer_config;  // tokenizer_config.json next to it ("" = none): bos/eos, add_bos_token
  std::string name;              // what name() returns (the path the user gave)
};

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(const HfTokenizerFiles& files, const TokenizerOptions& options);
  ~HfBpeTokenizer() override;

  std::unique_ptr<Tokenizer> for_thread() const override;
  std::vector<std::int32_t> encode(std::string_view text) override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::string name() const override;
  std::int32_t eot_id() const override;
  std::int32_t token_id(std::string_view token) const override;
  std::vector<std::int32_t> prefix_ids() const override;
  std::vector<std::int32_t> suffix_ids() const override;
  std::int32_t bos_id() const override;
  std::int32_t eos_id() const override;

  struct Spec;  // everything read from the files; shared read-only by for_thread() copies
  struct State; // per-thread: regex matchers, caches, scratch

 private:
  HfBpeTokenizer(std::shared_ptr<const Spec> spec);
  void encode_segment(std::string_view text, std::size_t offset, std::vector<std::int32_t>& out);
  void pretokenize(std::size_t step, std::string_view piece, bool at_start, std::vector<std::int32_t>& out);
  void model_word(std::string_view word, std::vector<std::int32_t>& out);
  void model_piece(std::string_view word, std::vector<std::int32_t>& out);
  void bpe(std::string_view word, std::vector<std::int32_t>& out);

  std::shared_ptr<const Spec> spec_;
  std::unique_ptr<State> st_;
};

}  // namespace shardtrain::data
