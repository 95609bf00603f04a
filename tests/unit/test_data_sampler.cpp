// Sampler tests: the union over data-parallel ranks equals the 1-rank global batch, epochs,
// determinism, resume from a saved cursor, window contents, and the tensor adapter.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
SamplerConfig cfg(std::int64_t gb, int world, int rank, int micro = 1, bool shuffle = true) {
  SamplerConfig c;
  c.global_batch = gb;
  c.world = world;
  c.rank = rank;
  c.micro_batches = micro;
  c.shuffle = shuffle;
  c.seed = 42;
  return c;
}
}  // namespace

TEST(IndexSampler, UnionOverRanksEqualsOneRankBatch) {
  const std::int64_t n = 1000, gb = 24;
  IndexSampler one(n, cfg(gb, 1, 0));
  for (int world : {1, 2, 3, 4}) {
    for (int micro : {1, 2}) {
      SamplerCursor c;
      for (int step = 0; step < 90; ++step) {  // crosses two epoch boundaries (41 steps/epoch)
        std::vector<std::int64_t> joined;
        for (int r = 0; r < world; ++r) {
          IndexSampler s(n, cfg(gb, world, r, micro));
          for (int m = 0; m < micro; ++m) {
            auto part = s.local_items(c, m);
            ASSERT_EQ(static_cast<std::int64_t>(part.size()), gb / world / micro);
            joined.insert(joined.end(), part.begin(), part.end());
          }
        }
        ASSERT_EQ(joined, one.global_items(c)) << "world " << world << " micro " << micro << " step " << step;
        c = one.next(c);
      }
      EXPECT_EQ(c.epoch, 2);
    }
  }
}

TEST(IndexSampler, EpochsArePermutationsThatDiffer) {
  IndexSampler s(100, cfg(10, 1, 0));
  EXPECT_EQ(s.steps_per_epoch(), 10);
  std::vector<std::int64_t> e0, e1;
  SamplerCursor c;
  for (int i = 0; i < 10; ++i, c = s.next(c)) {
    auto b = s.global_items(c);
    e0.insert(e0.end(), b.begin(), b.end());
  }
  EXPECT_EQ(c, (SamplerCursor{1, 0}));
  for (int i = 0; i < 10; ++i, c = s.next(c)) {
    auto b = s.global_items(c);
    e1.insert(e1.end(), b.begin(), b.end());
  }
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(sorted[i], i);  // each item exactly once per epoch
  EXPECT_NE(e0, e1);
  std::vector<std::int64_t> identity(100);
  for (int i = 0; i < 100; ++i) identity[i] = i;
  EXPECT_NE(e0, identity);
  // Same seed, fresh object: identical; other seed: different.
  IndexSampler again(100, cfg(10, 1, 0));
  EXPECT_EQ(again.global_items({0, 0}), s.global_items({0, 0}));
  auto other = cfg(10, 1, 0);
  other.seed = 43;
  EXPECT_NE(IndexSampler(100, other).global_items({0, 0}), s.global_items({0, 0}));
  // Validation order is sequential.
  EXPECT_EQ(IndexSampler(100, cfg(10, 1, 0, 1, false)).global_items({3, 20})[0], 20);
}

TEST(IndexSampler, ResumeFromSavedCursorOnAnotherWorldSize) {
  IndexSampler s(500, cfg(12, 1, 0));
  SamplerCursor c;
  for (int i = 0; i < 50; ++i) c = s.next(c);
  auto saved = c.to_array();
  auto resumed = SamplerCursor::from_array(saved);
  EXPECT_EQ(resumed, c);
  std::vector<std::int64_t> joined;
  for (int r = 0; r < 3; ++r) {
    auto p = IndexSampler(500, cfg(12, 3, r)).local_items(resumed, 0);
    joined.insert(joined.end(), p.begin(), p.end());
  }
  EXPECT_EQ(joined, s.global_items(c));
  EXPECT_THROW(SamplerCursor::from_array({-1, 0}), UserError);
  EXPECT_THROW(s.global_items({0, 495}), UserError);  // position past the epoch's last batch
  EXPECT_THROW(IndexSampler(500, cfg(10, 3, 0)), UserError);  // 10 not divisible by 3
  EXPECT_THROW(IndexSampler(5, cfg(8, 1, 0)), UserError);     // fewer items than one batch
}

TEST(TokenSampler, WindowsAreShiftedTargetsAndTensorsMatch) {
  auto dir = fs::temp_directory_path() / ("st_samp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ByteTokenizer bt;
  std::string text;
  for (int i = 0; i < 2000; ++i) text.push_back(static_cast<char>(i % 251));
  prepare_token_dataset({{"t", text}}, bt, dir.string(), 0.0);
  TokenDataset ds(dir.string(), "train");
  const std::int64_t T = 16;
  TokenSampler s(ds, T, cfg(8, 2, 1, 2));
  EXPECT_EQ(s.index().num_items(), (2000 - 1) / T);
  SamplerCursor c{0, 8};
  auto b = s.batch(c, 1);
  ASSERT_EQ(b.batch, 2);
  auto items = s.index().local_items(c, 1);
  for (std::int64_t i = 0; i < b.batch; ++i)
    for (std::int64_t t = 0; t <= T; ++t)
      ASSERT_EQ(b.tokens[i * (T + 1) + t], static_cast<unsigned char>(text[items[i] * T + t]));
  auto tt = to_tensors(b);
  EXPECT_EQ(tt.inputs.sizes(), (std::vector<std::int64_t>{2, T}));
  EXPECT_EQ(tt.inputs.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(tt.inputs.index({torch::indexing::Slice(), torch::indexing::Slice(1, T)}),
                           tt.targets.index({torch::indexing::Slice(), torch::indexing::Slice(0, T - 1)})));
  EXPECT_EQ(tt.targets[1][T - 1].item<std::int64_t>(), b.tokens[2 * (T + 1) - 1]);
  fs::remove_all(dir);
}

TEST(ImageSampler, BatchesAndNormalisedTensors) {
  auto dir = fs::temp_directory_path() / ("st_isamp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  MnistDigits d;
  for (int i = 0; i < 40; ++i) {
    d.labels.push_back(static_cast<std::uint8_t>(i / 4));
    for (int p = 0; p < kMnistPixels; ++p) d.images.push_back(static_cast<std::uint8_t>(i * 6));
  }
  prepare_mnist_dataset(d, dir.string(), 0.25);
  ImageDataset ds(dir.string(), "train");
  ASSERT_EQ(ds.size(), 30);
  ImageSampler s(ds, cfg(6, 2, 0));
  auto b = s.batch({0, 0}, 0);
  auto items = s.index().local_items({0, 0}, 0);
  ASSERT_EQ(b.batch, 3);
  auto t = to_tensors(b);
  EXPECT_EQ(t.images.sizes(), (std::vector<std::int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(t.labels.scalar_type(), torch::kInt64);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.labels[i].item<std::int64_t>(), ds.label(items[i]));
    float expect = (ds.image(items[i])[0] / 255.0f - kMnistMean) / kMnistStd;
    EXPECT_NEAR(t.images[i][0][27][27].item<float>(), expect, 1e-5);
  }
  fs::remove_all(dir);
}
