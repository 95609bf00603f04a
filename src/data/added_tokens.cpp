// AddedTokens matching. At each position the longest token wins, the leftmost position first
// (aho-corasick LeftmostLongest in the tokenizers library). A match the flags reject
// (single_word next to a word character) is skipped whole, as the library does: the scan
// resumes after it without trying shorter tokens there.
#include "shardtrain/data/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/data/unicode_class.h"

namespace shardtrain::data {
namespace {
// The code point that ends at text[end) (end > 0), decoded backwards.
char32_t code_point_before(std::string_view text, std::size_t end) {
  std::size_t p = end - 1;
  while (p > 0 && end - p < 4 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
  std::size_t len;
  char32_t cp = decode_utf8(text, p, len);
  return p + len == end ? cp : kInvalidCodePoint;
}
bool is_word_char(char32_t cp) {
  if (cp == U'_') return true;
  CharClass c = classify(cp);
  return c == CharClass::Letter || c == CharClass::Number;
}
bool is_space(char32_t cp) { return cp != kInvalidCodePoint && classify(cp) == CharClass::Space; }
}  // namespace

AddedTokens::AddedTokens(std::vector<AddedToken> tokens, bool specials_in_text) : tokens_(std::move(tokens)) {
  by_first_byte_.resize(256);
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const auto& t = tokens_[i];
    if (t.content.empty() || (t.special && !specials_in_text)) continue;
    auto b = static_cast<unsigned char>(t.content[0]);
    first_byte_[b] = true;
    by_first_byte_[b].push_back(static_cast<std::uint32_t>(i));
  }
  for (auto& v : by_first_byte_)
    std::stable_sort(v.begin(), v.end(), [&](std::uint32_t a, std::uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
}

bool AddedTokens::next_match(std::string_view text, std::size_t from, std::size_t& b, std::size_t& e,
                             std::size_t& tok) const {
  const std::size_t n = text.size();
  for (std::size_t p = from; p < n; ++p) {
    auto c = static_cast<unsigned char>(text[p]);
    if (!first_byte_[c]) continue;
    for (std::uint32_t i : by_first_byte_[c]) {
      const auto& t = tokens_[i];
      if (t.content.size() > n - p || std::memcmp(text.data() + p, t.content.data(), t.content.size()) != 0)
        continue;
      std::size_t mb = p, me = p + t.content.size();
      if (t.single_word) {
        bool word_before = mb > 0 && is_word_char(code_point_before(text, mb));
        std::size_t len;
        bool word_after = me < n && is_word_char(decode_utf8(text, me, len));
        if (word_before || word_after) {
          p = me - 1;  // skipped whole; the loop's ++p resumes after it
          goto next_position;
        }
      }
      if (t.lstrip)
        while (mb > from && is_space(code_point_before(text, mb))) {
          std::size_t q = mb - 1;
          while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
          mb = q;
        }
      if (t.rstrip)
        while (me < n) {
          std::size_t len;
          if (!is_space(decode_utf8(text, me, len))) break;
          me += len;
        }
      b = mb;
      e = me;
      tok = i;
      return true;
    }
  next_position:;
  }
  return false;
}

}  // namespace shardtrain::data
