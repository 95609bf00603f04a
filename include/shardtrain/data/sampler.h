// Deterministic, resumable, epoch-aware distributed sampling of fixed-size items (token
// windows or images). A global batch is a contiguous slice of a per-epoch permutation; each
// data-parallel rank reads its own contiguous part of it, and each micro-batch a part of that.
// Torch-free: batches are plain vectors; batch_tensors.h turns them into tensors.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include <memory>

#include "shardtrain/data/mnist.h"
#include "shardtrain/data/packing.h"
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

// Sequences of seq_len + 1 tokens. Stream: window w covers tokens [w*seq_len, w*seq_len +
// seq_len + 1), so consecutive windows share one token and every token is a target once per
// epoch. Packed / padded (packing.h): a window holds whole rows from position 0, then padding.
struct TokenBatch {
  std::int64_t batch = 0, seq_len = 0;
  std::vector<std::int32_t> tokens;  // [batch, seq_len + 1]
  // A dataset with a loss mask: the mask bytes of the same tokens, [batch, seq_len + 1]; the
  // target at position t (token t+1) counts iff mask[t+1] is 1. Empty: every target counts.
  std::vector<std::uint8_t> mask;
  // Rows apart (packed, padded, stream with document_mask); empty: one sequence per window.
  // Window i's segments, in order from position 0, are the next segment_count[i] entries of
  // segments (their lengths); positions past their sum are padding. A segment is one row (or a
  // document's piece): attention, positions and targets stay inside it, so the target at t
  // (token t+1) exists only when t+1 is in t's segment.
  std::vector<std::int32_t> segments, segment_count;
  bool rows_apart() const { return !segment_count.empty(); }
};

class TokenSampler {
 public:
  // packed / padded and document_mask need a dataset with rows (UserError naming the key).
  TokenSampler(const TokenDataset& ds, std::int64_t seq_len, const SamplerConfig& cfg, const PackingOptions& packing = {});
  const IndexSampler& index() const { return index_; }
  TokenBatch batch(const SamplerCursor& c, int micro) const;
  // The windows of `items` (window ids), as batch() reads them.
  TokenBatch windows(const std::vector<std::int64_t>& items) const;
  SamplerCursor next(const SamplerCursor& c) const { return index_.next(c); }
  // The targets that count in the whole global batch at c (all ranks' micro-batches together;
  // every rank computes the same number from the dataset, no communication). A stream without
  // a mask or document mask: global_batch x seq_len.
  std::int64_t counted_targets(const SamplerCursor& c) const;
  // Counted targets of window w (the same rule as batch()'s targets).
  std::int64_t window_targets(std::int64_t w) const;
  // The split's packing statistics at this seq_len (windows, fill, truncation).
  PackingStats stats() const;
  const PackingOptions& packing() const { return packing_; }

 private:
  void stream_segments(std::int64_t w, TokenBatch& b) const;
  const TokenDataset& ds_;
  std::int64_t seq_len_;
  PackingOptions packing_;
  std::shared_ptr<const RowWindows> rows_;  // packed / padded
  IndexSampler index_;
};

// What TokenSampler's constructor checks of `p` against a split (UserError naming the key):
// packed / padded and document_mask need rows, document_mask only with the stream, and with
// data.overlong = "error" no row may be longer than seq_len (a scan of the rows). A split with no
// rows or windows passes (it has nothing to refuse). `deck check` and `train` call it on both splits.
void check_packing(const TokenDataset& ds, std::int64_t seq_len, const PackingOptions& p);

// The first row whose start lies at or after token `t` of the split (row_count() if none).
std::int64_t first_row_from(const TokenDataset& ds, std::int64_t t);

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
