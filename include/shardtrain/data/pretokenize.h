// GPT-2 pre-tokenizer: splits text into the chunks that BPE encodes independently, with the
// behaviour of the pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as JS (gpt-3-encoder, flag u) runs it; written by hand since std::regex has neither \p nor (?!).
#pragma once
#include <string_view>
#include <vector>

namespace shardtrain::data {

// Calls fn(std::string_view chunk) for each chunk, in order; the chunks concatenate to `text`.
template <typename Fn>
void for_each_pretoken(std::string_view text, Fn&& fn);

// Convenience: all chunks as views into `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

// Length in bytes of the chunk starting at text[pos] (pos < text.size()).
std::size_t pretoken_length(std::string_view text, std::size_t pos);

// The same for the split pattern of Llama 3 (max_digits 3) and Qwen2 (max_digits 1), as JS
// runs it (flags gu):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (Qwen2: \p{N} for \p{N}{1,3}). Used for tokenizer.json files that declare exactly it.
std::size_t llama3_pretoken_length(std::string_view text, std::size_t pos, int max_digits);

template <typename Fn>
void for_each_pretoken(std::string_view text, Fn&& fn) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t n = pretoken_length(text, pos);
    fn(text.substr(pos, n));
    pos += n;
  }
}

}  // namespace shardtrain::data
