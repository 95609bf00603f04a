// GPT-2 byte-level BPE. Vocabulary strings are converted back to raw bytes at load time, and
// merges to (left id, right id) -> (rank, merged id), so BPE runs on int ids, not strings.
#include "shardtrain/data/gpt2_tokenizer.h"

#include <nlohmann/json.hpp>

#include <limits>

#include "shardtrain/data/paths.h"
#include "shardtrain/data/pretokenize.h"
#include "shardtrain/data/unicode_class.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {
// bytes_to_unicode(): printable Latin-1 bytes stand for themselves; the other 68 bytes are
// mapped, in order, to U+0100.. so that every byte has a visible, non-space symbol.
struct ByteMap {
  char32_t to_unicode[256];
  std::int16_t from_unicode[512];  // code point -> byte, -1 if not a byte symbol
  ByteMap() {
    for (auto& v : from_unicode) v = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      from_unicode[to_unicode[b]] = static_cast<std::int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Converts a vocabulary string (UTF-8 of byte symbols) back to the raw bytes it stands for.
bool symbols_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  for (std::size_t pos = 0; pos < s.size();) {
    std::size_t len;
    char32_t cp = decode_utf8(s, pos, len);
    if (cp == kInvalidCodePoint || cp >= 512 || byte_map().from_unicode[cp] < 0) return false;
    out.push_back(static_cast<char>(byte_map().from_unicode[cp]));
    pos += len;
  }
  return true;
}
}  // namespace

char32_t gpt2_byte_to_unicode(unsigned char b) { return byte_map().to_unicode[b]; }

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
  auto v = std::make_shared<Vocab>();
  auto& id_to_bytes = v->id_to_bytes;
  auto& byte_id = v->byte_id;
  auto& merges = v->merges;
  auto& eot_id = v->eot_id;
  // encoder.json: {"<symbols>": id, ...}
  std::string text = read_file(encoder_json_path, kMaxAuxFileBytes, "GPT-2 encoder.json");
  nlohmann::json j;
  try {
    check_json_depth(text, kMaxJsonDepth, "'" + encoder_json_path + "'");
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + encoder_json_path + "' is not valid JSON: " + e.what());
  }
  ST_USER_CHECK(j.is_object() && !j.empty(), "'", encoder_json_path, "' must be a JSON object of token -> id");
  id_to_bytes.assign(j.size(), std::string());
  std::vector<bool> seen(j.size(), false);
  std::unordered_map<std::string, std::int32_t> bytes_to_id;
  bytes_to_id.reserve(j.size());
  std::string raw;
  for (auto& [key, val] : j.items()) {
    ST_USER_CHECK(val.is_number_integer(), "'", encoder_json_path, "': the id of token '", key,
                  "' is not an integer");
    std::int64_t id = val.get<std::int64_t>();
    ST_USER_CHECK(id >= 0 && id < static_cast<std::int64_t>(j.size()) && !seen[id], "'", encoder_json_path,
                  "': token '", key, "' has id ", id, ", outside [0, ", j.size(), ") or repeated");
    seen[id] = true;
    if (key == "<|endoftext|>") {
      // A special token: its text is not byte symbols; it decodes to its literal spelling.
      eot_id = static_cast<std::int32_t>(id);
      id_to_bytes[id] = key;
      continue;
    }
    ST_USER_CHECK(symbols_to_bytes(key, raw), "'", encoder_json_path, "': token '", key,
                  "' (id ", id, ") contains a character that is not a GPT-2 byte symbol");
    id_to_bytes[id] = raw;
    bytes_to_id.emplace(raw, static_cast<std::int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    ST_USER_CHECK(it != bytes_to_id.end(), "'", encoder_json_path, "' lacks the single-byte token for byte ", b);
    byte_id[b] = it->second;
  }

  // vocab.bpe: a "#version" line, one merge "<left> <right>" per line, in rank order. Like
  // encoder.py (bpe_data.split("\n")[1:-1]) the first and the last line are not merges.
  std::string bpe = read_file(vocab_bpe_path, kMaxAuxFileBytes, "GPT-2 vocab.bpe");
  std::vector<std::string_view> lines;
  for (std::size_t start = 0;;) {
    std::size_t nl = bpe.find('\n', start);
    lines.emplace_back(std::string_view(bpe).substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  ST_USER_CHECK(lines.size() >= 2, "'", vocab_bpe_path, "' has no merges");
  merges.reserve(lines.size());
  std::string left, right;
  for (std::size_t i = 1; i + 1 < lines.size(); ++i) {
    std::string_view l = lines[i];
    std::size_t a0 = l.find_first_not_of(" \t\r"), a1 = l.find_first_of(" \t\r", a0);
    std::size_t b0 = l.find_first_not_of(" \t\r", a1), b1 = l.find_first_of(" \t\r", b0);
    ST_USER_CHECK(a0 != std::string_view::npos && b0 != std::string_view::npos &&
                      l.find_first_not_of(" \t\r", b1) == std::string_view::npos,
                  "'", vocab_bpe_path, "' line ", i + 1, ": expected two symbols, found '", l, "'");
    bool ok = symbols_to_bytes(l.substr(a0, a1 - a0), left) &&
              symbols_to_bytes(l.substr(b0, b1 == std::string_view::npos ? b1 : b1 - b0), right);
    ST_USER_CHECK(ok, "'", vocab_bpe_path, "' line ", i + 1, ": '", l, "' has a non-byte symbol");
    auto li = bytes_to_id.find(left), ri = bytes_to_id.find(right), mi = bytes_to_id.find(left + right);
    ST_USER_CHECK(li != bytes_to_id.end() && ri != bytes_to_id.end() && mi != bytes_to_id.end(), "'",
                  vocab_bpe_path, "' line ", i + 1, ": merge '", l, "' uses or makes a token missing from '",
                  encoder_json_path, "'");
    // A repeated merge keeps its last rank, as dict(zip(merges, range(n))) does.
    merges.insert_or_assign(pair_key(li->second, ri->second),
                             Merge{static_cast<std::int32_t>(i - 1), mi->second});
  }
  v_ = std::move(v);
}

std::unique_ptr<Tokenizer> Gpt2Tokenizer::for_thread() const {
  return std::unique_ptr<Tokenizer>(new Gpt2Tokenizer(v_));
}

const std::string& Gpt2Tokenizer::token_bytes(std::int32_t id) const {
  ST_USER_CHECK(id >= 0 && id < static_cast<std::int32_t>(v_->id_to_bytes.size()), "gpt2 tokenizer: id ", id,
                " is outside [0, ", v_->id_to_bytes.size(), ")");
  return v_->id_to_bytes[id];
}

void Gpt2Tokenizer::bpe_chunk(std::string_view chunk, std::vector<std::int32_t>& out) {
  auto& w = work_;
  w.clear();
  for (unsigned char c : chunk) w.push_back(v_->byte_id[c]);
  if (w.size() > 1) {
    auto hit = cache_.find(std::string(chunk));
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    // Repeatedly merge every occurrence of the lowest-ranked adjacent pair (encoder.py's bpe()).
    while (w.size() > 1) {
      std::int32_t best_rank = std::numeric_limits<std::int32_t>::max(), best_merged = -1;
      std::int32_t first = -1, second = -1;
      for (std::size_t i = 0; i + 1 < w.size(); ++i) {
        auto it = v_->merges.find(pair_key(w[i], w[i + 1]));
        if (it != v_->merges.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          best_merged = it->second.merged;
          first = w[i];
          second = w[i + 1];
        }
      }
      if (best_merged < 0) break;
      next_.clear();
      for (std::size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == first && w[i + 1] == second) {
          next_.push_back(best_merged);
          i += 2;
        } else {
          next_.push_back(w[i++]);
        }
      }
      w.swap(next_);
    }
    if (cache_.size() >= kMaxCache) cache_.clear();
    cache_.emplace(std::string(chunk), w);
  }
  out.insert(out.end(), w.begin(), w.end());
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) {
  for_each_pretoken(text, [&](std::string_view chunk) { bpe_chunk(chunk, out); });
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> ids;
  encode_append(text, ids);
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ST_USER_CHECK(ids[i] >= 0 && ids[i] < static_cast<std::int32_t>(v_->id_to_bytes.size()), "gpt2 tokenizer: id ",
                  ids[i], " at position ", i, " is outside [0, ", v_->id_to_bytes.size(), ")");
    s += v_->id_to_bytes[ids[i]];
  }
  return s;
}

}  // namespace shardtrain::data
