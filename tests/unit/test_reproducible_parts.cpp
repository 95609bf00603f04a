// The single-process parts of train.reproducible: LeafSum sums pushes in the pairwise tree
// (and a push of pre-summed subtrees gives the same bits), ExactSquareSum does not depend on how
// values are split or ordered, the sampler's leaf order matches LeafPlan::leaf_of and covers the
// global batch, plan_leaves refuses what the scheme cannot serve, and a resume names each
// guarantee field that changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "shardtrain/data/sampler.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/exact_square_sum.h"
#include "shardtrain/fsdp/leaf_sum.h"
#include "shardtrain/train/leaf_plan.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;

namespace {

at::Tensor leaf(int i, int64_t n = 1001) {
  at::Generator g = at::detail::createCPUGenerator(500 + i);
  return at::randn({n}, g).mul_(1 + i % 5);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

at::Tensor pairwise(int first, int count) {
  if (count == 1) return leaf(first);
  return pairwise(first, count / 2) + pairwise(first + count / 2, count / 2);
}

deck::Deck deck_with(std::vector<std::string> sets) {
  sets.push_back("train.reproducible=true");
  return deck::Deck::defaults(sets);
}

}  // namespace

TEST(LeafSum, PushesAreSummedInThePairwiseTree) {
  fsdp::LeafSum s;
  for (int i = 0; i < 8; ++i) s.push(leaf(i));
  EXPECT_EQ(s.pushes(), 8);
  const at::Tensor tree = pairwise(0, 8);
  EXPECT_TRUE(same_bits(s.take(), tree));
  // Sequential summation rounds differently: the tree order is what makes the bits.
  at::Tensor seq = leaf(0).clone();
  for (int i = 1; i < 8; ++i) seq.add_(leaf(i));
  EXPECT_FALSE(same_bits(seq, tree));
  // Two pushes of 4-leaf subtrees (a rank of a 2-way shard group... at another world size).
  fsdp::LeafSum halves;
  halves.push(pairwise(0, 4));
  halves.push(pairwise(4, 4));
  EXPECT_TRUE(same_bits(halves.take(), tree));
}

TEST(LeafSum, ANonPowerOfTwoCountHasNoTreeSum) {
  fsdp::LeafSum s;
  for (int i = 0; i < 3; ++i) s.push(leaf(i));
  EXPECT_FALSE(s.take().defined());
  EXPECT_EQ(s.pushes(), 0);  // emptied either way
}

TEST(ExactSquareSum, SplitAndOrderDoNotChangeABit) {
  std::mt19937 rng(3);
  std::vector<float> x(20000);
  std::normal_distribution<float> n(0, 1);
  for (size_t i = 0; i < x.size(); ++i) x[i] = n(rng) * std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
  x[5] = std::numeric_limits<float>::denorm_min();
  x[6] = std::numeric_limits<float>::max();
  x[7] = 0.0f;
  x[8] = -0.0f;
  fsdp::ExactSquareSum whole;
  whole.add(x.data(), static_cast<int64_t>(x.size()));
  long double ref = 0;
  for (float v : x) ref += static_cast<long double>(v) * v;
  EXPECT_NEAR(static_cast<double>(whole.value() / ref), 1.0, 1e-15);
  for (int pieces : {2, 3, 8, 17}) {
    std::vector<float> y = x;
    std::shuffle(y.begin(), y.end(), rng);
    fsdp::ExactSquareSum total;
    const int64_t per = static_cast<int64_t>(y.size()) / pieces + 1;
    for (int64_t b = 0; b < static_cast<int64_t>(y.size()); b += per) {
      fsdp::ExactSquareSum part;
      part.add(y.data() + b, std::min<int64_t>(per, static_cast<int64_t>(y.size()) - b));
      // Through the words a Comm sums, as the engine merges shards.
      std::vector<int64_t> a = total.words(), w = part.words();
      for (size_t i = 0; i < a.size(); ++i) a[i] += w[i];
      total = fsdp::ExactSquareSum::from_words(a.data(), static_cast<int64_t>(a.size()));
    }
    const double v = total.value(), u = whole.value();
    EXPECT_EQ(std::memcmp(&v, &u, sizeof v), 0) << pieces << " pieces";
  }
}

TEST(ExactSquareSum, InfAndNanSurvive) {
  fsdp::ExactSquareSum s;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  s.add(&inf, 1);
  EXPECT_TRUE(std::isinf(s.value()));
  s.add(&nan, 1);
  EXPECT_TRUE(std::isnan(s.value()));
}

TEST(LeafOrder, SamplerReadsTheLeavesTheTreeExpects) {
  for (int world : {1, 2, 4, 8}) {
    for (int group : {1, 2, world}) {
      if (group > world || world % group) continue;
      train::LeafPlan p;
      p.on = true;
      p.leaves = 8;
      p.per_rank = 8 / world;
      p.group = group;
      p.world = world;
      data::SamplerConfig cfg;
      cfg.global_batch = 16;  // 8 leaves of 2 items
      cfg.micro_batches = static_cast<int>(p.per_rank);
      cfg.world = world;
      cfg.leaf_group = group;
      std::set<int64_t> seen;
      for (int r = 0; r < world; ++r) {
        cfg.rank = r;
        data::IndexSampler s(1000, cfg);
        const std::vector<int64_t> global = s.global_items({0, 32});
        for (int j = 0; j < p.per_rank; ++j) {
          const int64_t v = p.leaf_of(r, j);
          const std::vector<int64_t> items = s.local_items({0, 32}, j);
          ASSERT_EQ(items.size(), 2u);
          EXPECT_EQ(items[0], global[2 * v]) << "world " << world << " group " << group << " rank " << r << " j " << j;
          EXPECT_EQ(items[1], global[2 * v + 1]);
          seen.insert(v);
        }
      }
      EXPECT_EQ(seen.size(), 8u) << "world " << world << " group " << group;
    }
  }
}

TEST(PlanLeaves, RefusesWhatTheTreeCannotServe) {
  auto refused = [](const std::vector<std::string>& sets, int world, bool nccl, const std::string& want) {
    try {
      train::plan_leaves(deck_with(sets), world, 0, 1, nccl);
      ADD_FAILURE() << "accepted; expected: " << want;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({"train.micro_batch=2"}, 1, false, "needs train.global_batch");
  refused({"train.global_batch=12", "train.micro_batch=2"}, 2, false, "12 / 2 leaves, which must be a power of two");
  refused({"train.global_batch=16", "train.micro_batch=2"}, 3, false,
          "serves world sizes 1, 2, 4, 8 (8 leaves of train.micro_batch = 2 samples, at least one per rank); this run "
          "has 3 ranks");
  refused({"train.global_batch=16", "train.micro_batch=2"}, 16, false, "this run has 16 ranks");
  refused({"train.global_batch=16", "train.micro_batch=2"}, 2, true, "comm.backend = mpi");
  refused({"train.global_batch=16", "train.micro_batch=2", "fsdp.reduce_dtype=bf16"}, 2, false,
          "fsdp.reduce_dtype = bf16");
  const train::LeafPlan p = train::plan_leaves(deck_with({"train.global_batch=16", "train.micro_batch=2"}), 4, 3, 2, false);
  EXPECT_TRUE(p.on);
  EXPECT_EQ(p.leaves, 8);
  EXPECT_EQ(p.per_rank, 2);
  EXPECT_EQ(p.leaf_of(0), 5);  // rank 3 = replica 1, shard 1: leaf 1*(2*2) + 0*2 + 1
  EXPECT_EQ(p.leaf_of(1), 7);
}

TEST(Guarantee, EachChangedFieldIsNamed) {
  train::LeafPlan p;
  p.leaves = 8;
  const nlohmann::json now = train::reproducibility_guarantee(p, 2, 1, "cpu");
  EXPECT_EQ(train::guarantee_differences(now, now), "");
  nlohmann::json saved = now;
  saved["threads_per_rank"] = 4;
  saved["cpu"] = "Another CPU";
  const std::string d = train::guarantee_differences(saved, now);
  EXPECT_NE(d.find("threads_per_rank was 4 when the checkpoint was written, is 1 now"), std::string::npos) << d;
  EXPECT_NE(d.find("cpu was \"Another CPU\""), std::string::npos) << d;
  EXPECT_EQ(d.find("leaves"), std::string::npos) << d;
}
