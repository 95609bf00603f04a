// Chat formats for instruction data: template recognition, row parsing, rendering to ids + mask.
#include "shardtrain/data/chat_format.h"

#include <algorithm>

#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// Python's str.isspace() code points (what Jinja's trim strips).
bool unicode_space(std::uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point starting at s[i] and its length (an invalid byte is itself, length 1).
std::uint32_t decode_at(const std::string& s, std::size_t i, std::size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + static_cast<std::size_t>(n) > s.size()) {
    len = 1;
    return 0xFFFFFFFFu;
  }
  std::uint32_t c = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto x = static_cast<unsigned char>(s[i + k]);
    if ((x & 0xC0) != 0x80) {
      len = 1;
      return 0xFFFFFFFFu;
    }
    c = (c << 6) | (x & 0x3F);
  }
  len = static_cast<std::size_t>(n);
  return c;
}

}  // namespace

std::string strip_unicode_space(const std::string& s) {
  std::size_t begin = 0, end = s.size();
  while (begin < end) {
    std::size_t len = 0;
    if (!unicode_space(decode_at(s, begin, len))) break;
    begin += len;
  }
  // From the back: find the last non-space code point by walking forward (UTF-8 is not
  // reversible without care); texts are short, this is linear.
  std::size_t last_end = begin;
  for (std::size_t i = begin; i < end;) {
    std::size_t len = 0;
    const bool space = unicode_space(decode_at(s, i, len));
    i += len;
    if (!space) last_end = i;
  }
  return s.substr(begin, last_end - begin);
}

ChatTemplate chat_template_named(const std::string& name) {
  ChatTemplate t;
  t.name = name;
  if (name == "plain") {
    t.format = ChatFormat::Plain;
  } else if (name == "llama3") {
    t.format = ChatFormat::Llama3;
  } else if (name == "llama3.1") {
    t.format = ChatFormat::Llama31;
    t.date = "26 Jul 2024";
  } else if (name == "chatml") {
    t.format = ChatFormat::ChatML;
  } else if (name == "qwen2") {
    t.format = ChatFormat::ChatML;
    t.default_system = "You are a helpful assistant.";
  } else if (name == "qwen2.5") {
    t.format = ChatFormat::ChatML;
    t.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  } else {
    throw UserError("data prepare: --chat-format '" + name +
                    "' is not plain, llama3, llama3.1, chatml, qwen2, qwen2.5 or auto (tokenizer_config.json)");
  }
  return t;
}

ChatTemplate chat_template_from_config(const std::string& path, const std::string& date) {
  ST_USER_CHECK(path_exists(path), "data prepare: --chat-format auto reads the model's tokenizer_config.json, and '",
                path, "' does not exist (give --tokenizer-config FILE, or --chat-format NAME)");
  nlohmann::json j;
  try {
    const std::string text = read_file(path, kMaxAuxFileBytes, "tokenizer_config.json");
    check_json_depth(text, kMaxJsonDepth, "'" + path + "'");
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("data prepare: '" + path + "' is not valid JSON: " + e.what());
  }
  ST_USER_CHECK(j.is_object() && j.contains("chat_template"), "data prepare: '", path,
                "' has no key \"chat_template\" (a base model's tokenizer: use --chat-format plain)");
  const nlohmann::json& ct = j["chat_template"];
  std::string tpl;
  if (ct.is_string()) {
    tpl = ct.get<std::string>();
  } else if (ct.is_array()) {  // named templates: [{"name": "default", "template": ...}, ...]
    for (const auto& e : ct)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        tpl = e["template"].get<std::string>();
    ST_USER_CHECK(!tpl.empty(), "data prepare: '", path, "': key \"chat_template\" is a list without a \"default\" template");
  } else {
    throw UserError("data prepare: '" + path + "': key \"chat_template\" is neither a string nor a list of templates");
  }
  auto refuse = [&](const std::string& why) {
    return UserError("data prepare: '" + path + "': key \"chat_template\": " + why +
                     "; shardtrain renders the Llama 3 / 3.1 / 3.2 / 3.3 and the ChatML (Qwen2, Qwen2.5) templates: "
                     "give --chat-format NAME to choose one explicitly");
  };
  ChatTemplate t;
  if (contains(tpl, "<|start_header_id|>") && contains(tpl, "<|eot_id|>")) {
    if (contains(tpl, "Cutting Knowledge Date: December 2023")) {
      t = chat_template_named("llama3.1");
      if (contains(tpl, "strftime_now")) {
        // Llama 3.2 / 3.3: transformers renders the day apply_chat_template runs.
        if (date.empty())
          throw refuse("this Llama 3.2-style template writes today's date (strftime_now) into every row; give "
                       "--chat-date \"DD Mon YYYY\" for the date to render");
        t.date = date;
      } else if (!date.empty()) {
        t.date = date;
      }
      t.name = "llama3.1";
    } else if (contains(tpl, "bos_token + content") || contains(tpl, "bos_token")) {
      t = chat_template_named("llama3");
    } else {
      throw refuse("a Llama-3-style template without bos_token");
    }
    return t;
  }
  if (contains(tpl, "<|im_start|>") && contains(tpl, "<|im_end|>")) {
    if (contains(tpl, "<think>")) throw refuse("a ChatML template with reasoning blocks (<think>, Qwen3)");
    if (contains(tpl, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
      return chat_template_named("qwen2.5");
    if (contains(tpl, "You are a helpful assistant.")) return chat_template_named("qwen2");
    return chat_template_named("chatml");
  }
  throw refuse("a template shardtrain does not recognise");
}

std::string parse_instruction_row(const nlohmann::json& row, std::vector<ChatMessage>& out) {
  out.clear();
  if (!row.is_object()) return "not a JSON object";
  if (row.contains("messages")) {
    const auto& m = row["messages"];
    if (!m.is_array()) return "\"messages\" is not a list";
    bool assistant = false;
    for (std::size_t i = 0; i < m.size(); ++i) {
      const auto& e = m[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!e.is_object()) return at + " is not an object";
      if (!e.contains("role") || !e["role"].is_string()) return at + " has no string \"role\"";
      if (!e.contains("content") || !e["content"].is_string()) return at + " has no string \"content\"";
      const std::string role = e["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant")
        return at + ": role \"" + role + "\" is not system, user or assistant";
      assistant = assistant || role == "assistant";
      out.push_back({role, e["content"].get<std::string>()});
    }
    if (!assistant) return "no assistant turn in \"messages\" (nothing to train on)";
    return "";
  }
  if (!row.contains("prompt") && !row.contains("completion"))
    return "neither \"messages\" nor \"prompt\" and \"completion\"";
  if (!row.contains("prompt") || !row["prompt"].is_string()) return "no string \"prompt\"";
  if (!row.contains("completion")) return "no \"completion\" (nothing to train on)";
  if (!row["completion"].is_string()) return "\"completion\" is not a string";
  out.push_back({"user", row["prompt"].get<std::string>()});
  out.push_back({"assistant", row["completion"].get<std::string>()});
  return "";
}

namespace {

// bos, then per message <|start_header_id|>role<|end_header_id|>"\n\n" + trim(content) <|eot_id|>.
// Llama 3.1 puts a system block first: "Cutting Knowledge Date" and "Today Date" lines, then the
// row's first message when it is a system turn (trimmed). Counted: an assistant turn's content
// and its <|eot_id|>; the header and the "\n\n" are the prompt.
void llama3_segments(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, std::vector<ChatSegment>& out) {
  out.push_back({true, "<|begin_of_text|>", false});
  std::size_t first = 0;
  auto turn = [&](const std::string& role, const std::string& head, const std::string& content, bool counted) {
    out.push_back({true, "<|start_header_id|>", false});
    out.push_back({false, role, false});
    out.push_back({true, "<|end_header_id|>", false});
    out.push_back({false, head, false});
    out.push_back({false, content, counted});
    out.push_back({true, "<|eot_id|>", counted});
  };
  if (t.format == ChatFormat::Llama31) {
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = strip_unicode_space(msgs[0].content);
      first = 1;
    }
    turn("system", "\n\nCutting Knowledge Date: December 2023\nToday Date: " + t.date + "\n\n", system, false);
  }
  for (std::size_t i = first; i < msgs.size(); ++i)
    turn(msgs[i].role, "\n\n", strip_unicode_space(msgs[i].content), msgs[i].role == "assistant");
}

// Per message <|im_start|>role"\n" + content<|im_end|>"\n"; a row without a system turn first
// gets the template's default one (Qwen2, Qwen2.5). Counted: an assistant turn's content and
// its <|im_end|>; the "\n" after it is not (it precedes the next turn's header).
void chatml_segments(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, std::vector<ChatSegment>& out) {
  auto turn = [&](const std::string& role, const std::string& content, bool counted) {
    out.push_back({true, "<|im_start|>", false});
    out.push_back({false, role + "\n", false});
    out.push_back({false, content, counted});
    out.push_back({true, "<|im_end|>", counted});
    out.push_back({false, "\n", false});
  };
  if (!t.default_system.empty() && (msgs.empty() || msgs[0].role != "system")) turn("system", t.default_system, false);
  for (const auto& m : msgs) turn(m.role, m.content, m.role == "assistant");
}

}  // namespace

std::string chat_segments(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, std::vector<ChatSegment>& out) {
  out.clear();
  switch (t.format) {
    case ChatFormat::Llama3:
    case ChatFormat::Llama31:
      llama3_segments(t, msgs, out);
      return "";
    case ChatFormat::ChatML:
      chatml_segments(t, msgs, out);
      return "";
    case ChatFormat::Plain:
      // The tokenizer's prefix (Llama's BOS; none for GPT-2), the prompt and the completion
      // encoded as one text, then the end-of-sequence id (GPT-2's <|endoftext|>; none for the
      // byte tokenizer), which counts with the completion: the renderer adds prefix and eos.
      if (msgs.size() != 2 || msgs[0].role != "user" || msgs[1].role != "assistant")
        return "--chat-format plain takes {\"prompt\", \"completion\"} rows (or exactly one user and one assistant "
               "message)";
      out.push_back({false, msgs[0].content, false});
      out.push_back({false, msgs[1].content, true});
      return "";
  }
  return "unknown chat format";
}

std::string chat_text(const std::vector<ChatSegment>& segments) {
  std::string s;
  for (const auto& g : segments) s += g.text;
  return s;
}

ChatRenderer::ChatRenderer(ChatTemplate t, Tokenizer& tok) : t_(std::move(t)), tok_(tok) {
  std::vector<const char*> need;
  if (t_.format == ChatFormat::Llama3 || t_.format == ChatFormat::Llama31)
    need = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  if (t_.format == ChatFormat::ChatML) need = {"<|im_start|>", "<|im_end|>"};
  for (const char* s : need) {
    const std::int32_t id = tok_.token_id(s);
    ST_USER_CHECK(id >= 0, "data prepare: --chat-format ", t_.name, " needs the special token ", s,
                  " as one token, and the ", tok_.name(),
                  " tokenizer has none (use the model's own tokenizer, or --chat-format plain)");
    specials_.emplace_back(s, id);
  }
  if (t_.format == ChatFormat::Plain) {
    prefix_ = tok_.prefix_ids();
    eos_ = tok_.eos_id();
  }
}

void ChatRenderer::emit_text(const std::vector<ChatSegment>& pieces, std::vector<std::int32_t>& ids,
                             std::vector<std::uint8_t>& mask) {
  std::string all;
  for (const auto& p : pieces) all += p.text;
  a_.clear();
  tok_.encode_append(all, a_);
  const std::size_t n = a_.size();
  // Token k belongs to piece i when it lies within the longest common prefix of the whole
  // encoding and the encoding of pieces 0..i, and not within that of pieces 0..i-1: a token
  // that merges across a boundary belongs to the later piece.
  std::size_t from = 0;
  std::string prefix;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::size_t upto = n;
    if (i + 1 < pieces.size()) {
      prefix += pieces[i].text;
      b_.clear();
      tok_.encode_append(prefix, b_);
      upto = 0;
      while (upto < n && upto < b_.size() && a_[upto] == b_[upto]) ++upto;
      upto = std::max(upto, from);
    }
    for (std::size_t k = from; k < upto; ++k) mask.push_back(pieces[i].counted ? 1 : 0);
    from = upto;
  }
  ids.insert(ids.end(), a_.begin(), a_.end());
}

std::string ChatRenderer::render(const std::vector<ChatMessage>& msgs, std::vector<std::int32_t>& ids,
                                 std::vector<std::uint8_t>& mask) {
  std::string why = chat_segments(t_, msgs, segs_);
  if (!why.empty()) return why;
  for (std::int32_t id : prefix_) {
    ids.push_back(id);
    mask.push_back(0);
  }
  run_.clear();
  auto flush = [&] {
    if (!run_.empty()) emit_text(run_, ids, mask);
    run_.clear();
  };
  for (const auto& g : segs_) {
    if (!g.special) {
      run_.push_back(g);
      continue;
    }
    flush();
    std::int32_t id = -1;
    for (const auto& [s, i] : specials_)
      if (s == g.text) id = i;
    ST_CHECK(id >= 0, "chat format ", t_.name, ": special token ", g.text, " not looked up");
    ids.push_back(id);
    mask.push_back(g.counted ? 1 : 0);
  }
  flush();
  if (t_.format == ChatFormat::Plain && eos_ >= 0) {
    ids.push_back(eos_);
    mask.push_back(1);
  }
  return "";
}

}  // namespace shardtrain::data
