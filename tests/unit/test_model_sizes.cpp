// The one table of model size limits (util/model_limits.h): the deck's ranges are the table's,
// every size and two-field width is held to it by resolve_spec and read_hf_config (naming the
// config.json key and the file), and at the largest sizes it allows no count overflows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/deck/deck.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model/model.h"
#include "shardtrain/model/model_sizes.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/model_limits.h"

namespace shardtrain::model {
namespace {

namespace fs = std::filesystem;

// The message of the UserError fn throws ("" when it throws none).
template <typename Fn>
std::string user_error(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

ModelSpec llama(int64_t d, int64_t layers, int64_t heads, int64_t ff, int64_t vocab) {
  ModelSpec s;
  s.arch = "llama";
  s.d_model = d;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = heads;
  s.d_ff = ff;
  s.vocab_size = vocab;
  s.seq_len = 16;
  s.tie_embeddings = false;
  return s;
}

TEST(ModelSizes, TheDeckRangesAreTheTable) {
  for (const limits::SizeLimit& l : limits::kModelSizes) {
    const deck::KeySpec* k = deck::find_key("model." + std::string(l.field));
    ASSERT_NE(k, nullptr) << l.field;
    EXPECT_TRUE(k->has_max) << l.field;
    EXPECT_EQ(static_cast<int64_t>(k->max), l.max) << l.field;
  }
}

TEST(ModelSizes, EachFieldAtItsLimitAndOneAbove) {
  for (const limits::SizeLimit& l : limits::kModelSizes) {
    ModelSpec s;  // gpt2 defaults: every field well inside
    s.arch = "vit";
    for (const SpecField& f : spec_fields())
      if (f.int_field && l.field == f.name) {
        s.*f.int_field = l.max;
        EXPECT_EQ(user_error([&] { check_model_sizes(s); }).find("exceeds the limit " + std::to_string(l.max) + " ("),
                  std::string::npos)
            << l.field << " at its limit";
        s.*f.int_field = l.max + 1;
        const std::string e = user_error([&] { check_model_sizes(s); });
        EXPECT_NE(e.find("model." + std::string(l.field) + " = " + std::to_string(l.max + 1) + " exceeds the limit " +
                         std::to_string(l.max)),
                  std::string::npos)
            << l.field << ": " << e;
      }
  }
}

TEST(ModelSizes, WidthsOfTwoFields) {
  ModelSpec s = llama(32, 2, 32, 64, 256);
  s.head_dim = 65536;  // each within its own limit; 32 x 65536 = 2^21 is not
  EXPECT_NE(user_error([&] { resolve_spec(s); }).find("model.n_heads x model.head_dim = 2097152 exceeds the limit 1048576"),
            std::string::npos);
  s.head_dim = 32768;  // 2^20: allowed
  EXPECT_EQ(user_error([&] { resolve_spec(s); }), "");
  ModelSpec v;
  v.arch = "vit";
  v.channels = 65536;  // x 7^2 patch values: past 2^20
  EXPECT_NE(user_error([&] { resolve_spec(v); }).find("model.channels x model.patch_size^2 = 3211264"), std::string::npos);
}

TEST(ModelSizes, TheLargestAllowedModelsCountWithoutOverflow) {
  // Every size at its limit, the widths within theirs: the parameter count (about 2^52.8 for
  // each architecture) stays below 2^57, and positive, which a wrapped int64 would not be.
  const ModelSpec l = llama(limits::max_of("d_model"), limits::max_of("n_layers"), 16, limits::max_of("d_ff"),
                            limits::max_of("vocab_size"));
  const int64_t n = parameter_count(l);
  EXPECT_GT(n, int64_t{1} << 52);
  EXPECT_LT(n, int64_t{1} << 57);
  ModelSpec g;
  g.arch = "gpt2";
  g.d_model = limits::max_of("d_model");
  g.n_heads = 16;
  g.n_layers = limits::max_of("n_layers");
  g.d_ff = limits::max_of("d_ff");
  g.vocab_size = limits::max_of("vocab_size");
  g.seq_len = limits::max_of("seq_len");
  EXPECT_GT(parameter_count(g), int64_t{1} << 52);
  EXPECT_LT(parameter_count(g), int64_t{1} << 57);
  ModelSpec v;
  v.arch = "vit";
  v.d_model = limits::max_of("d_model");
  v.n_heads = 16;
  v.n_layers = limits::max_of("n_layers");
  v.d_ff = limits::max_of("d_ff");
  v.patch_size = 256;
  v.channels = 16;         // 16 x 256^2 = 2^20
  v.image_size = 262144;   // past its own limit
  EXPECT_NE(user_error([&] { resolve_spec(v); }).find("model.image_size = 262144"), std::string::npos);
  v.image_size = 65536;    // (65536 / 256)^2 = 2^16 patches
  v.num_classes = limits::max_of("num_classes");
  EXPECT_GT(parameter_count(v), int64_t{1} << 52);
  EXPECT_LT(parameter_count(v), int64_t{1} << 57);
}

class HfConfigSizes : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() /
                  ("st_hf_sizes_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  // The message read_hf_config gives a small Llama config.json with `key` = `value`.
  std::string config_error(const std::string& key, const nlohmann::json& value) {
    nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 128},
                        {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                        {"vocab_size", 256}, {"max_position_embeddings", 64}};
    c[key] = value;
    std::ofstream(dir_ / "config.json") << c.dump();
    return user_error([&] { read_hf_config(dir_.string()); });
  }
};

TEST_F(HfConfigSizes, EveryKeyIsHeldToTheDecksLimitNamingFileAndKey) {
  const std::string file = (dir_ / "config.json").string() + ": ";
  EXPECT_EQ(config_error("hidden_size", 64), "");
  EXPECT_EQ(config_error("hidden_size", int64_t{1} << 31).rfind(file + "hidden_size = 2147483648 exceeds the limit 131072", 0), 0u);
  EXPECT_EQ(config_error("hidden_size", int64_t{1} << 40).rfind(file + "hidden_size = 1099511627776 exceeds the limit 131072", 0), 0u);
  EXPECT_EQ(config_error("num_hidden_layers", 16385).rfind(file + "num_hidden_layers = 16385 exceeds the limit 16384", 0), 0u);
  EXPECT_EQ(config_error("vocab_size", int64_t{1} << 40).rfind(file + "vocab_size = 1099511627776 exceeds the limit 2147483647", 0), 0u);
  EXPECT_EQ(config_error("intermediate_size", -5).rfind(file + "intermediate_size = -5 is not a positive integer", 0), 0u);
  EXPECT_EQ(config_error("intermediate_size", 18446744073709551615ull).rfind(file + "intermediate_size = 18446744073709551615 is not a positive integer", 0), 0u);
  EXPECT_EQ(config_error("num_attention_heads", 3).rfind(file + "hidden_size = 64 is not divisible by num_attention_heads = 3", 0), 0u);
  EXPECT_EQ(config_error("head_dim", 65536), "");  // 4 x 2^16 = 2^18: within the width limit
  EXPECT_EQ(config_error("max_position_embeddings", int64_t{1} << 40).rfind(file + "max_position_embeddings = 1099511627776 exceeds the limit 1048576", 0), 0u);
}

}  // namespace
}  // namespace shardtrain::model
