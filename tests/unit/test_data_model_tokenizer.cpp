// Model tokenizers (tokenizer.json BPE) on small files written here, each built so that the
// expected ids follow from the file: merge formats and order, ignore_merges, Split behaviors,
// Metaspace prepend schemes, byte fallback and fuse_unk, added-token flags and
// --special-tokens text, the post-processor and tokenizer_config.json, threads, bad files.
// (The comparison with reference implementations on real vocabularies is e2e_tokenizer_references.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "shardtrain/data/gpt2_tokenizer.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;
using shardtrain::UserError;
using namespace shardtrain::data;
using Ids = std::vector<std::int32_t>;

namespace {
std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else if (cp < 0x800) { s += static_cast<char>(0xC0 | (cp >> 6)); s += static_cast<char>(0x80 | (cp & 0x3F)); }
  else { s += static_cast<char>(0xE0 | (cp >> 12)); s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); s += static_cast<char>(0x80 | (cp & 0x3F)); }
  return s;
}
// A byte-level vocabulary: ids 0..255 are the bytes (as GPT-2 symbols), then `extra` in order.
json byte_vocab(const std::vector<std::string>& extra) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[utf8(gpt2_byte_to_unicode(static_cast<unsigned char>(b)))] = b;
  for (std::size_t i = 0; i < extra.size(); ++i) v[extra[i]] = 256 + static_cast<int>(i);
  return v;
}
json bpe(json vocab, json merges, bool ignore_merges = false) {
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", ignore_merges}};
}
json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false) {
  return {{"id", id}, {"content", content}, {"special", special}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"single_word", single_word}, {"normalized", false}};
}
const json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
const json kByteLevelDecoder = {{"type", "ByteLevel"}};

class ModelTokenizer : public ::testing::Test {
 protected:
  fs::path dir_;
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("st_model_tok_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::unique_ptr<Tokenizer> make(const json& j, bool specials = true, const std::string& name = "tokenizer.json") {
    TokenizerOptions o;
    o.specials_in_text = specials;
    return make_tokenizer(write(name, j.dump()), "", o);
  }
};
}  // namespace

TEST_F(ModelTokenizer, MergesInBothFormatsApplyLowestRankFirst) {
  // "ab" (rank 0, a string) and ["b", "c"] (rank 1, a pair): "abc" merges a+b first -> [ab, c];
  // then ["ab", "c"] (rank 2) -> abc.
  json j = {{"pre_tokenizer", kByteLevel}, {"decoder", kByteLevelDecoder},
            {"model", bpe(byte_vocab({"ab", "bc", "abc"}), json::array({"a b", json::array({"b", "c"}), "ab c"}))}};
  auto t = make(j);
  EXPECT_EQ(t->encode("abc"), (Ids{258}));
  EXPECT_EQ(t->encode("bc"), (Ids{257}));
  EXPECT_EQ(t->encode("abd"), (Ids{256, 'd'}));
  EXPECT_EQ(t->encode("aaa"), (Ids{'a', 'a', 'a'}));
  EXPECT_EQ(t->decode(t->encode("x abc\n")), "x abc\n");
  EXPECT_EQ(t->vocab_size(), 259);
}

TEST_F(ModelTokenizer, IgnoreMergesTakesAWholePreTokenFromTheVocabulary) {
  // "xyz" is in the vocabulary but no merge makes it.
  for (bool ignore : {false, true}) {
    json j = {{"pre_tokenizer", kByteLevel}, {"model", bpe(byte_vocab({"xyz"}), json::array(), ignore)}};
    auto t = make(j);
    EXPECT_EQ(t->encode("xyz"), ignore ? (Ids{256}) : (Ids{'x', 'y', 'z'})) << "ignore_merges " << ignore;
  }
}

TEST_F(ModelTokenizer, SplitBehaviors) {
  // Whole pieces in the vocabulary (ignore_merges) show where the split cut "a-b--c".
  const std::vector<std::string> pieces = {"a-", "b-", "-b", "-c", "--"};
  auto id = [&](const std::string& p) { return 256 + static_cast<int>(std::find(pieces.begin(), pieces.end(), p) - pieces.begin()); };
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Isolated", {'a', '-', 'b', '-', '-', 'c'}},
      {"Removed", {'a', 'b', 'c'}},
      {"MergedWithPrevious", {id("a-"), id("b-"), '-', 'c'}},
      {"MergedWithNext", {'a', id("-b"), '-', id("-c")}},
      {"Contiguous", {'a', '-', 'b', id("--"), 'c'}},
  };
  for (const auto& [behavior, want] : cases) {
    json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    json j = {{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({split, kByteLevel})}}},
              {"model", bpe(byte_vocab(pieces), json::array(), true)}};
    EXPECT_EQ(make(j)->encode("a-b--c"), want) << behavior;
  }
}

TEST_F(ModelTokenizer, AddedTokenFlagsAndSpecialsAsText) {
  // <A>: special. <B>: not special, eats the spaces around it. wx: a single word only.
  json j = {{"pre_tokenizer", kByteLevel},
            {"model", bpe(byte_vocab({}), json::array())},
            {"added_tokens", json::array({added(256, "<A>", true), added(257, "<B>", false, true, true),
                                          added(258, "wx", false, false, false, true)})}};
  auto t = make(j);
  EXPECT_EQ(t->encode("x<A>y"), (Ids{'x', 256, 'y'}));
  EXPECT_EQ(t->encode("x  <B>  y"), (Ids{'x', 257, 'y'}));
  EXPECT_EQ(t->encode("wx wxwx wx"), (Ids{258, ' ', 'w', 'x', 'w', 'x', ' ', 258}));
  EXPECT_EQ(t->token_id("<A>"), 256);
  EXPECT_EQ(t->token_id("<nope>"), -1);
  auto plain = make(j, false, "plain/tokenizer.json");
  EXPECT_EQ(plain->encode("x<A><B>"), (Ids{'x', '<', 'A', '>', 257}));  // special as text, <B> still matched
  EXPECT_EQ(t->decode({'x', 256, 257}), "x<A><B>");
}

TEST_F(ModelTokenizer, SentencePieceStyleByteFallbackFuseUnkAndMetaspace) {
  // Char-level vocabulary with ▁; é is missing (byte fallback), ☃ too (no byte tokens for it: unk).
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"▁", 2}, {"a", 3}, {"b", 4}, {"▁a", 5}, {"<0xC3>", 6}, {"<0xA9>", 7}};
  json model = bpe(vocab, json::array({"▁ a"}));
  model["unk_token"] = "<unk>";
  model["byte_fallback"] = true;
  model["fuse_unk"] = true;
  json decoder = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  json post = {{"type", "TemplateProcessing"},
               {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  for (const char* scheme : {"first", "always"}) {
    json j = {{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", false}}},
              {"model", model}, {"decoder", decoder}, {"post_processor", post},
              {"added_tokens", json::array({added(0, "<unk>", true), added(1, "<s>", true)})}};
    auto t = make(j, true, std::string(scheme) + "/tokenizer.json");
    EXPECT_EQ(t->encode("a é☃☃b"), (Ids{5, 2, 6, 7, 0, 4})) << scheme;
    // After a special token the stretch is not at the start: "first" prepends no ▁ there.
    EXPECT_EQ(t->encode("<s>a"), std::string(scheme) == "first" ? (Ids{1, 3}) : (Ids{1, 5})) << scheme;
    EXPECT_EQ(t->decode(t->encode("a ab é")), "a ab é");
    EXPECT_EQ(t->prefix_ids(), (Ids{1}));
    EXPECT_EQ(t->bos_id(), 1);
  }
}

TEST_F(ModelTokenizer, TokenizerConfigGivesBosEosAndLlamaAddFlags) {
  json j = {{"pre_tokenizer", kByteLevel},
            {"model", bpe(byte_vocab({}), json::array())},
            {"added_tokens", json::array({added(256, "<bos>", true), added(257, "<eot>", true), added(258, "</s>", true)})}};
  write("m/tokenizer.json", j.dump());
  auto plain = make_tokenizer((dir_ / "m/tokenizer.json").string(), "");
  EXPECT_EQ(plain->eos_id(), 258);  // "</s>" by name
  EXPECT_EQ(plain->eot_id(), 258);
  EXPECT_EQ(plain->bos_id(), 256);  // "<bos>" by name
  EXPECT_TRUE(plain->prefix_ids().empty());
  write("m/tokenizer_config.json",
        R"({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<bos>", "eos_token": {"content": "<eot>"},
            "add_bos_token": true, "add_eos_token": true})");
  auto t = make_tokenizer((dir_ / "m").string(), "");
  EXPECT_EQ(t->name(), (dir_ / "m").string());
  EXPECT_EQ(t->bos_id(), 256);
  EXPECT_EQ(t->eos_id(), 257);
  EXPECT_EQ(t->prefix_ids(), (Ids{256}));
  EXPECT_EQ(t->suffix_ids(), (Ids{257}));
  write("m/tokenizer_config.json", R"({"eos_token": "<nope>"})");
  EXPECT_THROW(make_tokenizer((dir_ / "m").string(), ""), UserError);
}

TEST_F(ModelTokenizer, ThreadsShareTablesAndEncodeTheSame) {
  json split = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\p{N}{1,3}|\\s+(?!\\S)|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
                {"behavior", "Isolated"}, {"invert", false}};
  json j = {{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({split, kByteLevel})}}},
            {"decoder", kByteLevelDecoder}, {"model", bpe(byte_vocab({"ab", "abab"}), json::array({"a b", "ab ab"}))}};
  auto t = make(j);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "abab ab 12345 ééé  x\n";
  const Ids want = t->encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k, c = t->for_thread()]() mutable { got[k] = c->encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_TRUE(g == want);
  EXPECT_TRUE(t->decode(want) == text);
  EXPECT_EQ(t->encode("abab ab"), (Ids{257, ' ', 256}));
}

TEST_F(ModelTokenizer, BadFilesNameFileAndKey) {
  auto expect_error = [&](const json& j, const std::string& what) {
    try {
      make(j);
      ADD_FAILURE() << "no error for " << j.dump().substr(0, 200);
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  expect_error({{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}}, "model.type: 'WordPiece'");
  expect_error({{"model", bpe(byte_vocab({}), json::array({"a"}))}, {"pre_tokenizer", kByteLevel}}, "model.merges[0]");
  expect_error({{"model", bpe(json::object(), json::array())}}, "model.vocab");
  json sparse = byte_vocab({});
  sparse["<far>"] = 60000000;
  expect_error({{"model", bpe(sparse, json::array())}, {"pre_tokenizer", kByteLevel}}, "sparse ids");
  expect_error({{"pre_tokenizer", kByteLevel}}, "model: missing");
  expect_error({{"model", bpe(byte_vocab({}), json::array())},
                {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}},
               "pre_tokenizer.pattern");
  expect_error({{"model", bpe(byte_vocab({}), json::array())},
                {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Sideways"}}}},
               "pre_tokenizer.behavior");
  expect_error({{"model", bpe(byte_vocab({}), json::array())}, {"decoder", {{"type", "WordPiece"}}}}, "decoder.type");
  expect_error({{"model", bpe(byte_vocab({}), json::array())}, {"post_processor", {{"type", "TemplateProcessing"},
                {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}})}, {"special_tokens", json::object()}}}},
               "post_processor.special_tokens");
  write("bin/tokenizer.json", std::string("\x89PNG\r\n\x1a\n\0\0", 10));
  EXPECT_THROW(make_tokenizer((dir_ / "bin/tokenizer.json").string(), ""), UserError);
}

TEST_F(ModelTokenizer, AddedTokenIdsAreTheHuggingFaceLibrarys) {
  // The tokenizers library ignores the file's ids (AddedVocabulary::add_tokens): a content in
  // the vocabulary takes its id there, a content listed again the first entry's id (with the later
  // entry's flags), any other the next id after the vocabulary, in the file's order.
  json j = {{"pre_tokenizer", kByteLevel},
            {"model", bpe(byte_vocab({"<in_vocab>"}), json::array())},  // <in_vocab> = 256; 257 entries
            {"added_tokens", json::array({added(257, "<a>", true),
                                          added(257, "<b>", true),        // the same id as <a>: a new one
                                          added(9, "<in_vocab>", true),   // the vocabulary's id wins
                                          added(400, "<c>", true),        // past the others: the next id
                                          added(300, "<b>", false, true, true),  // <b> again: its id, these flags
                                          added(500, "", true)})}};       // empty: ignored
  auto t = make(j);
  EXPECT_EQ(t->token_id("<a>"), 257);
  EXPECT_EQ(t->token_id("<b>"), 258);
  EXPECT_EQ(t->token_id("<in_vocab>"), 256);
  EXPECT_EQ(t->token_id("<c>"), 259);
  EXPECT_EQ(t->encode("<a><b><c><in_vocab>"), (Ids{257, 258, 259, 256}));
  EXPECT_EQ(t->encode("x  <b>  y"), (Ids{'x', 258, 'y'}));  // the second <b>'s lstrip / rstrip
  EXPECT_EQ(t->decode({257, 258, 259, 256}), "<a><b><c><in_vocab>");
}

TEST_F(ModelTokenizer, AddedTokensMatchLeftmostLongestInLinearTime) {
  // Leftmost first, then the longest there; a prefix of a longer token still matches alone.
  json j = {{"pre_tokenizer", kByteLevel},
            {"model", bpe(byte_vocab({}), json::array())},
            {"added_tokens", json::array({added(256, "ab", true), added(257, "abcd", true), added(258, "bcde", true),
                                          added(259, "cd", true)})}};
  auto t = make(j);
  EXPECT_EQ(t->encode("abcde"), (Ids{257, 'e'}));       // at 0: abcd, longer than ab; bcde starts later
  EXPECT_EQ(t->encode("xbcdex"), (Ids{'x', 258, 'x'}));
  EXPECT_EQ(t->encode("abcx"), (Ids{256, 'c', 'x'}));   // abcd fails after abc: ab, then c is no token
  EXPECT_EQ(t->encode("acdab"), (Ids{'a', 259, 256}));

  // Many long tokens alike (the same 4 KiB prefix, then their number) and a text that begins
  // all of them at every position: comparing every token at every position costs text x tokens
  // (6.6 x 10^12 byte comparisons here: about two minutes of one core; 300 KB took 16 s); the
  // automaton, text + tokens (about a second, most of it the encoding after the match).
  const std::string prefix(4096, 'a');
  json many = json::array();
  for (int i = 0; i < 800; ++i) many.push_back(added(256 + i, prefix + "#" + std::to_string(i), true));
  json big = {{"pre_tokenizer", kByteLevel}, {"model", bpe(byte_vocab({}), json::array())}, {"added_tokens", many}};
  auto slow = make(big, true, "big/tokenizer.json");
  const std::string text = std::string(2000000, 'a') + "#799";
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = slow->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(ids.size(), 2000000u - 4096 + 1);
  EXPECT_EQ(ids.back(), 256 + 799);
  EXPECT_EQ(ids.front(), 'a');
  // Generous (a regression costs minutes, the automaton milliseconds): a bound, not a benchmark.
  EXPECT_LT(s, 20.0) << "added-token matching is not linear in the text";
}

TEST_F(ModelTokenizer, AddedTokensBeyondTheLimitAreRefused) {
  // Their contents together above limits::kMaxAddedTokenBytes (4 MiB): refused, naming the key.
  json many = json::array();
  for (int i = 0; i < 600; ++i) many.push_back(added(256 + i, std::string(8000, 'x') + std::to_string(i), true));
  json j = {{"pre_tokenizer", kByteLevel}, {"model", bpe(byte_vocab({}), json::array())}, {"added_tokens", many}};
  try {
    make(j);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens: their contents exceed 4194304 bytes"), std::string::npos) << e.what();
  }
}
