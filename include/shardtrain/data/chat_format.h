// Instruction data: a JSONL row ({"prompt", "completion"} or {"messages": [...]}) rendered in a
// model's chat format into token ids and a loss mask (1 = the token counts: completion and
// assistant tokens with the assistant's end-of-turn token). The formats render what
// transformers' apply_chat_template gives for the templates they name (docs/data.md,
// "Instruction data"); special-token strings of the template become single ids (token_id), the
// text between them is encoded as one piece, as the Hugging Face tokenizers split added tokens.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/tokenizer.h"

namespace shardtrain::data {

enum class ChatFormat {
  Plain,    // prompt text + completion text + end-of-sequence (base models): no template
  Llama3,   // Llama 3 / 3.0 Instruct: <|begin_of_text|> + header/content/<|eot_id|> per message
  Llama31,  // Llama 3.1 / 3.2 / 3.3 Instruct: as Llama3, with the system block's dates
  ChatML,   // ChatML as Qwen2 / Qwen2.5 write it: <|im_start|>role\ncontent<|im_end|>\n
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::Plain;
  std::string name;            // "plain", "llama3", "llama3.1", "chatml"
  std::string default_system;  // ChatML: the system turn inserted when a row has none ("" = none)
  std::string date;            // Llama 3.1: the system block's "Today Date: " (template default)
};

// --chat-format NAME: plain | llama3 | llama3.1 | chatml | qwen2 | qwen2.5 (UserError otherwise).
// chatml has no default system turn; qwen2 / qwen2.5 insert theirs as their templates do.
ChatTemplate chat_template_named(const std::string& name);

// The format of tokenizer_config.json's "chat_template", recognised by its distinctive strings;
// `date` fills Llama 3.2's strftime_now date (the template renders the day it runs: refused
// without one). UserError naming the file and key for a template it cannot render.
ChatTemplate chat_template_from_config(const std::string& path, const std::string& date = "");

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// The messages of one JSONL row: {"prompt": s, "completion": s} is a user and an assistant
// turn; {"messages": [{"role", "content"}, ...]} as given. Returns "" or why the row is bad
// (not an object, missing or mistyped keys, an unknown role, no assistant turn).
std::string parse_instruction_row(const nlohmann::json& row, std::vector<ChatMessage>& out);

// One row in a format as segments: a special token of the template (by its text, encoded as one
// id) or a text piece; consecutive text pieces are one text (encoded whole, as the Hugging Face
// tokenizers encode the text between two special tokens). `counted`: the piece's tokens enter
// the loss. Plain rows are the prompt and the completion pieces only (the renderer adds the
// tokenizer's prefix and end-of-sequence ids). Returns "" or why the row does not fit the
// format (plain: exactly one user and one assistant turn).
struct ChatSegment {
  bool special = false;
  std::string text;
  bool counted = false;
};
std::string chat_segments(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, std::vector<ChatSegment>& out);
// The segments' texts joined: what apply_chat_template(messages, tokenize=False) returns.
std::string chat_text(const std::vector<ChatSegment>& segments);

// Renders rows of one format with one tokenizer. The constructor checks that the tokenizer has
// the format's special tokens (UserError naming them). Not thread-safe (one per thread).
class ChatRenderer {
 public:
  ChatRenderer(ChatTemplate t, Tokenizer& tok);
  // Appends the row's ids and as many mask bytes. Returns "" or why the row cannot be rendered
  // in this format (plain: exactly one user and one assistant turn).
  std::string render(const std::vector<ChatMessage>& msgs, std::vector<std::int32_t>& ids,
                     std::vector<std::uint8_t>& mask);
  const ChatTemplate& chat_template() const { return t_; }

 private:
  struct Piece {
    std::string text;
    bool counted = false;
  };
  // Text between two special tokens: encoded whole; a token belongs to the first piece whose
  // end it does not cross (longest common prefix of the encodings of the piece prefixes).
  void emit_text(const std::vector<ChatSegment>& pieces, std::vector<std::int32_t>& ids,
                 std::vector<std::uint8_t>& mask);

  ChatTemplate t_;
  Tokenizer& tok_;
  std::vector<std::pair<std::string, std::int32_t>> specials_;  // the format's special tokens
  std::int32_t eos_ = -1;                                        // plain
  std::vector<std::int32_t> prefix_;                             // plain
  std::vector<ChatSegment> segs_, run_;                          // scratch
  std::vector<std::int32_t> a_, b_;                              // scratch
};

// Python's str.strip() (Jinja's `trim`): Unicode whitespace off both ends of UTF-8 text.
std::string strip_unicode_space(const std::string& s);

}  // namespace shardtrain::data
