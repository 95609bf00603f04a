// Deterministic, resumable, epoch-aware distributed sampling of fixed-size items (token
// windows or images). A global batch is a contiguous slice of a per-epoch permutation; each
// data-parallel rank reads its own contiguous part of it, and each micro-batch a part of that.
// Torch-free: batches are plain vectors; batch_tensors.h turns them into tensors.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "shardtrain/data/mnist.h"
#include "shardtrain/data/token_dataset.h"

namespace shardtrain::data {

// Where the next global batch starts: `position` indexes the epoch's permutation. Saved in
// checkpoints as two int64; independent of the world size, so a run resumes on any D.
struct SamplerCursor {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  std::array<std::int64_t, 2> to_array() const { return {epoch, position}; }
  static SamplerCursor from_array(const std::array<std::int64_t, 2>& a);  // UserError if negative
  bool operator==(const SamplerCursor& o) const { return epoch == o.epoch && position == o.position; }
};

struct SamplerConfig {
  std::int64_t global_batch = 8;  // sequences (or images) per optimizer step, all ranks together
  int micro_batches = 1;          // gradient-accumulation steps per optimizer step
  std::uint64_t seed = 1234;
  bool shuffle = true;            // false: items in order (validation)
  int rank = 0, world = 1;        // data-parallel rank and size
  // 0: rank r reads the r-th contiguous part of the global batch, micro-batch m the m-th part
  // of that. G > 0 (train.reproducible, train/leaf_plan.h): the global batch is world x
  // micro_batches leaves of micro_batch items, and rank r = g G + s reads at micro-batch m the
  // leaf g (micro_batches G) + m G + s.
  int leaf_group = 0;
};

// The index arithmetic shared by both samplers.
class IndexSampler {
 public:
  IndexSampler(std::int64_t num_items, const SamplerConfig& cfg);
  std::int64_t num_items() const { return n_; }
  std::int64_t steps_per_epoch() const { return n_ / cfg_.global_batch; }
  std::int64_t local_batch() const { return cfg_.global_batch / cfg_.world; }
  std::int64_t micro_batch() const { return local_batch() / cfg_.micro_batches; }
  // The cursor after one global batch; wraps to the next epoch (position 0) when fewer than
  // global_batch items are left in this one (the remainder is dropped for that epoch).
  SamplerCursor next(const SamplerCursor& c) const;
  // Validates a cursor read from a checkpoint against this sampler.
  void check(const SamplerCursor& c) const;
  // Item ids of the whole global batch at c (what every rank reads, together).
  std::vector<std::int64_t> global_items(const SamplerCursor& c) const;
  // Item ids this rank reads for micro-batch m of the global batch at c.
  std::vector<std::int64_t> local_items(const SamplerCursor& c, int micro) const;
  // The item at `index` of epoch e's order (a seeded Fisher-Yates permutation, or identity).
  std::int64_t item_at(std::int64_t epoch, std::int64_t index) const;
  const SamplerConfig& config() const { return cfg_; }

 private:
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const;
  std::int64_t n_;
  SamplerConfig cfg_;
  mutable std::int64_t perm_epoch_ = -1;  // cache of the last epoch's permutation
  mutable std::vector<std::int64_t> perm_;
};

// Sequences of seq_len + 1 tokens: window w covers tokens [w*seq_len, w*seq_len + seq_len + 1),
// so consecutive windows share one token and every token is a target once per epoch.
struct TokenBatch {
  std::int64_t batch = 0, seq_len = 0;
  std::vector<std::int32_t> tokens;  // [batch, seq_len + 1]
  // A dataset with a loss mask: the mask bytes of the same tokens, [batch, seq_len + 1]; the
  // target at position t (token t+1) counts iff mask[t+1] is 1. Empty: every target counts.
  std::vector<std::uint8_t> mask;
};

class TokenSampler {
 public:
  TokenSampler(const TokenDataset& ds, std::int64_t seq_len, const SamplerConfig& cfg);
  const IndexSampler& index() const { return index_; }
  TokenBatch batch(const SamplerCursor& c, int micro) const;
  SamplerCursor next(const SamplerCursor& c) const { return index_.next(c); }
  // The targets that count in the whole global batch at c (all ranks' micro-batches together;
  // every rank computes the same number from the dataset, no communication). A dataset without
  // a mask: global_batch x seq_len.
  std::int64_t counted_targets(const SamplerCursor& c) const;

 private:
  const TokenDataset& ds_;
  std::int64_t seq_len_;
  IndexSampler index_;
};

struct ImageBatch {
  std::int64_t batch = 0;
  int channels = 1, height = 0, width = 0;
  std::vector<std::uint8_t> pixels;  // [batch, channels, height, width]
  std::vector<std::uint8_t> labels;  // [batch]
};

class ImageSampler {
 public:
  ImageSampler(const ImageDataset& ds, const SamplerConfig& cfg);
  const IndexSampler& index() const { return index_; }
  ImageBatch batch(const SamplerCursor& c, int micro) const;
  SamplerCursor next(const SamplerCursor& c) const { return index_.next(c); }

 private:
  const ImageDataset& ds_;
  IndexSampler index_;
};

}  // namespace shardtrain::data
