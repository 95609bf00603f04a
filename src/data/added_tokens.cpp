// AddedTokens matching. At each position the longest token wins, the leftmost position first
// (aho-corasick LeftmostLongest in the tokenizers library). A match the flags reject
// (single_word next to a word character) is skipped whole, as the library does: the scan
// resumes after it without trying shorter tokens there.
//
// Which token is the longest starting at position p depends only on text[p, p + longest token).
// Reading the text back to front through the Aho-Corasick automaton of the *reversed* tokens
// gives exactly that at every position in one pass: the automaton's state after reading text[p]
// is the longest reversed-token prefix that ends the reversed text read so far, and the longest
// whole token among its suffixes (out_, precomputed) is the longest token starting at p. So the
// cost is linear in the text plus the tokens' total length, however the tokens overlap (a scan
// that compares every candidate token at every position costs text x tokens: a crafted
// tokenizer.json of long, alike tokens made 20 KB of text take half a minute). The pass runs in
// windows of the text (the state needs only the next `longest token` bytes), so memory stays
// bounded for any text.
#include "shardtrain/data/added_tokens.h"

#include <algorithm>
#include <deque>

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

// Positions per window of the back-to-front pass (at least twice the longest token, so the
// bytes read ahead of a window stay a fraction of it).
constexpr std::size_t kWindow = 1 << 16;
}  // namespace

std::uint32_t AddedTokens::child(std::uint32_t node, unsigned char byte) const {
  if (node == 0) return root_next_[byte] ? root_next_[byte] : kNone;  // the root is nobody's child
  for (std::uint32_t c = first_child_[node]; c != kNone; c = next_sibling_[c])
    if (byte_[c] == byte) return c;
  return kNone;
}

AddedTokens::AddedTokens(std::vector<AddedToken> tokens, bool specials_in_text) : tokens_(std::move(tokens)) {
  auto new_node = [&](unsigned char b) {
    first_child_.push_back(kNone);
    next_sibling_.push_back(kNone);
    fail_.push_back(0);
    out_.push_back(kNone);
    byte_.push_back(b);
    return static_cast<std::uint32_t>(byte_.size() - 1);
  };
  new_node(0);  // the root
  // The trie of reversed contents; out_ marks a token's own node (the first token wins).
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty() || (t.special && !specials_in_text)) continue;
    longest_token_ = std::max(longest_token_, t.content.size());
    std::uint32_t v = 0;
    for (std::size_t k = t.content.size(); k-- > 0;) {
      const auto b = static_cast<unsigned char>(t.content[k]);
      std::uint32_t c = child(v, b);
      if (c == kNone) {
        c = new_node(b);
        next_sibling_[c] = first_child_[v];
        first_child_[v] = c;
        if (v == 0) root_next_[b] = c;
      }
      v = c;
    }
    if (out_[v] == kNone) out_[v] = static_cast<std::uint32_t>(i);
  }
  // Failure links breadth first; a node's out_ is its own token, else its failure node's
  // (shallower, so already final): the longest token that is a suffix of the node's string.
  std::deque<std::uint32_t> queue;
  for (std::uint32_t c = first_child_[0]; c != kNone; c = next_sibling_[c]) queue.push_back(c);
  while (!queue.empty()) {
    const std::uint32_t v = queue.front();
    queue.pop_front();
    for (std::uint32_t c = first_child_[v]; c != kNone; c = next_sibling_[c]) {
      std::uint32_t f = fail_[v], g;
      while ((g = child(f, byte_[c])) == kNone && f != 0) f = fail_[f];
      fail_[c] = g == kNone ? 0 : g;
      if (out_[c] == kNone) out_[c] = out_[fail_[c]];
      queue.push_back(c);
    }
  }
}

std::uint32_t AddedTokens::Scan::longest_at(std::size_t p) {
  if (p >= window_begin_ && p < window_end_) return longest_[p - window_begin_];
  const std::size_t n = text_.size();
  window_begin_ = p;
  window_end_ = std::min(n, p + std::max(kWindow, 2 * t_.longest_token_));
  longest_.assign(window_end_ - window_begin_, kNone);
  // From the root at least `longest token` bytes after the window (or the text's end): by then
  // the state is the one a pass from the text's end would have.
  const std::size_t start = std::min(n, window_end_ + t_.longest_token_);
  std::uint32_t state = 0;
  for (std::size_t q = start; q-- > window_begin_;) {
    const auto b = static_cast<unsigned char>(text_[q]);
    std::uint32_t next;
    while ((next = t_.child(state, b)) == kNone && state != 0) state = t_.fail_[state];
    state = next == kNone ? 0 : next;
    if (q < window_end_) longest_[q - window_begin_] = t_.out_[state];
  }
  return longest_[0];
}

bool AddedTokens::Scan::next(std::size_t from, std::size_t& b, std::size_t& e, std::size_t& tok) {
  const std::size_t n = text_.size();
  for (std::size_t p = from; p < n; ++p) {
    const std::uint32_t i = longest_at(p);
    if (i == kNone) continue;
    const AddedToken& t = t_.tokens_[i];
    std::size_t mb = p, me = p + t.content.size();
    if (t.single_word) {
      bool word_before = mb > 0 && is_word_char(code_point_before(text_, mb));
      std::size_t len;
      bool word_after = me < n && is_word_char(decode_utf8(text_, me, len));
      if (word_before || word_after) {
        p = me - 1;  // skipped whole; the loop's ++p resumes after it
        continue;
      }
    }
    if (t.lstrip)
      while (mb > from && is_space(code_point_before(text_, mb))) {
        std::size_t q = mb - 1;
        while (q > 0 && (static_cast<unsigned char>(text_[q]) & 0xC0) == 0x80) --q;
        mb = q;
      }
    if (t.rstrip)
      while (me < n) {
        std::size_t len;
        if (!is_space(decode_utf8(text_, me, len))) break;
        me += len;
      }
    b = mb;
    e = me;
    tok = i;
    return true;
  }
  return false;
}

}  // namespace shardtrain::data
