// SplitRegex over PCRE2 (8-bit code units). PCRE2 is used because the split patterns that
// tokenizer.json files declare need \p{L}/\p{N} and lookahead (\s+(?!\S)), which std::regex
// lacks; UTF + UCP make \s, \d and case folding Unicode-aware as in the reference libraries.
#include "shardtrain/data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& what)
    : pattern_(pattern), what_(what) {
  int err = 0;
  PCRE2_SIZE off = 0;
  // PCRE2_LITERAL admits no UCP (a literal has no classes to make Unicode-aware).
  std::uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!code_)
    throw UserError(what + ": the pattern '" + pattern + "' does not compile (at offset " + std::to_string(off) +
                    "): " + pcre2_message(err));
  jit_ = pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

SplitRegex::Matcher::Matcher(std::shared_ptr<const SplitRegex> re) : re_(std::move(re)) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re_->code_), nullptr);
  context_ = pcre2_match_context_create(nullptr);
  if (re_->jit_) {
    // Long whitespace runs backtrack through \s+(?!\S): give the JIT more than its 32 KiB default.
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 4 << 20, nullptr);
    pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(context_), nullptr, jit_stack_);
  }
  if (!match_data_ || !context_) throw Error("PCRE2: out of memory creating match data");
}

SplitRegex::Matcher::~Matcher() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

bool SplitRegex::Matcher::find(std::string_view text, std::size_t from, std::size_t& begin, std::size_t& end) {
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  auto* code = static_cast<pcre2_code*>(re_->code_);
  auto* ctx = static_cast<pcre2_match_context*>(context_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (from < text.size()) {
    int rc = re_->jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, md, ctx)
                       : pcre2_match(code, subject, text.size(), from, 0, md, ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0)
      throw UserError(re_->what_ + ": matching the pattern '" + re_->pattern_ + "' failed: " + pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      begin = ov[0];
      end = ov[1];
      return true;
    }
    // An empty match splits nothing: look again one code point further.
    std::size_t p = ov[0] + 1;
    while (p < text.size() && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) ++p;
    from = p;
  }
  return false;
}

}  // namespace shardtrain::data
