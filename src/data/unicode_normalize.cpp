// unicode_normalize(): the NFC/NFD/NFKC/NFKD normalizers of tokenizer.json files (Qwen2 uses
// NFC), through ICU. ASCII text is already normalized in every form and is copied as is.
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "hf_tokenizer_spec.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {

void unicode_normalize(const std::string& form, std::string_view in, std::string& out) {
  out.clear();
  bool ascii = true;
  for (unsigned char c : in) ascii = ascii && c < 0x80;
  if (ascii) {
    out.assign(in);
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                              : form == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                              : form == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                               : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) throw Error(std::string("ICU: no ") + form + " normalizer: " + u_errorName(status));
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(in.data(), static_cast<std::int32_t>(in.size())));
  icu::UnicodeString r = n->normalize(u, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU ") + form + " normalization failed: " + u_errorName(status));
  r.toUTF8String(out);
}

}  // namespace shardtrain::data
