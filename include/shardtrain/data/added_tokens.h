// AddedTokens: the added and special tokens of a model tokenizer ("<|eot_id|>", "<s>") and how
// they are found in a text before the model sees it (Hugging Face's AddedVocabulary: leftmost-
// longest match, with the lstrip / rstrip / single_word flags of each token). Finding them costs
// time linear in the text and the tokens' length, whatever the tokens are (an Aho-Corasick
// automaton; see added_tokens.cpp), so a crafted tokenizer cannot make encoding slow.
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
  // Hugging Face's `split_special_tokens=True`; the other added tokens still are. Two tokens
  // with the same content: the first one's index is matched (the loaders keep contents unique).
  AddedTokens(std::vector<AddedToken> tokens, bool specials_in_text);

  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits text into pieces, in order: fn(std::string_view piece, std::size_t offset, int32_t id)
  // with id >= 0 for a matched token (piece = its text, whitespace eaten by lstrip/rstrip
  // included) and id = -1 for the text between matches (never empty).
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const;

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;
  // One pass over a text: which token is the longest starting at each position of a window,
  // computed back to front (the automaton of the reversed tokens), windows moving forward.
  class Scan {
   public:
    Scan(const AddedTokens& t, std::string_view text) : t_(t), text_(text) {}
    // The next match at or after `from` (>= the previous call's): sets [b, e) and the token
    // index; false when none.
    bool next(std::size_t from, std::size_t& b, std::size_t& e, std::size_t& tok);

   private:
    std::uint32_t longest_at(std::size_t p);  // token index or kNone
    const AddedTokens& t_;
    std::string_view text_;
    std::size_t window_begin_ = 0, window_end_ = 0;
    std::vector<std::uint32_t> longest_;  // per position of [window_begin_, window_end_)
  };
  std::uint32_t child(std::uint32_t node, unsigned char byte) const;

  std::vector<AddedToken> tokens_;
  // The trie of the matchable tokens' reversed contents, as node arrays (node 0 the root):
  // children as first-child / next-sibling lists (the root's also in root_next_), the
  // Aho-Corasick failure link, and `out_`: the longest token that is a suffix of the node's
  // string (its own, else its failure node's).
  std::vector<std::uint32_t> first_child_, next_sibling_, fail_, out_;
  std::vector<unsigned char> byte_;
  std::uint32_t root_next_[256] = {};
  std::size_t longest_token_ = 0;
};

template <typename Fn>
void AddedTokens::split(std::string_view text, Fn&& fn) const {
  if (empty()) {
    if (!text.empty()) fn(text, std::size_t{0}, std::int32_t{-1});
    return;
  }
  Scan scan(*this, text);
  std::size_t start = 0, from = 0, b, e, t;
  while (scan.next(from, b, e, t)) {
    if (b > start) fn(text.substr(start, b - start), start, std::int32_t{-1});
    fn(text.substr(b, e - b), b, tokens_[t].id);
    start = from = e;
  }
  if (start < text.size()) fn(text.substr(start), start, std::int32_t{-1});
}

}  // namespace shardtrain::data
