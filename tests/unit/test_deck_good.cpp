// Valid decks: defaults, typed reading, overrides, provenance, and the resolved deck's round trip.
#include <gtest/gtest.h>

#include <set>

#include "shardtrain/deck/deck.h"
#include "shardtrain/util/error.h"

using shardtrain::deck::Deck;
using shardtrain::deck::KeySpec;
using shardtrain::deck::Type;
namespace deck = shardtrain::deck;

namespace {
const char* kFullDeck = R"(# a deck that sets something in every section
[run]
name = "round \"trip\" \\ ünïcode"
seed = 7
out_dir = "/tmp/x y"
threads = 3

[parallel]
strategy = "hybrid_shard_zero2"
shard_group_size = 4
simulate_ranks_per_host = 2

[comm]
backend = "mpi"
timeout_s = 30          # an int is accepted where a float is expected
flight_recorder = 0

[model]
arch = "llama"
d_model = 96
n_heads = 6
n_kv_heads = 2
norm_eps = 1e-6
rope_theta = 500000.0
tie_embeddings = false
dropout = 0.1

[fsdp]
param_dtype = "bf16"
keep_fp32 = []
ignored_params = ["tok_emb", "lm_head.weight"]
forward_prefetch = true

[optimizer]
lr = 0.1
eps = 1e-20
weight_decay = 0.0
no_decay = ["bias"]

[lr]
schedule = "linear"
min_lr = 1e-5

[train]
max_steps = 123456789012
global_batch = 64
micro_batch = 4
grad_accum = 2

[data]
val_fraction = 0.5

[log]
peak_tflops = 989.4

[checkpoint]
every_minutes = 0.3333333333333333
resume = "runs/a/checkpoints/step_100.h5"
async = true
)";
}  // namespace

TEST(DeckSchema, KeysAreWellFormed) {
  std::set<std::string> seen, section_names;
  for (const auto& s : deck::sections()) section_names.insert(s.name);
  for (const KeySpec& k : deck::schema()) {
    SCOPED_TRACE(k.key);
    EXPECT_TRUE(seen.insert(k.key).second) << "duplicate key";
    auto dot = k.key.find('.');
    ASSERT_NE(dot, std::string::npos);
    EXPECT_EQ(k.key.find('.', dot + 1), std::string::npos) << "keys are section.name";
    EXPECT_TRUE(section_names.count(k.key.substr(0, dot))) << "section not in sections()";
    EXPECT_FALSE(k.help.empty());
    EXPECT_EQ(k.help.find('\n'), std::string::npos);
    EXPECT_EQ(deck::find_key(k.key), &k);
    EXPECT_EQ(k.default_value.index(), static_cast<size_t>(k.type)) << "default has the key's type";
  }
  EXPECT_EQ(deck::find_key("optimizer.lrr"), nullptr);
}

TEST(DeckDefaults, EveryKeyTakesItsDefault) {
  Deck d = Deck::defaults();
  for (const KeySpec& k : deck::schema()) {
    SCOPED_TRACE(k.key);
    EXPECT_EQ(d.values().at(k.key), k.default_value);
    EXPECT_FALSE(d.is_set(k.key));
    EXPECT_EQ(d.origin(k.key), "default");
  }
  EXPECT_EQ(d.values().size(), deck::schema().size());
  EXPECT_EQ(d.get_string("run.name"), "quickstart");
  EXPECT_EQ(d.get_int("run.seed"), 1234);
  EXPECT_EQ(d.get_string("parallel.strategy"), "full_shard");
  EXPECT_DOUBLE_EQ(d.get_float("comm.timeout_s"), 600.0);
  EXPECT_DOUBLE_EQ(d.get_float("optimizer.lr"), 3e-4);
  EXPECT_EQ(d.get_string_list("fsdp.keep_fp32"), (std::vector<std::string>{"norm", "ln_"}));
  EXPECT_EQ(d.get_string("checkpoint.resume"), "auto");
  EXPECT_FALSE(d.get_bool("checkpoint.async"));
}

TEST(DeckDefaults, EmptyAndCommentOnlyDecksMeanAllDefaults) {
  const Deck defaults = Deck::defaults();
  for (const char* text : {"", "\n\n", "# nothing set yet\n   # still nothing\n", "\xEF\xBB\xBF"}) {
    Deck d = Deck::parse(text, "empty.toml");
    EXPECT_EQ(d.values(), defaults.values());
    EXPECT_EQ(d.hash(), defaults.hash());
  }
}

TEST(DeckParse, ReadsTypedValuesAndRecordsWhereTheyCameFrom) {
  Deck d = Deck::parse(kFullDeck, "full.toml");
  EXPECT_EQ(d.get_string("run.name"), "round \"trip\" \\ ünïcode");
  EXPECT_DOUBLE_EQ(d.get_float("comm.timeout_s"), 30.0);
  EXPECT_EQ(d.get_int("train.max_steps"), 123456789012);
  EXPECT_TRUE(d.get_string_list("fsdp.keep_fp32").empty());
  EXPECT_EQ(d.get_string_list("fsdp.ignored_params"), (std::vector<std::string>{"tok_emb", "lm_head.weight"}));
  EXPECT_FALSE(d.get_bool("model.tie_embeddings"));
  EXPECT_TRUE(d.is_set("comm.timeout_s"));
  EXPECT_TRUE(d.is_set("comm.backend"));
  EXPECT_FALSE(d.is_set("optimizer.beta1"));
  EXPECT_EQ(d.origin("run.seed"), "full.toml:4:1");
  EXPECT_EQ(d.source(), "full.toml");
}

TEST(DeckParse, DottedKeysAndInlineTablesMeanTheSameAsSections) {
  Deck a = Deck::parse("[optimizer]\nlr = 1e-3\nbeta1 = 0.8\n", "a.toml");
  Deck b = Deck::parse("optimizer.lr = 1e-3\noptimizer.beta1 = 0.8\n", "b.toml");
  Deck c = Deck::parse("optimizer = { lr = 1e-3, beta1 = 0.8 }\n", "c.toml");
  EXPECT_EQ(a.values(), b.values());
  EXPECT_EQ(a.values(), c.values());
  EXPECT_DOUBLE_EQ(a.get_float("optimizer.lr"), 1e-3);
}

TEST(DeckResolved, RoundTripsToTheSameDeck) {
  for (const Deck& d : {Deck::defaults(), Deck::parse(kFullDeck, "full.toml")}) {
    std::string text = d.resolved_toml();
    Deck back = Deck::parse(text, "resolved.toml");
    EXPECT_EQ(back.values(), d.values()) << text;
    EXPECT_EQ(back.resolved_toml(), Deck::parse(back.resolved_toml(), "again.toml").resolved_toml());
  }
}

TEST(DeckResolved, ShowsEveryKeyWithHelpAndMarksDefaults) {
  Deck d = Deck::parse("[optimizer]\nlr = 1e-3\n", "d.toml");
  std::string text = d.resolved_toml();
  for (const auto& s : deck::sections()) EXPECT_NE(text.find("\n[" + s.name + "]"), std::string::npos) << s.name;
  for (const KeySpec& k : deck::schema()) {
    std::string name = k.key.substr(k.key.find('.') + 1);
    EXPECT_NE(text.find("\n" + name + " = "), std::string::npos) << k.key;
  }
  auto line_of = [&](const std::string& start) {
    auto b = text.find("\n" + start);
    return text.substr(b + 1, text.find('\n', b + 1) - b - 1);
  };
  EXPECT_EQ(line_of("lr = ").find("(default)"), std::string::npos);
  EXPECT_NE(line_of("lr = ").find("peak learning rate"), std::string::npos);
  EXPECT_NE(line_of("beta1 = ").find("(default)"), std::string::npos);
  EXPECT_NE(line_of("timeout_s = ").find("[s]"), std::string::npos);
}

TEST(DeckOverrides, AreTypedAndWinOverTheFile) {
  Deck d = Deck::parse("[optimizer]\nlr = 1e-3\n", "d.toml",
                       {"optimizer.lr=3e-4", "train.max_steps=+50", "comm.timeout_s=30", "fsdp.cpu_offload=true",
                        "run.name=\"my run\"", "fsdp.keep_fp32=[norm, 'ln_f' ]", "optimizer.no_decay=bias,norm",
                        "fsdp.ignored_params=[]", "parallel.strategy=no_shard", "run.seed=1", "run.seed=2"});
  EXPECT_DOUBLE_EQ(d.get_float("optimizer.lr"), 3e-4);
  EXPECT_EQ(d.get_int("train.max_steps"), 50);
  EXPECT_DOUBLE_EQ(d.get_float("comm.timeout_s"), 30.0);
  EXPECT_TRUE(d.get_bool("fsdp.cpu_offload"));
  EXPECT_EQ(d.get_string("run.name"), "my run");
  EXPECT_EQ(d.get_string_list("fsdp.keep_fp32"), (std::vector<std::string>{"norm", "ln_f"}));
  EXPECT_EQ(d.get_string_list("optimizer.no_decay"), (std::vector<std::string>{"bias", "norm"}));
  EXPECT_TRUE(d.get_string_list("fsdp.ignored_params").empty());
  EXPECT_EQ(d.get_string("parallel.strategy"), "no_shard");
  EXPECT_EQ(d.get_int("run.seed"), 2) << "the last override of a key wins";
  EXPECT_EQ(d.origin("optimizer.lr"), "--set optimizer.lr=3e-4");
  EXPECT_TRUE(d.is_set("fsdp.ignored_params"));
  EXPECT_EQ(Deck::defaults({"model.preset=gpt2-355m"}).get_string("model.preset"), "gpt2-355m");
  EXPECT_EQ(Deck::defaults({"model.preset="}).get_string("model.preset"), "");
}

TEST(DeckOverrides, ChangeTheHash) {
  Deck a = Deck::defaults(), b = Deck::defaults({"run.seed=1"}), c = Deck::defaults();
  EXPECT_EQ(a.hash(), c.hash());
  EXPECT_NE(a.hash(), b.hash());
}

TEST(DeckGetters, WrongTypeOrUnknownKeyIsAnInternalError) {
  Deck d = Deck::defaults();
  EXPECT_THROW(d.get_int("optimizer.lr"), shardtrain::Error);
  EXPECT_THROW(d.get_float("optimizer.lrr"), shardtrain::Error);
  try {
    d.get_string("train.max_steps");
  } catch (const shardtrain::UserError&) {
    ADD_FAILURE() << "a program asking for the wrong type is a bug, not bad input";
  } catch (const shardtrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.max_steps"), std::string::npos);
  }
}

TEST(DeckPaths, EmptyDirectoriesResolveFromTheRunName) {
  Deck d = Deck::defaults({"run.name=exp1"});
  EXPECT_EQ(d.out_dir(), "runs/exp1");
  EXPECT_EQ(d.checkpoint_dir(), "runs/exp1/checkpoints");
  Deck e = Deck::defaults({"run.out_dir=/scratch/x", "checkpoint.dir=/fast/ckpt"});
  EXPECT_EQ(e.out_dir(), "/scratch/x");
  EXPECT_EQ(e.checkpoint_dir(), "/fast/ckpt");
  EXPECT_EQ(Deck::defaults({"run.out_dir=/scratch/y"}).checkpoint_dir(), "/scratch/y/checkpoints");
}
