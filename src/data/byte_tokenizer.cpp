// The byte-level tokenizer: identity between bytes and ids.
#include "shardtrain/data/byte_tokenizer.h"

#include "shardtrain/util/error.h"

namespace shardtrain::data {

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids;
  encode_append(text, ids);
  return ids;
}
void ByteTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) {
  out.reserve(out.size() + text.size());
  for (unsigned char c : text) out.push_back(c);
}
std::string ByteTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ST_USER_CHECK(ids[i] >= 0 && ids[i] < 256, "byte tokenizer: id ", ids[i], " at position ", i,
                  " is outside [0, 256)");
    s.push_back(static_cast<char>(ids[i]));
  }
  return s;
}

}  // namespace shardtrain::data
