// The GPT-2 pre-tokenization scanner. Alternatives are tried in the pattern's order, each
// greedy, exactly as a backtracking regex engine would; the comments name the alternative.
#include "shardtrain/data/pretokenize.h"

#include "shardtrain/data/unicode_class.h"

namespace shardtrain::data {
namespace {
struct Cp {
  CharClass cls;
  std::size_t len;
};
Cp at(std::string_view t, std::size_t pos) {
  std::size_t len;
  char32_t cp = decode_utf8(t, pos, len);
  return {classify(cp), len};
}
// End of the run of code points of class `cls` starting at pos (pos itself if none).
std::size_t run_of(std::string_view t, std::size_t pos, CharClass cls) {
  while (pos < t.size()) {
    Cp c = at(t, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}
std::size_t run_of_other(std::string_view t, std::size_t pos) { return run_of(t, pos, CharClass::Other); }
}  // namespace

std::size_t pretoken_length(std::string_view t, std::size_t pos) {
  // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, ASCII apostrophe only)
  if (t[pos] == '\'' && pos + 1 < t.size()) {
    char a = t[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 < t.size()) {
      char b = t[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  // ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional ASCII space then a run of X.
  std::size_t q = pos + (t[pos] == ' ' ? 1 : 0);
  if (q < t.size()) {
    Cp c = at(t, q);
    if (c.cls == CharClass::Letter) return run_of(t, q, CharClass::Letter) - pos;
    if (c.cls == CharClass::Number) return run_of(t, q, CharClass::Number) - pos;
    if (c.cls == CharClass::Other) return run_of_other(t, q) - pos;
  }
  // Here t[pos] is whitespace (a lone space at the end also lands here).
  // \s+(?!\S): the whole run if it reaches the end of text or the next char is whitespace
  // (impossible: the run is maximal), else the run minus its last code point, when that
  // leaves at least one; then \s+ takes the one remaining code point.
  std::size_t end = run_of(t, pos, CharClass::Space);
  if (end == pos) return at(t, pos).len;  // unreachable: every class is handled above
  if (end == t.size()) return end - pos;
  // Step back over the last whitespace code point (1 to 3 bytes: find its lead byte).
  std::size_t last = end - 1;
  while (last > pos && (static_cast<unsigned char>(t[last]) & 0xC0) == 0x80) --last;
  return last > pos ? last - pos : end - pos;
}

std::size_t llama3_pretoken_length(std::string_view t, std::size_t pos, int max_digits) {
  const std::size_t n = t.size();
  auto newline = [&](std::size_t p) { return t[p] == '\r' || t[p] == '\n'; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): ASCII letters either case, and U+017F (long s), which
  // Unicode case folding makes an s.
  if (t[pos] == '\'' && pos + 1 < n) {
    auto lower = [](char ch) { return ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch + 32) : ch; };
    const char a = lower(t[pos + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 < n) {
      if (static_cast<unsigned char>(t[pos + 1]) == 0xC5 && static_cast<unsigned char>(t[pos + 2]) == 0xBF) return 3;
      const char b = lower(t[pos + 2]);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  const Cp c0 = at(t, pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+: letters, or one other code point (not a newline) then letters.
  if (c0.cls == CharClass::Letter) return run_of(t, pos, CharClass::Letter) - pos;
  if (c0.cls != CharClass::Number && !newline(pos) && pos + c0.len < n && at(t, pos + c0.len).cls == CharClass::Letter)
    return run_of(t, pos + c0.len, CharClass::Letter) - pos;
  // \p{N}{1,max_digits}
  if (c0.cls == CharClass::Number) {
    std::size_t p = pos;
    for (int k = 0; k < max_digits && p < n; ++k) {
      const Cp c = at(t, p);
      if (c.cls != CharClass::Number) break;
      p += c.len;
    }
    return p - pos;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const std::size_t q = pos + (t[pos] == ' ' ? 1 : 0);
  if (q < n && at(t, q).cls == CharClass::Other) {
    std::size_t e = run_of_other(t, q);
    while (e < n && newline(e)) ++e;
    return e - pos;
  }
  // Here t[pos] is whitespace. \s*[\r\n]+: through the run's last newline, when it has one.
  const std::size_t end = run_of(t, pos, CharClass::Space);
  if (end == pos) return c0.len;  // unreachable: every class is handled above
  std::size_t after_newline = 0;
  for (std::size_t p = pos; p < end; ++p)
    if (newline(p)) after_newline = p + 1;
  if (after_newline) return after_newline - pos;
  // \s+(?!\S), else \s+: as in pretoken_length().
  if (end == n) return end - pos;
  std::size_t last = end - 1;
  while (last > pos && (static_cast<unsigned char>(t[last]) & 0xC0) == 0x80) --last;
  return last > pos ? last - pos : end - pos;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  for_each_pretoken(text, [&](std::string_view c) { out.push_back(c); });
  return out;
}

}  // namespace shardtrain::data
