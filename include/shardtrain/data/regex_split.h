// SplitRegex: a compiled PCRE2 pattern (UTF + Unicode properties, JIT) that splits text into
// the matches and the gaps between them, as the Hugging Face pre-tokenizers' `Split` does.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace shardtrain::data {

class SplitRegex {
 public:
  // Compiles `pattern` (or matches it as a literal string when `literal`). A pattern PCRE2
  // cannot compile is a UserError that starts with `what` (the file and key it came from).
  SplitRegex(const std::string& pattern, bool literal, const std::string& what);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Per-thread match state (PCRE2 match data and JIT stack); the compiled pattern is shared.
  class Matcher {
   public:
    explicit Matcher(std::shared_ptr<const SplitRegex> re);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // The first non-empty match in text[from, end): sets [begin, end) and returns true, or
    // returns false when there is none. Invalid UTF-8 never matches (PCRE2_MATCH_INVALID_UTF).
    bool find(std::string_view text, std::size_t from, std::size_t& begin, std::size_t& end);

   private:
    std::shared_ptr<const SplitRegex> re_;
    void* match_data_ = nullptr;
    void* context_ = nullptr;
    void* jit_stack_ = nullptr;
  };

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_, what_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
  friend class Matcher;
};

}  // namespace shardtrain::data
