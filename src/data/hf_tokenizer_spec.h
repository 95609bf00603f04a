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

// (left id, right id) -> (rank, merged id), read-only once built: open addressing in one array
// (Llama 3 has 280 000 merges; BPE looks one up per adjacent pair, and a node-based map
// costs a cache miss per lookup).
class MergeTable {
 public:
  struct Slot {
    std::uint64_t key;
    std::int32_t rank, merged;
  };
  template <typename Map>
  void build(const Map& m) {
    std::size_t cap = 16;
    while (cap < m.size() + m.size() / 2) cap *= 2;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
    shift_ = 64;
    for (std::size_t c = cap; c > 1; c /= 2) --shift_;
    for (const auto& [k, v] : m) {
      std::size_t i = index(k);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = Slot{k, v.rank, v.merged};
    }
  }
  const Slot* find(std::uint64_t key) const {
    for (std::size_t i = index(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // the pair (-1, -1): no token
  std::size_t index(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
};

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
    // Split by GPT-2's, Llama 3's or Qwen2's pattern, isolated: run by the hand-written
    // scanners of pretokenize.h, which have the pattern's JS semantics and are faster than
    // the regex engine (the regex is compiled all the same, so the file is checked alike).
    enum Scanner { NoScanner, Gpt2Scanner, Llama3Scanner } scanner = NoScanner;
    int max_digits = 3;  // Llama3Scanner: 3 (Llama 3), 1 (Qwen2)
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
  MergeTable merges;
  std::int32_t byte_id[256];      // byte-level: the single-byte token of each byte (-1: none)
  std::int32_t fallback_id[256];  // byte_fallback: the <0xNN> token of each byte (-1: none)
  std::int32_t ascii_id[128];     // char-level: the token of each ASCII character (-1: none)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::int32_t unk_id = -1;
  // SentencePiece-style files give the model whole texts as one word. When no vocabulary
  // token has this string ("▁") after other text, no merge can join a symbol before a run of
  // it to one after, so the word is cut before each such run and the pieces (cached) encode
  // to the same ids; "" when that does not hold (or with ignore_merges).
  std::string piece_boundary;

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
