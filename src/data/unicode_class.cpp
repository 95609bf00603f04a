// Unicode classification by binary search over the generated range tables, with an ASCII
// fast path (nearly all of an English corpus).
#include "shardtrain/data/unicode_class.h"

#include <algorithm>

namespace shardtrain::data {
namespace {
bool in_table(const CodeRange* t, std::size_t n, char32_t cp) {
  const CodeRange* end = t + n;
  // First range whose last >= cp.
  const CodeRange* it = std::lower_bound(t, end, cp, [](const CodeRange& r, char32_t c) { return r.last < c; });
  return it != end && it->first <= cp;
}
}  // namespace

CharClass classify(char32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    if (cp == ' ' || (cp >= 9 && cp <= 13)) return CharClass::Space;
    return CharClass::Other;
  }
  if (cp == kInvalidCodePoint) return CharClass::Other;
  using namespace unicode_tables;
  if (in_table(kLetter, kLetter_count, cp)) return CharClass::Letter;
  if (in_table(kNumber, kNumber_count, cp)) return CharClass::Number;
  if (in_table(kSpace, kSpace_count, cp)) return CharClass::Space;
  return CharClass::Other;
}

char32_t decode_utf8(std::string_view s, std::size_t pos, std::size_t& len) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(pos);
  len = 1;
  if (c < 0x80) return c;
  std::size_t n;
  char32_t cp, min;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
  else return kInvalidCodePoint;
  if (pos + n > s.size()) return kInvalidCodePoint;
  for (std::size_t i = 1; i < n; ++i) {
    if ((b(pos + i) & 0xC0) != 0x80) return kInvalidCodePoint;
    cp = (cp << 6) | (b(pos + i) & 0x3F);
  }
  // Overlong forms, surrogates and out-of-range values are not valid UTF-8.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidCodePoint;
  len = n;
  return cp;
}

}  // namespace shardtrain::data
