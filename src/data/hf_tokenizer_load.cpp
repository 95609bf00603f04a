// Reads a tokenizer.json (and tokenizer_config.json) into HfBpeTokenizer::Spec. Every key the
// encoder depends on is checked here, so a file that loads encodes as the file says; a type or
// option it does not implement is a UserError naming the file and the key, never ignored.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "hf_tokenizer_spec.h"
#include "shardtrain/data/gpt2_tokenizer.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/unicode_class.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/model_limits.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {
using json = nlohmann::json;
using Spec = HfBpeTokenizer::Spec;

// The GPT-2 byte symbols back to bytes (the inverse of gpt2_byte_to_unicode()).
struct ByteSymbols {
  std::int16_t from_unicode[512];
  ByteSymbols() {
    std::fill(std::begin(from_unicode), std::end(from_unicode), std::int16_t{-1});
    for (int b = 0; b < 256; ++b) from_unicode[gpt2_byte_to_unicode(static_cast<unsigned char>(b))] = static_cast<std::int16_t>(b);
  }
};
bool symbols_to_bytes(std::string_view s, std::string& out) {
  static const ByteSymbols m;
  out.clear();
  for (std::size_t pos = 0; pos < s.size();) {
    std::size_t len;
    char32_t cp = decode_utf8(s, pos, len);
    if (cp == kInvalidCodePoint || cp >= 512 || m.from_unicode[cp] < 0) return false;
    out.push_back(static_cast<char>(m.from_unicode[cp]));
    pos += len;
  }
  return true;
}

// Error helpers: "'<file>': <key>: <what>".
struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError("'" + file + "': " + key + ": " + what);
  }
  const json& get(const json& j, const char* k, const std::string& key) const {
    if (!j.is_object() || !j.contains(k)) fail(key + "." + k, "missing");
    return j.at(k);
  }
  std::string str(const json& j, const char* k, const std::string& key) const {
    const json& v = get(j, k, key);
    if (!v.is_string()) fail(key + "." + k, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& j, const char* k, const std::string& key, bool def) const {
    if (!j.is_object() || !j.contains(k) || j.at(k).is_null()) return def;
    if (!j.at(k).is_boolean()) fail(key + "." + k, "expected true or false");
    return j.at(k).get<bool>();
  }
  std::string type(const json& j, const std::string& key) const {
    if (!j.is_object()) fail(key, "expected an object");
    return str(j, "type", key);
  }
  [[noreturn]] void unsupported(const std::string& key, const std::string& t) const {
    fail(key + ".type", "'" + t + "' is not supported (see docs/data.md, Model tokenizers)");
  }
};

json parse_json_file(const std::string& path, const char* what) {
  std::string text = read_file(path, kMaxAuxFileBytes, what);
  try {
    check_json_depth(text, kMaxJsonDepth, "'" + path + "'");
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UserError("'" + path + "' is not valid JSON (truncated or not a " + what + "): " + e.what());
  }
}

// A pattern object {"Regex": "..."} or {"String": "..."}.
std::shared_ptr<const SplitRegex> pattern_of(const Ctx& c, const json& p, const std::string& key) {
  if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string())
    return std::make_shared<SplitRegex>(p.at("Regex").get<std::string>(), false, "'" + c.file + "': " + key);
  if (p.is_object() && p.contains("String") && p.at("String").is_string())
    return std::make_shared<SplitRegex>(p.at("String").get<std::string>(), true, "'" + c.file + "': " + key);
  c.fail(key, "expected {\"Regex\": ...} or {\"String\": ...}");
}

void add_normalizer(const Ctx& c, const json& j, const std::string& key, Spec& s) {
  if (j.is_null()) return;
  const std::string t = c.type(j, key);
  if (t == "Sequence") {
    const json& list = c.get(j, "normalizers", key);
    if (!list.is_array()) c.fail(key + ".normalizers", "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      add_normalizer(c, list[i], key + ".normalizers[" + std::to_string(i) + "]", s);
  } else if (t == "Prepend") {
    s.normalizer.push_back({Spec::NormStep::Prepend, c.str(j, "prepend", key), ""});
  } else if (t == "Replace") {
    const json& p = c.get(j, "pattern", key);
    if (!p.is_object() || !p.contains("String") || !p.at("String").is_string())
      c.fail(key + ".pattern", "only {\"String\": ...} patterns are supported in a Replace normalizer");
    std::string from = p.at("String").get<std::string>();
    if (from.empty()) c.fail(key + ".pattern", "empty pattern");
    s.normalizer.push_back({Spec::NormStep::Replace, from, c.str(j, "content", key)});
  } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    s.normalizer.push_back({Spec::NormStep::Unicode, t, ""});
  } else {
    c.unsupported(key, t);
  }
}

SplitBehavior behavior_of(const Ctx& c, const json& j, const std::string& key) {
  const std::string b = c.str(j, "behavior", key);
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  c.fail(key + ".behavior", "'" + b + "' is not a split behavior");
}

// GPT-2's split, which ByteLevel(use_regex = true) applies.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// The split patterns of Llama 3 and Qwen2 tokenizer.json files (run by llama3_pretoken_length()).
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

void add_pre_tokenizer(const Ctx& c, const json& j, const std::string& key, Spec& s) {
  if (j.is_null()) return;
  const std::string t = c.type(j, key);
  if (s.byte_level) c.fail(key, "a pre-tokenizer after ByteLevel is not supported");
  using P = Spec::PreStep;
  if (t == "Sequence") {
    const json& list = c.get(j, "pretokenizers", key);
    if (!list.is_array()) c.fail(key + ".pretokenizers", "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      add_pre_tokenizer(c, list[i], key + ".pretokenizers[" + std::to_string(i) + "]", s);
  } else if (t == "Split") {
    P p;
    p.kind = P::Split;
    p.re = pattern_of(c, c.get(j, "pattern", key), key + ".pattern");
    p.behavior = behavior_of(c, j, key);
    p.invert = c.flag(j, "invert", key, false);
    if (p.behavior == SplitBehavior::Isolated && !p.invert && c.get(j, "pattern", key).contains("Regex")) {
      const std::string& re = p.re->pattern();
      if (re == kGpt2Pattern) p.scanner = P::Gpt2Scanner;
      if (re == kLlama3Pattern || re == kQwen2Pattern) {
        p.scanner = P::Llama3Scanner;
        p.max_digits = re == kLlama3Pattern ? 3 : 1;
      }
    }
    s.pre.push_back(std::move(p));
  } else if (t == "Digits") {
    P p;
    p.kind = P::Split;
    const bool individual = c.flag(j, "individual_digits", key, false);
    p.re = std::make_shared<SplitRegex>(individual ? "\\p{N}" : "\\p{N}+", false, "'" + c.file + "': " + key);
    s.pre.push_back(std::move(p));
  } else if (t == "ByteLevel") {
    P p;
    p.kind = P::ByteLevel;
    p.add_prefix_space = c.flag(j, "add_prefix_space", key, true);
    if (c.flag(j, "use_regex", key, true)) {
      p.re = std::make_shared<SplitRegex>(kGpt2Pattern, false, "ByteLevel");
      p.scanner = P::Gpt2Scanner;
    }
    s.pre.push_back(std::move(p));
    s.byte_level = true;
  } else if (t == "Metaspace") {
    P p;
    p.kind = P::Metaspace;
    p.replacement = c.str(j, "replacement", key);
    std::size_t len = 0;
    if (p.replacement.empty() || (decode_utf8(p.replacement, 0, len), len != p.replacement.size()))
      c.fail(key + ".replacement", "expected one character");
    if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
      const std::string ps = c.str(j, "prepend_scheme", key);
      if (ps == "always") p.prepend = P::Always;
      else if (ps == "first") p.prepend = P::First;
      else if (ps == "never") p.prepend = P::Never;
      else c.fail(key + ".prepend_scheme", "'" + ps + "' is not always, first or never");
    } else {
      p.prepend = c.flag(j, "add_prefix_space", key, true) ? P::Always : P::Never;
    }
    p.split = c.flag(j, "split", key, true);
    s.pre.push_back(std::move(p));
  } else {
    c.unsupported(key, t);
  }
}

// The ids of one post-processor template ("single"): before and after the sequence.
void add_post_processor(const Ctx& c, const json& j, const std::string& key, Spec& s) {
  if (j.is_null()) return;
  const std::string t = c.type(j, key);
  if (t == "Sequence") {
    const json& list = c.get(j, "processors", key);
    if (!list.is_array()) c.fail(key + ".processors", "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      add_post_processor(c, list[i], key + ".processors[" + std::to_string(i) + "]", s);
  } else if (t == "ByteLevel") {
    // Offsets only: the ids do not change.
  } else if (t == "TemplateProcessing") {
    const json& single = c.get(j, "single", key);
    const json& specials = c.get(j, "special_tokens", key);
    if (!single.is_array()) c.fail(key + ".single", "expected an array");
    bool seen_sequence = false;
    s.prefix.clear();
    s.suffix.clear();
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string k = key + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string id = c.str(item.at("SpecialToken"), "id", k + ".SpecialToken");
        if (!specials.is_object() || !specials.contains(id)) c.fail(key + ".special_tokens", "no entry for '" + id + "'");
        const json& ids = c.get(specials.at(id), "ids", key + ".special_tokens." + id);
        if (!ids.is_array()) c.fail(key + ".special_tokens." + id + ".ids", "expected an array of ids");
        for (const auto& v : ids) {
          if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > INT32_MAX)
            c.fail(key + ".special_tokens." + id + ".ids", "expected ids");
          (seen_sequence ? s.suffix : s.prefix).push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
        }
      } else {
        c.fail(k, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_sequence) c.fail(key + ".single", "the template has no sequence");
  } else if (t == "RobertaProcessing" || t == "BertProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const json& v = c.get(j, k, key);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer()) c.fail(key + "." + k, "expected [token, id]");
      (std::string(k) == "cls" ? s.prefix : s.suffix).assign(1, v[1].get<std::int32_t>());
    }
  } else {
    c.unsupported(key, t);
  }
}

// Decoder: per-token text replacements and byte fallback are folded into id_bytes; returns
// how the decoder treats the model's tokens.
struct DecoderSteps {
  bool byte_level = false, byte_fallback = false;
  std::vector<std::pair<std::string, std::string>> replace;
  int strip_leading = 0;
};
void add_decoder(const Ctx& c, const json& j, const std::string& key, DecoderSteps& d) {
  if (j.is_null()) return;
  const std::string t = c.type(j, key);
  if (t == "Sequence") {
    const json& list = c.get(j, "decoders", key);
    if (!list.is_array()) c.fail(key + ".decoders", "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      add_decoder(c, list[i], key + ".decoders[" + std::to_string(i) + "]", d);
  } else if (t == "ByteLevel") {
    d.byte_level = true;
  } else if (t == "ByteFallback") {
    d.byte_fallback = true;
  } else if (t == "Fuse") {
  } else if (t == "Replace") {
    const json& p = c.get(j, "pattern", key);
    if (!p.is_object() || !p.contains("String") || !p.at("String").is_string())
      c.fail(key + ".pattern", "only {\"String\": ...} patterns are supported in a Replace decoder");
    d.replace.emplace_back(p.at("String").get<std::string>(), c.str(j, "content", key));
  } else if (t == "Strip") {
    const std::string content = c.str(j, "content", key);
    const json& start = c.get(j, "start", key);
    const json& stop = c.get(j, "stop", key);
    if (content != " " || !start.is_number_integer() || !stop.is_number_integer() || stop.get<int>() != 0 ||
        start.get<int>() < 0 || start.get<int>() > 16)
      c.fail(key, "only Strip of leading spaces (content \" \", stop 0) is supported");
    d.strip_leading = start.get<int>();
  } else if (t == "Metaspace") {
    std::string r = c.str(j, "replacement", key);
    d.replace.emplace_back(r, " ");
    bool prepend = true;
    if (j.contains("prepend_scheme") && j.at("prepend_scheme").is_string())
      prepend = j.at("prepend_scheme").get<std::string>() != "never";
    else
      prepend = c.flag(j, "add_prefix_space", key, true);
    if (prepend) d.strip_leading = 1;
  } else {
    c.unsupported(key, t);
  }
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

// "<0x0A>" -> 10, else -1.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  unsigned v = 0;
  for (int i = 3; i < 5; ++i) {
    char ch = t[i];
    v = v * 16 + (ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : 99);
  }
  return v < 256 ? static_cast<int>(v) : -1;
}

// bos_token / eos_token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string config_token(const json& cfg, const char* k) {
  if (!cfg.is_object() || !cfg.contains(k)) return "";
  const json& v = cfg.at(k);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}
}  // namespace

std::shared_ptr<Spec> load_hf_tokenizer(const HfTokenizerFiles& files, const TokenizerOptions& options) {
  auto s = std::make_shared<Spec>();
  s->file = files.tokenizer_json;
  s->name = files.name;
  Ctx c{files.tokenizer_json};
  const json j = parse_json_file(files.tokenizer_json, "tokenizer.json");
  if (!j.is_object()) c.fail("(top level)", "expected a JSON object");

  add_normalizer(c, j.value("normalizer", json()), "normalizer", *s);
  add_pre_tokenizer(c, j.value("pre_tokenizer", json()), "pre_tokenizer", *s);

  // model
  const json& m = c.get(j, "model", "(top level)");
  if (!m.is_object()) c.fail("model", "expected an object");
  const std::string mt = m.contains("type") ? c.str(m, "type", "model") : "BPE";
  if (mt != "BPE")
    c.fail("model.type", "'" + mt + "' is not supported: only BPE models are (WordPiece, Unigram and WordLevel are not)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m.at(k).is_null() && !(m.at(k).is_string() && m.at(k).get<std::string>().empty()))
      c.fail(std::string("model.") + k, "is not supported");
  if (m.contains("dropout") && !m.at("dropout").is_null() &&
      !(m.at("dropout").is_number() && m.at("dropout").get<double>() == 0.0))
    c.fail("model.dropout", "BPE dropout is not supported");
  s->byte_fallback = c.flag(m, "byte_fallback", "model", false);
  s->fuse_unk = c.flag(m, "fuse_unk", "model", false);
  s->ignore_merges = c.flag(m, "ignore_merges", "model", false);

  const json& vocab = c.get(m, "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) c.fail("model.vocab", "expected a non-empty object of token -> id");
  std::int64_t max_id = -1;
  std::vector<std::pair<std::int32_t, std::string>> spelled;  // id -> spelling
  spelled.reserve(vocab.size());
  s->vocab.reserve(vocab.size());
  s->vocab_spelling.reserve(vocab.size());
  std::string key;
  for (const auto& [tok, v] : vocab.items()) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= (std::int64_t{1} << 31) - 1)
      c.fail("model.vocab", "token '" + tok + "' has no valid id");
    const auto id = static_cast<std::int32_t>(v.get<std::int64_t>());
    max_id = std::max<std::int64_t>(max_id, id);
    if (!s->byte_level || !symbols_to_bytes(tok, key)) key = tok;
    s->vocab.emplace(key, id);
    s->vocab_spelling.emplace(tok, id);
    spelled.emplace_back(id, tok);
  }
  if (max_id >= limits::kMaxTokenizerIds) c.fail("model.vocab", "ids above 2^26 are not supported");
  auto lookup = [&](const std::string& k) {
    auto it = s->vocab.find(k);
    return it == s->vocab.end() ? -1 : it->second;
  };
  std::fill(std::begin(s->byte_id), std::end(s->byte_id), -1);
  std::fill(std::begin(s->fallback_id), std::end(s->fallback_id), -1);
  std::fill(std::begin(s->ascii_id), std::end(s->ascii_id), -1);
  for (int b = 0; b < 256; ++b) {
    s->byte_id[b] = lookup(std::string(1, static_cast<char>(b)));
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    auto it = s->vocab_spelling.find(hex);
    if (it != s->vocab_spelling.end()) s->fallback_id[b] = it->second;
    if (b < 128 && !s->byte_level) s->ascii_id[b] = s->byte_id[b];
  }
  if (s->byte_level)
    for (int b = 0; b < 256; ++b)
      if (s->byte_id[b] < 0) c.fail("model.vocab", "a byte-level vocabulary lacks the token of byte " + std::to_string(b));
  if (!s->byte_level && !s->ignore_merges) {
    std::string boundary;
    for (const auto& p : s->pre)
      if (p.kind == Spec::PreStep::Metaspace) boundary = p.replacement;
    for (const auto& n : s->normalizer)
      if (n.kind == Spec::NormStep::Replace && n.a == " ") boundary = n.b;
    bool safe = !boundary.empty() && s->vocab_spelling.count(boundary);
    for (auto it = s->vocab_spelling.begin(); safe && it != s->vocab_spelling.end(); ++it) {
      const std::string& t = it->first;
      std::size_t p = 0;
      while (t.compare(p, boundary.size(), boundary) == 0) p += boundary.size();
      safe = t.find(boundary, p) == std::string::npos;
    }
    if (safe) s->piece_boundary = boundary;
  }
  if (m.contains("unk_token") && !m.at("unk_token").is_null()) {
    const std::string unk = c.str(m, "unk_token", "model");
    auto it = s->vocab_spelling.find(unk);
    if (it == s->vocab_spelling.end()) c.fail("model.unk_token", "'" + unk + "' is not in model.vocab");
    s->unk_id = it->second;
  }

  const json& merges = c.get(m, "merges", "model");
  if (!merges.is_array()) c.fail("model.merges", "expected an array");
  std::unordered_map<std::uint64_t, Spec::Merge> merge_map;
  merge_map.reserve(merges.size());
  std::string a, b, ka, kb;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    const std::string k = "model.merges[" + std::to_string(i) + "]";
    if (e.is_string()) {
      const std::string line = e.get<std::string>();
      std::size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) c.fail(k, "expected \"left right\", found '" + line + "'");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      c.fail(k, "expected \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = s->vocab_spelling.find(a), ib = s->vocab_spelling.find(b), im = s->vocab_spelling.find(a + b);
    if (ia == s->vocab_spelling.end() || ib == s->vocab_spelling.end() || im == s->vocab_spelling.end())
      c.fail(k, "merge '" + a + " " + b + "' uses or makes a token missing from model.vocab");
    // A repeated merge keeps its last rank, as the library's map construction does.
    merge_map.insert_or_assign(Spec::pair_key(ia->second, ib->second),
                               Spec::Merge{static_cast<std::int32_t>(i), im->second});
  }
  s->merges.build(merge_map);

  // added tokens, with the ids the Hugging Face tokenizers library gives them when it reads the
  // file (tokenizer/serialization.rs -> AddedVocabulary::add_tokens): the file's "id" is not
  // used; a content already in the vocabulary takes its id there, a content listed before takes
  // that entry's id (the later entry's flags win), any other the next id after the vocabulary
  // (vocab size, then up), in the file's order; an empty content is ignored. A file whose ids
  // differ (two entries with one id, an id past the others) gets the library's ids and a warning.
  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
    const json& at = j.at("added_tokens");
    if (!at.is_array()) c.fail("added_tokens", "expected an array");
    std::unordered_map<std::string, std::size_t> index_of;  // content -> index in `added`
    std::int64_t next_id = static_cast<std::int64_t>(vocab.size()), text_bytes = 0, moved = 0;
    std::string first_moved;
    for (std::size_t i = 0; i < at.size(); ++i) {
      const std::string k = "added_tokens[" + std::to_string(i) + "]";
      const json& e = at[i];
      AddedToken t;
      const json& id = c.get(e, "id", k);
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= limits::kMaxTokenizerIds)
        c.fail(k + ".id", "expected an id in [0, 2^26)");
      const std::int64_t file_id = id.get<std::int64_t>();
      t.content = c.str(e, "content", k);
      t.special = c.flag(e, "special", k, false);
      t.lstrip = c.flag(e, "lstrip", k, false);
      t.rstrip = c.flag(e, "rstrip", k, false);
      t.single_word = c.flag(e, "single_word", k, false);
      t.normalized = c.flag(e, "normalized", k, !t.special);
      if (t.content.empty()) continue;
      text_bytes += static_cast<std::int64_t>(t.content.size());
      if (text_bytes > limits::kMaxAddedTokenBytes)
        c.fail("added_tokens", "their contents exceed " + std::to_string(limits::kMaxAddedTokenBytes) +
                                   " bytes together (the limit; at " + k + ")");
      std::int64_t assigned;
      if (auto it = index_of.find(t.content); it != index_of.end()) {
        assigned = added[it->second].id;
        t.id = added[it->second].id;
        added[it->second] = t;
      } else {
        auto v = s->vocab_spelling.find(t.content);
        assigned = v != s->vocab_spelling.end() ? v->second : next_id++;
        if (assigned >= limits::kMaxTokenizerIds) c.fail(k + ".id", "the ids go past 2^26");
        t.id = static_cast<std::int32_t>(assigned);
        index_of.emplace(t.content, added.size());
        added.push_back(t);
      }
      if (assigned != file_id && moved++ == 0)
        first_moved = k + " '" + t.content + "': id " + std::to_string(file_id) + " in the file, " + std::to_string(assigned);
    }
    if (moved > 0)
      log::warn("'" + c.file + "': " + std::to_string(moved) + " added token(s) get another id than the file says, as " +
                "the Hugging Face tokenizers library assigns them (the first: " + first_moved + ")");
    for (const AddedToken& t : added) {
      max_id = std::max<std::int64_t>(max_id, t.id);
      s->added_ids[t.content] = t.id;
    }
  }
  s->added = AddedTokens(added, options.specials_in_text);
  // Ids index dense tables (decoding): a file whose ids leave most of [0, max] unused would
  // make them huge.
  const std::int64_t n_tokens = static_cast<std::int64_t>(vocab.size() + added.size());
  if (max_id >= 2 * n_tokens + 1024)
    c.fail("model.vocab", "ids go up to " + std::to_string(max_id) + " for " + std::to_string(n_tokens) +
                              " tokens; such sparse ids are not supported");

  add_post_processor(c, j.value("post_processor", json()), "post_processor", *s);
  DecoderSteps dec;
  add_decoder(c, j.value("decoder", json()), "decoder", dec);
  s->strip_leading = dec.strip_leading;

  // id -> bytes
  const std::size_t n = static_cast<std::size_t>(max_id + 1);
  s->id_bytes.assign(n, std::string());
  s->id_known.assign(n, false);
  for (auto& [id, tok] : spelled) {
    std::string out;
    int bv = dec.byte_fallback ? byte_token_value(tok) : -1;
    if (bv >= 0) {
      out.assign(1, static_cast<char>(bv));
    } else if (dec.byte_level && symbols_to_bytes(tok, out)) {
    } else {
      out = tok;
      for (auto& [from, to] : dec.replace) replace_all(out, from, to);
    }
    s->id_bytes[id] = std::move(out);
    s->id_known[id] = true;
  }
  for (const auto& t : added) {
    s->id_bytes[t.id] = t.content;
    s->id_known[t.id] = true;
  }
  for (auto id : s->prefix) if (id >= static_cast<std::int64_t>(n) || !s->id_known[id]) c.fail("post_processor", "uses id " + std::to_string(id) + ", which has no token");
  for (auto id : s->suffix) if (id >= static_cast<std::int64_t>(n) || !s->id_known[id]) c.fail("post_processor", "uses id " + std::to_string(id) + ", which has no token");

  // bos / eos: tokenizer_config.json when given, else the template's first special token and
  // the usual end-of-text spellings.
  auto id_of = [&](const std::string& t) -> std::int32_t {
    auto it = s->added_ids.find(t);
    if (it != s->added_ids.end()) return it->second;
    auto v = s->vocab_spelling.find(t);
    return v == s->vocab_spelling.end() ? -1 : v->second;
  };
  if (!s->prefix.empty()) s->bos = s->prefix.front();
  for (const char* t : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|im_end|>"})
    if (s->eos < 0) s->eos = id_of(t);
  if (s->bos < 0)
    for (const char* t : {"<|begin_of_text|>", "<s>", "<bos>"})
      if (s->bos < 0) s->bos = id_of(t);
  if (!files.tokenizer_config.empty()) {
    const json cfg = parse_json_file(files.tokenizer_config, "tokenizer_config.json");
    Ctx cc{files.tokenizer_config};
    for (const char* k : {"bos_token", "eos_token"}) {
      const std::string t = config_token(cfg, k);
      if (t.empty()) continue;
      const std::int32_t id = id_of(t);
      if (id < 0) cc.fail(k, "'" + t + "' is not a token of '" + files.tokenizer_json + "'");
      (std::string(k) == "bos_token" ? s->bos : s->eos) = id;
    }
    // transformers' LlamaTokenizerFast rebuilds its template from add_bos_token / add_eos_token.
    const std::string cls = cfg.is_object() ? cfg.value("tokenizer_class", std::string()) : "";
    if (cls.rfind("Llama", 0) == 0 || cls.rfind("CodeLlama", 0) == 0) {
      const bool add_bos = cc.flag(cfg, "add_bos_token", "(top level)", !s->prefix.empty());
      const bool add_eos = cc.flag(cfg, "add_eos_token", "(top level)", !s->suffix.empty());
      if (add_bos && s->bos < 0) cc.fail("add_bos_token", "true but there is no bos_token");
      if (add_eos && s->eos < 0) cc.fail("add_eos_token", "true but there is no eos_token");
      s->prefix.clear();
      s->suffix.clear();
      if (add_bos) s->prefix.push_back(s->bos);
      if (add_eos) s->suffix.push_back(s->eos);
    }
  }
  return s;
}

}  // namespace shardtrain::data
