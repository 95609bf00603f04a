// Parts of the training loop and its inference tools that need no ranks: the smoke-run
// learning-rate schedule (every shipped deck trains with train.max_steps = 4) and the token
// choice of `generate` / train.sample_every (greedy, top-k, top-p, seeded repeatability).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"
#include "shardtrain/infer/sampling.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;

TEST(SmokeSchedule, EveryShippedDeckTrainsFourSteps) {
  int decks = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(SHARDTRAIN_SOURCE_DIR) + "/inputs")) {
    if (e.path().extension() != ".toml") continue;
    ++decks;
    const deck::Deck d = deck::Deck::load(e.path().string(), {"train.max_steps=4"});
    std::string note;
    optim::LrSchedule s;
    ASSERT_NO_THROW(s = train::lr_schedule_from_deck(d, &note)) << e.path();
    EXPECT_LT(s.warmup_steps, 4) << e.path();
    if (d.get_int("lr.warmup_steps") >= 4) {
      EXPECT_NE(note.find("lr.warmup_steps"), std::string::npos) << note;
      EXPECT_NE(note.find(d.get_int("lr.decay_steps") > 0 ? "lr.decay_steps" : "train.max_steps"), std::string::npos)
          << note;
    }
    for (int64_t step = 0; step < 4; ++step) EXPECT_GT(s.lr_at(step), 0.0f) << e.path() << " step " << step;
  }
  EXPECT_GE(decks, 5);
}

TEST(SmokeSchedule, ScalesTheWarmupAndLeavesAFittingOneAlone) {
  std::string note;
  auto s = train::lr_schedule_from_deck(deck::Deck::defaults({"train.max_steps=50", "lr.warmup_steps=100"}), &note);
  EXPECT_EQ(s.warmup_steps, 5);
  EXPECT_EQ(s.decay_steps, 50);
  EXPECT_NE(note.find("lr.warmup_steps = 100"), std::string::npos) << note;
  EXPECT_NE(note.find("train.max_steps = 50"), std::string::npos) << note;
  note.clear();
  s = train::lr_schedule_from_deck(deck::Deck::defaults({"train.max_steps=50", "lr.warmup_steps=10"}), &note);
  EXPECT_EQ(s.warmup_steps, 10);
  EXPECT_TRUE(note.empty()) << note;
  // An explicit decay horizon shorter than the warmup is named in the note.
  s = train::lr_schedule_from_deck(
      deck::Deck::defaults({"train.max_steps=1000", "lr.warmup_steps=100", "lr.decay_steps=40"}), &note);
  EXPECT_EQ(s.warmup_steps, 4);
  EXPECT_NE(note.find("lr.decay_steps = 40"), std::string::npos) << note;
}

namespace {
std::vector<float> logits() { return {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f}; }
}  // namespace

TEST(ChooseToken, GreedyTakesTheFirstMaximum) {
  infer::SamplingOptions o;
  o.temperature = 0;
  std::mt19937_64 rng(1);
  EXPECT_EQ(infer::choose_token(logits(), 6, o, rng), 1);
  // Entries past the tokenizer's vocabulary are never chosen.
  EXPECT_EQ(infer::choose_token({0.0f, 1.0f, 9.0f}, 2, o, rng), 1);
}

TEST(ChooseToken, TopKAndTopPRestrictTheChoice) {
  infer::SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  std::mt19937_64 rng(7);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[infer::choose_token(logits(), 6, o, rng)];
  EXPECT_EQ(seen.size(), 2u);  // the two tied maxima, ids 1 and 3, about equally often
  EXPECT_GT(seen[1], 850);
  EXPECT_GT(seen[3], 850);
  o.top_k = 0;
  o.top_p = 0.01;  // the single most likely token (the lower id of the tie)
  for (int i = 0; i < 100; ++i) EXPECT_EQ(infer::choose_token(logits(), 6, o, rng), 1);
  o.top_p = 1.0;
  seen.clear();
  for (int i = 0; i < 20000; ++i) ++seen[infer::choose_token(logits(), 6, o, rng)];
  EXPECT_EQ(seen.size(), 6u);
  // softmax: p(2) / p(1) = e^-1
  EXPECT_NEAR(static_cast<double>(seen[2]) / seen[1], std::exp(-1.0), 0.05);
}

TEST(ChooseToken, TheSameSeedRepeats) {
  infer::SamplingOptions o;
  std::mt19937_64 a(42), b(42), c(43);
  std::vector<int> x, y, z;
  for (int i = 0; i < 64; ++i) {
    x.push_back(infer::choose_token(logits(), 6, o, a));
    y.push_back(infer::choose_token(logits(), 6, o, b));
    z.push_back(infer::choose_token(logits(), 6, o, c));
  }
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
}

TEST(ChooseToken, BadOptionsNameTheFlag) {
  infer::SamplingOptions o;
  o.top_p = 0;
  try {
    infer::check_sampling_options(o, {"--temperature", "--top-k", "--top-p", "--max-new-tokens"});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--top-p"), std::string::npos) << e.what();
  }
}
