// AddedTokens: the added and special tokens of a model tokenizer ("<|eot_id|>", "<s>") and how
// they are found in a text before the model sees it (Hugging Face's AddedVocabulary: leftmost-
// longest match, with the lstrip / rstrip / single_word flags of each token).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::data {

struct AddedToken {
  std::int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class AddedTokens {
 public:
  AddedTokens() = default;
  // specials_in_text false: tokens marked special are never matched (they are plain text), as
  // Hugging Face's `split_special_tokens=True`; the other added tokens still are.
  AddedTokens(std::vector<AddedToken> tokens, bool specials_in_text);

  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits text into pieces, in order: fn(std::string_view piece, std::size_t offset, int32_t id)
  // with id >= 0 for a matched token (piece = its text, whitespace eaten by lstrip/rstrip
  // included) and id = -1 for the text between matches (never empty).
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const;

 private:
  // The next match at or after `from`: sets [b, e) and the token index; false when none.
  bool next_match(std::string_view text, std::size_t from, std::size_t& b, std::size_t& e, std::size_t& tok) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::vector<std::uint32_t>> by_first_byte_;  // matchable token indices, longest first
  bool first_byte_[256] = {};
};

template <typename Fn>
void AddedTokens::split(std::string_view text, Fn&& fn) const {
  std::size_t start = 0, from = 0, b, e, t;
  while (!empty() && next_match(text, from, b, e, t)) {
    if (b > start) fn(text.substr(start, b - start), start, std::int32_t{-1});
    fn(text.substr(b, e - b), b, tokens_[t].id);
    start = from = e;
  }
  if (start < text.size()) fn(text.substr(start), start, std::int32_t{-1});
}

}  // namespace shardtrain::data
