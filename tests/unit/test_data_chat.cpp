// Instruction data: chat-template recognition, row parsing, the rendered texts of the formats
// (against apply_chat_template's output for the Llama 3 / 3.1 and Qwen2 / 2.5 templates, written
// out by hand from the templates), ids and masks with real tokenizers, and masked token datasets
// (files, validation, sampler alignment, tensors).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/chat_format.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path p;
  explicit TempDir(const std::string& tag) : p(fs::temp_directory_path() / ("st_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string str() const { return p.string(); }
};
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
std::string text_of(const std::string& format, const std::vector<ChatMessage>& m) {
  std::vector<ChatSegment> seg;
  EXPECT_EQ(chat_segments(chat_template_named(format), m, seg), "");
  return chat_text(seg);
}
void write_text(const std::string& path, const std::string& s) { std::ofstream(path, std::ios::binary) << s; }
std::string config_with(const nlohmann::json& tpl) { return nlohmann::json{{"chat_template", tpl}}.dump(); }
const std::vector<ChatMessage> kChat = {{"system", "  Be brief.\n"}, {"user", " Hi there "}, {"assistant", "Hello! \n"},
                                        {"user", "Bye"}, {"assistant", "Goodbye."}};
}  // namespace

TEST(ChatFormat, StripIsPythonStrip) {
  EXPECT_EQ(strip_unicode_space(" \t\n a b \r\n"), "a b");
  EXPECT_EQ(strip_unicode_space("\xC2\xA0x\xE3\x80\x80"), "x");  // NBSP, ideographic space
  EXPECT_EQ(strip_unicode_space("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");  // zero-width space is not whitespace
  EXPECT_EQ(strip_unicode_space("   "), "");
  EXPECT_EQ(strip_unicode_space("\xFF x \xFE"), "\xFF x \xFE");  // invalid bytes are kept
}

// The expected strings are apply_chat_template(messages, tokenize=False) of each template.
TEST(ChatFormat, TextsEqualTheTemplates) {
  EXPECT_EQ(text_of("llama3", kChat),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nGoodbye.<|eot_id|>");
  EXPECT_EQ(text_of("llama3.1", kChat),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nGoodbye.<|eot_id|>");
  EXPECT_EQ(text_of("llama3.1", {{"user", "Hi"}, {"assistant", "Yo"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>");
  EXPECT_EQ(text_of("qwen2", {{"user", " Hi "}, {"assistant", "Yo\n"}}),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
            "<|im_start|>assistant\nYo\n<|im_end|>\n");
  EXPECT_EQ(text_of("qwen2.5", {{"user", "Hi"}, {"assistant", "Yo"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_EQ(text_of("qwen2", kChat),
            "<|im_start|>system\n  Be brief.\n<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n"
            "<|im_start|>assistant\nHello! \n<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\nGoodbye.<|im_end|>\n");
  EXPECT_EQ(text_of("chatml", {{"user", "Hi"}, {"assistant", "Yo"}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
}

// Exactly the assistant contents and their end-of-turn tokens are counted.
TEST(ChatFormat, CountedSegmentsAreAssistantContentAndEndOfTurn) {
  for (const char* f : {"llama3", "llama3.1", "qwen2"}) {
    std::vector<ChatSegment> seg;
    ASSERT_EQ(chat_segments(chat_template_named(f), kChat, seg), "");
    std::string counted;
    for (const auto& g : seg)
      if (g.counted) counted += g.text + "|";
    const bool llama = std::string(f).rfind("llama", 0) == 0;
    EXPECT_EQ(counted, llama ? "Hello!|<|eot_id|>|Goodbye.|<|eot_id|>|" : "Hello! \n|<|im_end|>|Goodbye.|<|im_end|>|") << f;
  }
}

TEST(ChatFormat, RowsParseOrSayWhy) {
  std::vector<ChatMessage> m;
  EXPECT_EQ(parse_instruction_row(nlohmann::json::parse(R"({"prompt":"a","completion":"b"})"), m), "");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[1].content, "b");
  EXPECT_EQ(parse_instruction_row(nlohmann::json::parse(
                                      R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}]})"),
                                  m),
            "");
  EXPECT_EQ(m.size(), 3u);
  auto why = [&](const char* row) { return parse_instruction_row(nlohmann::json::parse(row), m); };
  EXPECT_NE(why(R"({"prompt":"a"})").find("no \"completion\""), std::string::npos);
  EXPECT_NE(why(R"({"completion":"a"})").find("prompt"), std::string::npos);
  EXPECT_NE(why(R"({"prompt":"a","completion":3})").find("not a string"), std::string::npos);
  EXPECT_NE(why(R"({"messages":[{"role":"user","content":"u"}]})").find("no assistant turn"), std::string::npos);
  EXPECT_NE(why(R"({"messages":[{"role":"tool","content":"u"},{"role":"assistant","content":"a"}]})").find("tool"),
            std::string::npos);
  EXPECT_NE(why(R"({"messages":[{"role":"user"},{"role":"assistant","content":"a"}]})").find("messages[0]"),
            std::string::npos);
  EXPECT_NE(why(R"({"messages":"hi"})").find("not a list"), std::string::npos);
  EXPECT_NE(why(R"([1,2])").find("not a JSON object"), std::string::npos);
  EXPECT_NE(why(R"({"text":"x"})").find("neither"), std::string::npos);
}

TEST(ChatFormat, TemplatesAreRecognisedFromTokenizerConfig) {
  TempDir d("chatcfg");
  const std::string p = d.str() + "/tokenizer_config.json";
  auto format_of = [&](const nlohmann::json& tpl, const std::string& date = "") {
    write_text(p, config_with(tpl));
    return chat_template_from_config(p, date);
  };
  const std::string llama30 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
      "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  EXPECT_EQ(format_of(llama30).name, "llama3");
  const std::string llama31 =
      "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif "
      "%}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" "
      "}}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}{{- system_message }}\n{{- \"<|eot_id|>\" }}";
  ChatTemplate t = format_of(llama31);
  EXPECT_EQ(t.format, ChatFormat::Llama31);
  EXPECT_EQ(t.date, "26 Jul 2024");
  const std::string llama32 = llama31 + "{%- if strftime_now is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}";
  EXPECT_NE(user_error_of([&] { format_of(llama32); }).find("--chat-date"), std::string::npos);
  EXPECT_EQ(format_of(llama32, "03 Dec 2026").date, "03 Dec 2026");
  const std::string qwen2 =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  t = format_of(qwen2);
  EXPECT_EQ(t.format, ChatFormat::ChatML);
  EXPECT_EQ(t.default_system, "You are a helpful assistant.");
  EXPECT_EQ(format_of("<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                      "assistant.<|im_end|>")
                .name,
            "qwen2.5");
  EXPECT_EQ(format_of(nlohmann::json::array({{{"name", "tool_use"}, {"template", "x"}},
                                             {{"name", "default"}, {"template", qwen2}}}))
                .name,
            "qwen2");
  // Refused, naming the file and the key.
  for (const nlohmann::json& bad : {nlohmann::json("<|im_start|>{{ '<think>' }}<|im_end|>"),
                                    nlohmann::json("{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
                                    nlohmann::json(42)}) {
    const std::string msg = user_error_of([&] { format_of(bad); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("chat_template"), std::string::npos) << msg;
  }
  write_text(p, "{\"model_max_length\": 8}");
  EXPECT_NE(user_error_of([&] { chat_template_from_config(p); }).find("no key \"chat_template\""), std::string::npos);
  write_text(p, "{\"chat_template\": ");
  EXPECT_NE(user_error_of([&] { chat_template_from_config(p); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(user_error_of([&] { chat_template_from_config(d.str() + "/missing.json"); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { chat_template_named("alpaca"); }).find("alpaca"), std::string::npos);
}

// The byte tokenizer: ids are the bytes, so the mask can be checked byte by byte.
TEST(ChatRenderer, PlainWithByteTokenizerMarksTheCompletion) {
  auto tok = make_tokenizer("byte", "");
  ChatRenderer r(chat_template_named("plain"), *tok);
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> mask;
  ASSERT_EQ(r.render({{"user", "Q: 2+2?"}, {"assistant", " 4"}}, ids, mask), "");
  const std::string all = "Q: 2+2? 4";
  ASSERT_EQ(ids.size(), all.size());  // no end-of-text id: the byte tokenizer has none
  ASSERT_EQ(mask.size(), ids.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(ids[i], static_cast<unsigned char>(all[i]));
    EXPECT_EQ(mask[i], i >= 7 ? 1 : 0) << i;
  }
  EXPECT_NE(r.render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}, ids, mask).find("plain"), std::string::npos);
}

TEST(ChatRenderer, TemplatesNeedTheirSpecialTokens) {
  auto tok = make_tokenizer("byte", "");
  for (const char* f : {"llama3", "llama3.1", "chatml", "qwen2"}) {
    const std::string msg = user_error_of([&] { ChatRenderer(chat_template_named(f), *tok); });
    EXPECT_NE(msg.find(f), std::string::npos) << msg;
    EXPECT_NE(msg.find("special token <|"), std::string::npos) << msg;
  }
}

// GPT-2: the completion's tokens as the whole text encodes them, then <|endoftext|>; a token
// that merges across the prompt/completion boundary belongs to the completion.
TEST(ChatRenderer, PlainWithGpt2EncodesTheWholeTextAndCountsTheCompletionAndEos) {
  if (!file_exists(gpt2_dir(default_data_dir()) + "/encoder.json")) GTEST_SKIP() << "GPT-2 files absent (scripts/fetch-data)";
  auto tok = make_tokenizer("gpt2", default_data_dir());
  ChatRenderer r(chat_template_named("plain"), *tok);
  for (const auto& [p, c] : std::vector<std::pair<std::string, std::string>>{
           {"Question: what is two and two?\nAnswer:", " Four."}, {"Translate: chat ->", " cat"},
           {"Say hi: ", "hi"} /* "Say hi: " ends in a space that GPT-2 joins to the next word */}) {
    std::vector<std::int32_t> ids;
    std::vector<std::uint8_t> mask;
    ASSERT_EQ(r.render({{"user", p}, {"assistant", c}}, ids, mask), "");
    std::vector<std::int32_t> want = tok->encode(p + c);
    want.push_back(50256);
    EXPECT_EQ(ids, want);
    ASSERT_EQ(mask.size(), ids.size());
    // The counted tokens decode to the completion (plus the boundary's space) and <|endoftext|>.
    std::vector<std::int32_t> counted;
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (mask[i]) counted.push_back(ids[i]);
    std::size_t first = 0;
    while (!mask[first]) ++first;
    for (std::size_t i = first; i < mask.size(); ++i) EXPECT_EQ(mask[i], 1);  // one contiguous tail
    const std::string text = tok->decode(counted);
    EXPECT_EQ(text.substr(text.size() - 13), "<|endoftext|>");
    const std::string comp = text.substr(0, text.size() - 13);
    EXPECT_TRUE(comp == c || comp == " " + c) << "'" << comp << "'";
  }
}

namespace {
// Llama 3 ids of `text` (special-token strings read as their tokens, as Hugging Face does) from
// the npm llama3-tokenizer-js; false (why) when node, the package or a Llama 3 tokenizer is absent.
bool llama3_reference(const std::string& text, std::vector<std::int32_t>& ids, std::string& why) {
  const std::string pkg = default_data_dir() + "/npm/node_modules/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js";
  if (!file_exists(pkg)) { why = pkg + " absent (scripts/fetch-data)"; return false; }
  if (std::system("node --version > /dev/null 2>&1") != 0) { why = "node not found"; return false; }
  const auto tmp = fs::temp_directory_path() / ("st_chatref_" + std::to_string(::getpid()) + ".txt");
  write_text(tmp.string(), text);
  const std::string cmd = "node -e 'import(process.argv[1]).then(m => process.stdout.write(m.default.encode("
                          "require(\"fs\").readFileSync(process.argv[2], \"utf8\"), {bos: false, eos: false}).join(\" \")))' '" +
                          pkg + "' '" + tmp.string() + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) { why = "popen failed"; return false; }
  std::string out;
  char buf[65536];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  fs::remove(tmp);
  if (rc != 0) { why = "node failed: " + cmd; return false; }
  std::istringstream is(out);
  ids.clear();
  for (std::int32_t v; is >> v;) ids.push_back(v);
  return true;
}
}  // namespace

// With a Llama 3 tokenizer (tokenizer.json; SHARDTRAIN_TEST_LLAMA3_TOKENIZER, else fetch-data's) the
// rendered ids equal the reference's ids of apply_chat_template's text, and the counted tokens
// are exactly each assistant reply (trimmed) and its <|eot_id|>.
TEST(ChatRenderer, Llama3IdsEqualTheReference) {
  // scripts/fetch-data builds the Llama 3 tokenizer.json from llama3-tokenizer-js's vocabulary.
  const char* env = std::getenv("SHARDTRAIN_TEST_LLAMA3_TOKENIZER");
  const std::string path = env && *env ? std::string(env) : default_data_dir() + "/tokenizers/llama3/tokenizer.json";
  if (!file_exists(path)) GTEST_SKIP() << path << " absent (scripts/fetch-data builds it)";
  auto tok = make_tokenizer(path, default_data_dir());
  ASSERT_GE(tok->token_id("<|eot_id|>"), 0) << path << " is not a Llama 3 tokenizer";
  const std::vector<std::vector<ChatMessage>> rows = {
      kChat,
      {{"user", "What's 2+2?\n\nThink   step by step."}, {"assistant", "  2 + 2 = 4.\n\n  Done.  "}},
      {{"system", "Réponds en français, s'il te plaît."}, {"user", "Wie geht's? 你好 🙂"}, {"assistant", "Très bien 😀\r\n"}},
      {{"user", "Say <|eot_id|> please"}, {"assistant", "<|eot_id|> said"}}};
  for (const char* f : {"llama3", "llama3.1"}) {
    ChatRenderer r(chat_template_named(f), *tok);
    for (const auto& row : rows) {
      std::vector<ChatSegment> seg;
      ASSERT_EQ(chat_segments(chat_template_named(f), row, seg), "");
      std::vector<std::int32_t> ref, ids;
      std::vector<std::uint8_t> mask;
      std::string why;
      if (!llama3_reference(chat_text(seg), ref, why)) GTEST_SKIP() << why;
      ASSERT_EQ(r.render(row, ids, mask), "");
      EXPECT_EQ(ids, ref) << f << ": " << chat_text(seg);
      ASSERT_EQ(mask.size(), ids.size());
      std::string counted;  // each run of counted tokens decoded whole (runs hold whole characters)
      std::vector<std::int32_t> run;
      for (std::size_t i = 0; i <= ids.size(); ++i) {
        if (i < ids.size() && mask[i]) {
          run.push_back(ids[i]);
        } else if (!run.empty()) {
          counted += tok->decode(run);
          run.clear();
        }
      }
      std::string want;
      for (const auto& m : row)
        if (m.role == "assistant") want += strip_unicode_space(m.content) + "<|eot_id|>";
      EXPECT_EQ(counted, want) << f;
    }
  }
}

namespace {
// A masked dataset written directly (ids, mask, meta.json).
void write_masked(const std::string& dir, const std::vector<std::int32_t>& ids, const std::vector<std::uint8_t>& mask,
                  std::int64_t counted) {
  make_dirs(dir);
  TokenDatasetMeta m;
  m.tokenizer = "byte";
  m.vocab_size = 256;
  m.dtype = "uint16";
  m.eot_id = -1;
  m.train_tokens = static_cast<std::int64_t>(ids.size());
  m.masked = true;
  m.train_counted = counted;
  m.chat_format = "plain";
  write_ids(dir + "/train.bin", ids, "uint16");
  write_ids(dir + "/val.bin", {}, "uint16");
  write_mask(dir + "/train.mask", mask);
  write_mask(dir + "/val.mask", {});
  write_token_meta(dir, m);
}
}  // namespace

TEST(MaskedDataset, ReadsValidatesAndAlignsTargets) {
  TempDir d("maskds");
  const std::int64_t n = 200, T = 8;
  std::vector<std::int32_t> ids(n);
  std::vector<std::uint8_t> mask(n);
  std::int64_t ones = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<std::int32_t>((i * 7) % 256);
    mask[i] = (i / 5) % 3 == 0 ? 1 : 0;
    ones += mask[i];
  }
  write_masked(d.str(), ids, mask, ones);
  const nlohmann::json meta = nlohmann::json::parse(read_file(d.str() + "/meta.json"));
  EXPECT_EQ(meta["version"], 2);
  EXPECT_EQ(meta["splits"]["train"]["mask"], "train.mask");
  EXPECT_EQ(meta["splits"]["train"]["counted"], ones);
  TokenDataset ds(d.str(), "train");
  ASSERT_TRUE(ds.masked());
  EXPECT_EQ(ds.counted(0, n), ones);

  SamplerConfig cfg;
  cfg.global_batch = 4;
  cfg.micro_batches = 2;
  cfg.seed = 5;
  TokenSampler s(ds, T, cfg);
  const SamplerCursor c{0, 4};
  std::int64_t total = 0;
  for (int mb = 0; mb < 2; ++mb) {
    const TokenBatch b = s.batch(c, mb);
    const auto items = s.index().local_items(c, mb);
    ASSERT_EQ(b.mask.size(), b.tokens.size());
    const TokenTensors t = to_tensors(b);
    for (std::int64_t i = 0; i < b.batch; ++i)
      for (std::int64_t p = 0; p < T; ++p) {
        const std::int64_t tok = items[i] * T + p + 1;  // target p of window items[i]
        const std::int64_t want = mask[tok] ? ids[tok] : kIgnoredTarget;
        EXPECT_EQ(t.targets[i][p].item<std::int64_t>(), want);
        EXPECT_EQ(t.inputs[i][p].item<std::int64_t>(), ids[tok - 1]);
        total += mask[tok];
      }
  }
  EXPECT_EQ(s.counted_targets(c), total);
  // One window (its target slice is contiguous already): the inputs keep their ids.
  TokenBatch one;
  one.batch = 1;
  one.seq_len = T;
  one.tokens.assign(ids.begin(), ids.begin() + T + 1);
  one.mask.assign(mask.begin(), mask.begin() + T + 1);
  const TokenTensors t1 = to_tensors(one);
  for (std::int64_t p = 0; p < T; ++p) {
    EXPECT_EQ(t1.inputs[0][p].item<std::int64_t>(), ids[p]);
    EXPECT_EQ(t1.targets[0][p].item<std::int64_t>(), mask[p + 1] ? ids[p + 1] : kIgnoredTarget);
  }

  // A mask that does not match: wrong size, a byte not 0/1, another count; v1 with a mask.
  write_mask(d.str() + "/train.mask", std::vector<std::uint8_t>(mask.begin(), mask.end() - 1));
  std::string msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("train.mask' has 199 bytes"), std::string::npos) << msg;
  auto bad = mask;
  bad[17] = 2;
  write_mask(d.str() + "/train.mask", bad);
  msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("byte 17 is 2"), std::string::npos) << msg;
  bad = mask;
  bad[1] = 1 - bad[1];
  write_mask(d.str() + "/train.mask", bad);
  msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
  fs::remove(d.str() + "/train.mask");
  msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("train.mask"), std::string::npos) << msg;
  nlohmann::json j = meta;
  j["version"] = 1;
  write_text(d.str() + "/meta.json", j.dump());
  msg = user_error_of([&] { read_token_meta(d.str()); });
  EXPECT_NE(msg.find("version 2"), std::string::npos) << msg;
  j = meta;
  j["splits"]["train"]["mask"] = "../elsewhere";
  write_text(d.str() + "/meta.json", j.dump());
  msg = user_error_of([&] { read_token_meta(d.str()); });
  EXPECT_NE(msg.find("train.mask"), std::string::npos) << msg;
}
