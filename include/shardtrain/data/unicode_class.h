// Unicode classification (letter / number / whitespace) and UTF-8 decoding for the
// GPT-2 pre-tokenizer; classes follow JS regex semantics (\p{L}, \p{N}, \s with the u flag).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardtrain::data {

struct CodeRange {
  char32_t first, last;  // inclusive
};

namespace unicode_tables {
extern const CodeRange kLetter[];
extern const std::size_t kLetter_count;
extern const CodeRange kNumber[];
extern const std::size_t kNumber_count;
extern const CodeRange kSpace[];
extern const std::size_t kSpace_count;
}  // namespace unicode_tables

enum class CharClass : std::uint8_t { Letter, Number, Space, Other };

// Class of one code point. Invalid code points (see decode_utf8) are Other.
CharClass classify(char32_t cp);

// Decodes the code point starting at s[pos]; sets `len` to its byte length (1..4).
// Invalid or truncated sequences decode as one byte with value kInvalidCodePoint, so that
// byte-level BPE still round-trips arbitrary bytes.
constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;
char32_t decode_utf8(std::string_view s, std::size_t pos, std::size_t& len);

}  // namespace shardtrain::data
