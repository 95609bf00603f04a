// HfBpeTokenizer::Spec: what a tokenizer.json (and tokenizer_config.json) define, in the form
// the encoder runs on. Private to src/data (hf_tokenizer_load.cpp fills it, hf_tokenizer.cpp runs it).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "shardtrain/data/added_tokens.h"
#include "shardtrain/data/hf_tokenizer.h"
#include "shardtrain/data/regex_split.h"

namespace shardtrain::data {

// How Split (and Metaspace's split) keep the delimiters: the tokenizers library's
// SplitDelimiterBehavior.
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct HfBpeTokenizer::Spec {
  std::string file, name;

  struct NormStep {
    enum Kind { Prepend, Replace, Unicode } kind;
    std::string a, b;  // Prepend: a; Replace: a -> b; Unicode: a = "NFC" | "NFD" | "NFKC" | "NFKD"
  };
  std::vector<NormStep> normalizer;

  struct PreStep {
    enum Kind { Split, ByteLevel, Metaspace } kind = Split;
    std::shared_ptr<const SplitRegex> re;  // Split; ByteLevel with use_regex
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;         // ByteLevel
    std::string replacement;               // Metaspace ("▁")
    enum Prepend { Never, First, Always } prepend = Always;
    bool split = true;                     // Metaspace
  };
  std::vector<PreStep> pre;
  bool byte_level = false;  // a ByteLevel pre-tokenizer: the model's symbols are bytes

  struct Merge {
    std::int32_t rank, merged;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  // Model vocabulary keyed by the text a token stands for (raw bytes for byte-level models,
  // UTF-8 with "▁" otherwise), and by its spelling in the file (for token_id()).
  std::unordered_map<std::string, std::int32_t> vocab, vocab_spelling;
  std::unordered_map<std::uint64_t, Merge> merges;
  std::int32_t byte_id[256];      // byte-level: the single-byte token of each byte (-1: none)
  std::int32_t fallback_id[256];  // byte_fallback: the <0xNN> token of each byte (-1: none)
  std::int32_t ascii_id[128];     // char-level: the token of each ASCII character (-1: none)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::int32_t unk_id = -1;

  AddedTokens added;
  std::unordered_map<std::string, std::int32_t> added_ids;  // content -> id

  // Decoding: the bytes of each id after the decoder's per-token steps; then at most
  // `strip_leading` spaces are removed from the start of the result (Strip, Metaspace).
  std::vector<std::string> id_bytes;
  std::vector<bool> id_known;
  int strip_leading = 0;

  std::vector<std::int32_t> prefix, suffix;  // post_processor, for one sequence
  std::int32_t bos = -1, eos = -1;
};

// Fills a Spec from the files (UserError naming the file and key on anything it cannot run).
std::shared_ptr<HfBpeTokenizer::Spec> load_hf_tokenizer(const HfTokenizerFiles& files, const TokenizerOptions& options);

// Unicode normalization (ICU) of UTF-8 text; form is "NFC", "NFD", "NFKC" or "NFKD".
void unicode_normalize(const std::string& form, std::string_view in, std::string& out);

}  // namespace shardtrain::data
