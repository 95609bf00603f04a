// Tokenizer tests: pre-tokenization rules, byte tokenizer, GPT-2 BPE against known ids and,
// id for id, against the npm gpt-3-encoder reference run by node on real Austen text.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/gpt2_tokenizer.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/pretokenize.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;
using namespace std::string_literals;

namespace {
std::vector<std::string> chunks(std::string_view t) {
  std::vector<std::string> out;
  for (auto c : pretokenize(t)) out.emplace_back(c);
  return out;
}
using V = std::vector<std::string>;

std::unique_ptr<Tokenizer> gpt2_or_skip() {
  std::string dir = gpt2_dir(default_data_dir());
  if (!file_exists(dir + "/encoder.json")) return nullptr;
  return make_tokenizer("gpt2", default_data_dir());
}

// Runs the reference encoder in node on `text`; empty optional when node or the package is absent.
bool reference_encode(const std::string& text, std::vector<std::int32_t>& ids, std::string& why) {
  std::string pkg = default_data_dir() + "/npm/node_modules/gpt-3-encoder";
  if (!file_exists(pkg + "/Encoder.js")) { why = pkg + " absent (run scripts/fetch-data)"; return false; }
  if (std::system("node --version > /dev/null 2>&1") != 0) { why = "node not found"; return false; }
  auto tmp = std::filesystem::temp_directory_path() / ("st_ref_" + std::to_string(::getpid()) + ".txt");
  write_file(tmp.string(), text.data(), text.size());
  std::string cmd = "node -e 'const e=require(process.argv[1]);const t=require(\"fs\").readFileSync(process.argv[2],\"utf8\");"
                    "process.stdout.write(e.encode(t).join(\" \"))' '" + pkg + "' '" + tmp.string() + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) { why = "popen failed"; return false; }
  std::string out;
  char buf[65536];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  std::filesystem::remove(tmp);
  EXPECT_EQ(rc, 0) << "node failed: " << cmd;
  std::istringstream is(out);
  ids.clear();
  for (std::int32_t v; is >> v;) ids.push_back(v);
  return true;
}

void expect_same_as_reference(Tokenizer& tok, const std::string& text, const std::string& label) {
  std::vector<std::int32_t> ref;
  std::string why;
  if (!reference_encode(text, ref, why)) GTEST_SKIP() << "reference tokenizer unavailable: " << why;
  auto ours = tok.encode(text);
  ASSERT_EQ(ours.size(), ref.size()) << label;
  std::size_t first_diff = 0;
  while (first_diff < ours.size() && ours[first_diff] == ref[first_diff]) ++first_diff;
  EXPECT_EQ(first_diff, ours.size()) << label << ": first difference at token " << first_diff;
  EXPECT_EQ(tok.decode(ours), text) << label;
}
}  // namespace

TEST(Pretokenize, Gpt2PatternRules) {
  EXPECT_EQ(chunks("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(chunks("I'm can't they'll we've she'd you're it's"),
            (V{"I", "'m", " can", "'t", " they", "'ll", " we", "'ve", " she", "'d", " you", "'re", " it", "'s"}));
  EXPECT_EQ(chunks("'so"), (V{"'s", "o"}));          // contraction wins over letters
  EXPECT_EQ(chunks("I'M"), (V{"I", "'", "M"}));       // case-sensitive
  EXPECT_EQ(chunks("a  b"), (V{"a", " ", " b"}));     // \s+(?!\S) leaves the last space
  EXPECT_EQ(chunks("a   \n\nb"), (V{"a", "   \n", "\n", "b"}));
  EXPECT_EQ(chunks("end.  "), (V{"end", ".", "  "}));  // trailing whitespace kept whole
  EXPECT_EQ(chunks("1814, 42nd"), (V{"1814", ",", " 42", "nd"}));
  EXPECT_EQ(chunks("Well!--\"said"), (V{"Well", "!--\"", "said"}));
  EXPECT_EQ(chunks(" --- x"), (V{" ---", " x"}));
  EXPECT_EQ(chunks("caf\xc3\xa9 na\xc3\xafve"), (V{"caf\xc3\xa9", " na\xc3\xafve"}));  // Latin-1 letters
  EXPECT_EQ(chunks("\xe6\x97\xa5\xe6\x9c\xac 2\xc2\xbd"), (V{"\xe6\x97\xa5\xe6\x9c\xac", " 2\xc2\xbd"}));  // CJK, ½ is \p{N}
  EXPECT_EQ(chunks("a\xe2\x80\x94" "b"), (V{"a", "\xe2\x80\x94", "b"}));  // em-dash is punctuation
  EXPECT_EQ(chunks("x\xc2\xa0\xc2\xa0y"), (V{"x", "\xc2\xa0", "\xc2\xa0", "y"}));  // NBSP: \s but not ' '
  EXPECT_EQ(chunks("\xff\xfe" "a"), (V{"\xff\xfe", "a"}));  // invalid bytes group as "other"
  std::string all;
  for (auto& c : chunks("Mr. Knightley's  \t\r\n  ''reply''\xe2\x80\x94 1,000!")) all += c;
  EXPECT_EQ(all, "Mr. Knightley's  \t\r\n  ''reply''\xe2\x80\x94 1,000!");
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  ByteTokenizer t;
  std::string s = "abc\0\xff\n"s;
  auto ids = t.encode(s);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{97, 98, 99, 0, 255, 10}));
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_THROW(t.decode({256}), UserError);
  EXPECT_THROW(make_tokenizer("sentencepiece", "/nonexistent"), UserError);
  EXPECT_THROW(make_tokenizer("gpt2", "/nonexistent"), UserError);
}

TEST(Gpt2Tokenizer, ByteMapMatchesGpt2) {
  EXPECT_EQ(gpt2_byte_to_unicode('!'), U'!');
  EXPECT_EQ(gpt2_byte_to_unicode(' '), U'\u0120');  // the famous "Ġ"
  EXPECT_EQ(gpt2_byte_to_unicode('\n'), U'\u010a');  // "Ċ"
  EXPECT_EQ(gpt2_byte_to_unicode(0), U'\u0100');
  EXPECT_EQ(gpt2_byte_to_unicode(0xAD), U'\u0143');
}

TEST(Gpt2Tokenizer, KnownIds) {
  auto tok = gpt2_or_skip();
  if (!tok) GTEST_SKIP() << "GPT-2 files absent: run scripts/fetch-data";
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eot_id(), 50256);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  EXPECT_EQ(tok->encode(" the"), (std::vector<std::int32_t>{262}));
  EXPECT_EQ(tok->encode("\n\n"), (std::vector<std::int32_t>{628}));
  EXPECT_EQ(tok->decode({15496, 995, 50256}), "Hello world<|endoftext|>");
  EXPECT_THROW(tok->decode({50257}), UserError);
}

// for_thread(): same ids, from the same tables (not read again), with a cache of its own; the
// copies run on threads at once and outlive the tokenizer they came from.
TEST(Gpt2Tokenizer, ForThreadSharesTablesAndEncodesTheSameOnThreads) {
  auto tok = gpt2_or_skip();
  std::string rdx = austen_rdx_path(default_data_dir());
  if (!tok || !file_exists(rdx)) GTEST_SKIP() << "GPT-2 files or janeaustenr absent: run scripts/fetch-data";
  std::string text;
  for (auto& d : read_austen(rdx)) {
    text += d.text;
    if (text.size() > (1u << 20)) break;
  }
  const auto want = tok->encode(text);
  auto& g = dynamic_cast<Gpt2Tokenizer&>(*tok);
  std::vector<std::unique_ptr<Tokenizer>> copies;
  for (int i = 0; i < 3; ++i) copies.push_back(tok->for_thread());
  for (auto& c : copies) {
    auto& cg = dynamic_cast<Gpt2Tokenizer&>(*c);
    EXPECT_EQ(&cg.token_bytes(262), &g.token_bytes(262)) << "the copy read its own tables";
    EXPECT_EQ(cg.num_merges(), g.num_merges());
    EXPECT_EQ(c->vocab_size(), tok->vocab_size());
    EXPECT_EQ(c->eot_id(), tok->eot_id());
  }
  tok.reset();  // the copies keep the tables alive
  std::vector<std::vector<std::int32_t>> got(copies.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < copies.size(); ++i)
    threads.emplace_back([&, i] { got[i] = copies[i]->encode(text); });
  for (auto& t : threads) t.join();
  for (const auto& ids : got) EXPECT_EQ(ids, want);
  ByteTokenizer bt;
  EXPECT_EQ(bt.for_thread()->encode("\x01z"), bt.encode("\x01z"));
}

TEST(Gpt2Tokenizer, MalformedFilesAreUserErrors) {
  auto dir = std::filesystem::temp_directory_path() / ("st_bpe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string enc = (dir / "encoder.json").string(), bpe = (dir / "vocab.bpe").string();
  std::string json = "{";
  for (int b = 0; b < 256; ++b) {
    char32_t c = gpt2_byte_to_unicode(static_cast<unsigned char>(b));
    std::string u;
    if (c < 0x80) u = (c == '"' ? "\\\"" : c == '\\' ? "\\\\" : std::string(1, static_cast<char>(c)));
    else { u.push_back(static_cast<char>(0xC0 | (c >> 6))); u.push_back(static_cast<char>(0x80 | (c & 0x3F))); }
    json += "\"" + u + "\": " + std::to_string(b) + ", ";
  }
  json += "\"ab\": 256}";
  write_file(enc, json.data(), json.size());
  std::string merges = "#version: 0.2\na b\n";
  write_file(bpe, merges.data(), merges.size());
  Gpt2Tokenizer ok(enc, bpe);
  EXPECT_EQ(ok.encode("abab"), (std::vector<std::int32_t>{256, 256}));
  EXPECT_EQ(ok.encode(" ab"), (std::vector<std::int32_t>{' ', 256}));
  merges = "#version: 0.2\na b\nb c\n";  // "bc" is not in the vocabulary
  write_file(bpe, merges.data(), merges.size());
  try {
    Gpt2Tokenizer bad(enc, bpe);
    FAIL() << "merge to a missing token accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  merges = "#version: 0.2\na b c\n";
  write_file(bpe, merges.data(), merges.size());
  EXPECT_THROW(Gpt2Tokenizer(enc, bpe), UserError);
  std::filesystem::remove_all(dir);
}

TEST(Gpt2Tokenizer, MatchesReferenceOnTrickyText) {
  auto tok = gpt2_or_skip();
  if (!tok) GTEST_SKIP() << "GPT-2 files absent: run scripts/fetch-data";
  std::string text =
      "\"I'm sure--I can't say,\" said Mr. Woodhouse; \"it's 10,000l. a-year, 1814\xe2\x80\x94you've seen 3rd & 4th.\"\n"
      "   Indented   line\twith\ttabs\r\n\r\n\n\n  trailing   \n"
      "Caf\xc3\xa9 na\xc3\xafve \xc3\x86sop \xc5\x93uvre \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xd0\x9f\xd1\x80\xd0\xb8 "
      "\xf0\x9f\x98\x80 emoji, \xc2\xbd \xe2\x85\xa7 numbers, \xc2\xa0nbsp\xe2\x80\x83" "em-space 'tis ''quoted'' "
      "WE'RE SHE'LL it'S 123456789 0.5 $3.50 -- ... !!! ???\n    ";
  expect_same_as_reference(*tok, text, "tricky text");
}

TEST(Gpt2Tokenizer, MatchesReferenceOnAusten) {
  auto tok = gpt2_or_skip();
  std::string rdx = austen_rdx_path(default_data_dir());
  if (!tok || !file_exists(rdx)) GTEST_SKIP() << "GPT-2 files or janeaustenr absent: run scripts/fetch-data";
  auto docs = read_austen(rdx);
  // 3 KB from the start and from the middle of every novel (36 KB in all; the reference
  // encoder concatenates arrays per chunk, quadratic time, so more gets slow).
  std::string text;
  for (auto& d : docs) text += d.text.substr(0, 3000) + d.text.substr(d.text.size() / 2, 3000);
  expect_same_as_reference(*tok, text, "austen sample");
}

TEST(Gpt2Tokenizer, RoundTripAndThroughputOnWholeCorpus) {
  auto tok = gpt2_or_skip();
  std::string rdx = austen_rdx_path(default_data_dir());
  if (!tok || !file_exists(rdx)) GTEST_SKIP() << "GPT-2 files or janeaustenr absent: run scripts/fetch-data";
  std::string text;
  for (auto& d : read_austen(rdx)) text += d.text;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_GT(ids.size(), text.size() / 6);
  EXPECT_LT(ids.size(), text.size() / 3);
  std::printf("gpt2: %zu bytes -> %zu tokens in %.2f s (%.1f MB/s, cold cache)\n", text.size(), ids.size(), s,
              text.size() / 1e6 / s);
  ByteTokenizer bt;
  t0 = std::chrono::steady_clock::now();
  auto b = bt.encode(text);
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(b.size(), text.size());
  std::printf("byte: %.0f MB/s\n", text.size() / 1e6 / s);
}
