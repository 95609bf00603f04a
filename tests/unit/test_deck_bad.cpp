// Malformed decks in tests/decks/bad/: each must fail with a UserError naming the file, line and culprit.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <fstream>
#include <map>
#include <set>

#include "shardtrain/deck/deck.h"
#include "shardtrain/util/error.h"

using shardtrain::UserError;
using shardtrain::deck::Deck;
namespace fs = std::filesystem;

namespace {

struct Expect {
  int line;                         // 0: the problem has no line (a whole-file problem)
  std::vector<std::string> parts;   // substrings the message must contain
};

// One row per file in tests/decks/bad; a file without a row (or a row without a file) fails.
const std::map<std::string, Expect> kBadDecks = {
    {"unknown_key_typo", {3, {"unknown key 'optimizer.lrr'", "did you mean 'optimizer.lr'?"}}},
    {"unknown_section", {1, {"unknown section [optimiser]", "did you mean [optimizer]?"}}},
    {"key_at_top_level", {2, {"'lr' outside any section", "did you mean 'optimizer.lr'?"}}},
    {"key_in_wrong_section", {3, {"unknown key 'train.lr'", "did you mean 'optimizer.lr'?"}}},
    {"unknown_key_no_suggestion", {2, {"unknown key 'model.flux_capacitor'"}}},
    {"string_for_int", {2, {"train.max_steps", "expected an integer", "a string"}}},
    {"float_for_int", {2, {"train.micro_batch", "expected an integer", "write 8"}}},
    {"int_for_string", {2, {"run.name", "expected a string", "an integer (42)"}}},
    {"nul_in_string", {2, {"run.name", "must not contain a NUL character"}}},
    {"metrics_file_escapes", {2, {"log.metrics_file", "stays inside run.out_dir", "\"..\" leaves the directory"}}},
    {"run_name_escapes", {2, {"run.name", "stays inside runs/"}}},
    {"string_for_bool", {2, {"fsdp.cpu_offload", "expected a boolean"}}},
    {"string_for_float", {2, {"optimizer.lr", "expected a float", "'3e-4'"}}},
    {"bool_for_int", {2, {"train.val_every", "expected an integer", "a boolean"}}},
    {"date_for_string", {2, {"run.name", "got a date"}}},
    {"inline_table_for_float", {2, {"optimizer.lr", "got a table"}}},
    {"negative_count", {2, {"train.micro_batch", ">= 1", "-4"}}},
    {"out_of_range_fraction", {2, {"data.val_fraction", "[0, 0.5]", "0.9"}}},
    {"zero_timeout", {2, {"comm.timeout_s", "> 0"}}},
    {"bad_choice", {2, {"parallel.strategy", "full_shard, shard_grad_op, no_shard", "'zero3'"}}},
    {"duplicate_key", {3, {"redefine", "'lr'"}}},
    {"duplicate_table", {4, {"redefine", "'optimizer'"}}},
    {"syntax_missing_value", {2, {"expected value"}}},
    {"syntax_unclosed_string", {2, {"parsing string"}}},
    {"syntax_unclosed_header", {1, {"table header", "expected ']'"}}},
    {"binary_garbage", {1, {"utf-8", "UTF-8 TOML text"}}},
    {"utf16_with_bom", {1, {"utf-8"}}},
    {"non_utf8_bytes", {2, {"utf-8"}}},
    {"nul_byte", {2, {"control characters"}}},
    {"huge_integer", {2, {"99999999999999999999", "64 bits"}}},
    {"nan_float", {2, {"optimizer.lr", "finite", "nan"}}},
    {"inf_float", {2, {"comm.timeout_s", "finite", "inf"}}},
    {"array_for_scalar", {2, {"optimizer.lr", "expected a float", "an array"}}},
    {"scalar_for_list", {2, {"fsdp.keep_fp32", "list of strings", "write [\"norm\"]"}}},
    {"list_with_int", {2, {"optimizer.no_decay", "element 2 is an integer"}}},
    {"nested_table", {1, {"nested table 'optimizer.adam'"}}},
    {"deeply_nested_table", {1, {"nested table 'model.layers'"}}},
    {"dotted_key_too_deep", {2, {"nested table 'model.attn'"}}},
    {"array_of_tables", {1, {"[[optimizer]]", "write [optimizer]"}}},
    {"section_as_value", {1, {"'run' is a section", "write [run]"}}},
    {"empty_resume", {2, {"checkpoint.resume", "must not be empty"}}},
    {"min_lr_above_lr", {5, {"lr.min_lr", "optimizer.lr"}}},
    {"heads_do_not_divide", {3, {"model.n_heads = 12", "model.d_model = 100"}}},
    {"preset_wrong_arch", {3, {"model.preset", "gpt2-124m", "llama"}}},
};

fs::path bad_dir() { return fs::path(SHARDTRAIN_SOURCE_DIR) / "tests" / "decks" / "bad"; }

std::string load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    Deck::load(path, overrides);
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(DeckBad, EveryFileHasAnExpectationAndViceVersa) {
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(bad_dir()))
    if (entry.path().extension() == ".toml") files.insert(entry.path().stem().string());
  std::set<std::string> rows;
  for (const auto& [name, expect] : kBadDecks) rows.insert(name);
  EXPECT_EQ(files, rows);
  EXPECT_GE(files.size(), 25u);
}

TEST(DeckBad, EachFailsWithFileLineAndCulprit) {
  for (const auto& [name, expect] : kBadDecks) {
    SCOPED_TRACE(name);
    std::string path = (bad_dir() / (name + ".toml")).string();
    std::string msg = load_error(path);
    EXPECT_EQ(msg.rfind(path + ":" + std::to_string(expect.line) + ":", 0), 0u) << msg;
    for (const auto& part : expect.parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' in " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
  }
}

TEST(DeckBad, MissingFile) {
  std::string msg = load_error("/nonexistent/deck.toml");
  EXPECT_NE(msg.find("/nonexistent/deck.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
}

TEST(DeckBad, DirectoryInsteadOfFile) {
  std::string msg = load_error(bad_dir().string());
  EXPECT_NE(msg.find(bad_dir().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(DeckBad, EmptyPath) {
  EXPECT_NE(load_error("").find("path is empty"), std::string::npos);
}

TEST(DeckBad, UnreadableFile) {
  fs::path p = fs::temp_directory_path() / "shardtrain_test_unreadable.toml";
  { std::ofstream(p) << "[run]\nseed = 1\n"; }
  fs::permissions(p, fs::perms::none);
  std::ifstream probe(p);
  if (probe.good()) {  // root reads anything
    fs::remove(p);
    GTEST_SKIP() << "running as a user that can read a file with no permissions";
  }
  std::string msg = load_error(p.string());
  fs::remove(p);
  EXPECT_NE(msg.find("cannot read deck file"), std::string::npos) << msg;
}

TEST(DeckBad, OversizedFile) {
  fs::path p = fs::temp_directory_path() / "shardtrain_test_oversized.toml";
  { std::ofstream(p) << std::string(17u << 20, '#'); }
  std::string msg = load_error(p.string());
  fs::remove(p);
  EXPECT_NE(msg.find("too big for a deck"), std::string::npos) << msg;
}

TEST(DeckBad, Overrides) {
  struct Case {
    std::string set;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"optimizer.lr=abc", {"--set optimizer.lr=abc: expected a float"}},
      {"optimizer.lrr=1e-3", {"--set optimizer.lrr=1e-3", "unknown key 'optimizer.lrr'", "'optimizer.lr'"}},
      {"lr=1e-3", {"'lr' is a section", "did you mean 'optimizer.lr'?"}},
      {"optimizer=1", {"'optimizer' is a section"}},
      {"optimizer.lr", {"expected KEY=VALUE"}},
      {"train.max_steps=1.5", {"expected an integer", "'1.5'"}},
      {"train.max_steps=99999999999999999999", {"does not fit a 64-bit integer"}},
      {"train.max_steps=0", {"train.max_steps=0", ">= 1"}},
      {"comm.timeout_s=1e999", {"does not fit a double"}},
      {"comm.timeout_s=inf", {"finite"}},
      {"optimizer.lr=nan", {"finite"}},
      {"fsdp.cpu_offload=yes", {"expected true or false"}},
      {"parallel.strategy=zero3", {"must be one of", "hybrid_shard"}},
      {"fsdp.keep_fp32=[norm,,ln_]", {"empty element"}},
      {"fsdp.keep_fp32=[norm", {"expected a list"}},
      {"checkpoint.resume=", {"must not be empty"}},
      {"lr.min_lr=1", {"--set lr.min_lr=1", "exceeds the peak optimizer.lr"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.set);
    std::string msg;
    try {
      Deck::defaults({c.set});
      msg = "<no error>";
    } catch (const UserError& e) {
      msg = e.what();
    }
    for (const auto& part : c.parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' in " << msg;
  }
}

TEST(DeckBad, OverrideErrorsDoNotBlameTheFile) {
  std::string msg;
  try {
    Deck::parse("[optimizer]\nlr = 1e-3\n", "deck.toml", {"optimizer.lr=-1"});
  } catch (const UserError& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("--set optimizer.lr=-1: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("> 0"), std::string::npos) << msg;
}

namespace {
std::string parse_error(const std::string& text) {
  try {
    Deck::parse(text, "deck.toml");
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}
std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}
}  // namespace

// toml++ recurses per nesting level; a crafted deck thousands of levels deep must be refused
// by the pre-scan (file:line:col, one line) instead of overflowing the stack.
TEST(DeckBad, NestingIsCappedBeforeParsing) {
  const int n = 20000;
  struct Case {
    std::string name, text;
    int line;
  };
  const std::vector<Case> cases = {
      {"dotted header", "[run]\nseed = 1\n[a" + repeat(".a", n) + "]\n", 3},
      {"array-of-tables header", "[[a" + repeat(".a", n) + "]]\n", 1},
      {"dotted key", "[model]\n" + std::string("a") + repeat(".a", n) + " = 1\n", 2},
      {"top-level dotted key", "\n\nx" + repeat(" . x", n) + " = 1\n", 3},
      {"inline tables", "[run]\nname = " + repeat("{a = ", n) + "1" + repeat("}", n) + "\n", 2},
      {"arrays", "[fsdp]\nkeep_fp32 = " + repeat("[", n) + repeat("]", n) + "\n", 2},
      {"multi-line arrays", "[fsdp]\nkeep_fp32 = [\n" + repeat("[\n", n) + repeat("]\n", n) + "]\n", 8},
      {"arrays of inline tables", "x = [" + repeat("{a = [", n) + repeat("]}", n) + "]\n", 1},
      {"just past the cap", "[a.b.c.d.e.f.g.h.i]\n", 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string msg = parse_error(c.text);
    EXPECT_EQ(msg.rfind("deck.toml:" + std::to_string(c.line) + ":", 0), 0u) << msg.substr(0, 300);
    EXPECT_NE(msg.find("nesting"), std::string::npos) << msg.substr(0, 300);
    EXPECT_NE(msg.find("at most " + std::to_string(shardtrain::deck::kMaxDeckNesting)), std::string::npos)
        << msg.substr(0, 300);
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
}

// Dots and brackets inside strings and comments are not nesting; legal decks still parse.
TEST(DeckBad, NestingScanIgnoresStringsAndComments) {
  const std::string deep = repeat("[{.", 50);
  EXPECT_EQ(parse_error("[run]\nname = \"" + deep + "\"\n# " + deep + "\nout_dir = '" + deep + "'\n"),
            "<no error>");
  // (A multi-line string in a key that is not a path: run.name refuses control characters.)
  EXPECT_EQ(parse_error("[train]\nsample_prompt = \"\"\"\n" + deep + "\n" + deep + "\"\"\"\n"), "<no error>");
  EXPECT_EQ(parse_error("[run]\nname = '''" + deep + "'''\n"), "<no error>");
  EXPECT_EQ(parse_error("optimizer = { lr = 6e-4, no_decay = [\"a.b.c.d.e.f.g.h.i.j\"] }\n"
                        "[fsdp]\nkeep_fp32 = [\n  \"norm\", # [[[[[[[[[[\n  \"ln_\",\n]\n"),
            "<no error>");
  // A quoted header with dots is one segment: the ordinary "unknown section" error.
  EXPECT_NE(parse_error("[\"a.b.c.d.e.f.g.h.i.j.k\"]\n").find("unknown section"), std::string::npos);
}

TEST(DeckBad, FifoIsRefusedWithoutBlocking) {
  fs::path p = fs::temp_directory_path() / ("shardtrain_test_fifo_" + std::to_string(::getpid()) + ".toml");
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  auto f = std::async(std::launch::async, [&] { return load_error(p.string()); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // A regression blocks in open() until a writer comes: be that writer, then fail.
    int w = ::open(p.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    ADD_FAILURE() << "Deck::load blocked on a FIFO";
  }
  std::string msg = f.get();
  fs::remove(p);
  EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("FIFO"), std::string::npos) << msg;
  EXPECT_NE(msg.find("regular file"), std::string::npos) << msg;
}

TEST(DeckBad, DeviceIsRefused) {
  std::string msg = load_error("/dev/zero");
  EXPECT_EQ(msg.rfind("/dev/zero: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("character device"), std::string::npos) << msg;
}

TEST(DeckBad, SizeCapIsOneMiB) {
  fs::path p = fs::temp_directory_path() / ("shardtrain_test_1mib_" + std::to_string(::getpid()) + ".toml");
  { std::ofstream(p) << std::string(shardtrain::deck::kMaxDeckFileBytes + 1, '#'); }
  std::string msg = load_error(p.string());
  fs::remove(p);
  EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("at most 1 MiB"), std::string::npos) << msg;
}

TEST(DeckBad, HugeCountsAreRangeErrors) {
  struct Case {
    std::string text, parts;
  };
  const std::vector<Case> cases = {
      {"[run]\nthreads = 100000\n", "run.threads: must be <= 4096"},
      {"[optimizer]\nhost_threads = 100000\n", "optimizer.host_threads: must be <= 4096"},
      {"[model]\nseq_len = 1000000000\n", "model.seq_len: must be <= 1048576"},
      {"[train]\nmicro_batch = 4611686018427387904\n", "train.micro_batch: must be <= 1048576"},
      {"[train]\ngrad_accum = 4294967297\n", "train.grad_accum: must be <= 1048576"},
      {"[checkpoint]\nkeep_last = 4294967297\n", "checkpoint.keep_last: must be <= 1048576"},
      {"[fsdp]\nlimit_all_gathers = 4294967297\n", "fsdp.limit_all_gathers: must be <= 1024"},
      {"[parallel]\nshard_group_size = 4294967298\n", "parallel.shard_group_size: must be <= 1048576"},
      {"[comm]\ntimeout_s = 1e300\n", "comm.timeout_s: must be <= 1e+06"},
      {"[model]\nd_model = -1\n", "model.d_model: must be >= 1 (allowed: [1, 131072]), got -1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::string msg = parse_error(c.text);
    EXPECT_EQ(msg.rfind("deck.toml:2:", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.parts), std::string::npos) << msg;
  }
}
