// Sampler index arithmetic. The permutation of epoch e is a Fisher-Yates shuffle driven by
// SplitMix64 seeded from (seed, e), with unbiased bounded draws, so it is the same on every
// platform, compiler and rank count (std::shuffle's output is implementation-defined).
#include "shardtrain/data/sampler.h"

#include <numeric>

#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {
struct SplitMix64 {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection (no modulo bias).
  std::uint64_t below(std::uint64_t bound) {
    std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % bound);
    for (;;) {
      std::uint64_t r = next();
      if (r < limit) return r % bound;
    }
  }
};
}  // namespace

SamplerCursor SamplerCursor::from_array(const std::array<std::int64_t, 2>& a) {
  ST_USER_CHECK(a[0] >= 0 && a[1] >= 0, "invalid data cursor (epoch ", a[0], ", position ", a[1], ")");
  return {a[0], a[1]};
}

IndexSampler::IndexSampler(std::int64_t num_items, const SamplerConfig& cfg) : n_(num_items), cfg_(cfg) {
  ST_USER_CHECK(cfg.world >= 1 && cfg.rank >= 0 && cfg.rank < cfg.world, "data-parallel rank ", cfg.rank,
                " outside world of ", cfg.world);
  ST_USER_CHECK(cfg.global_batch >= 1 && cfg.micro_batches >= 1, "global batch (", cfg.global_batch,
                ") and micro-batches (", cfg.micro_batches, ") must be positive");
  ST_USER_CHECK(cfg.global_batch % (static_cast<std::int64_t>(cfg.world) * cfg.micro_batches) == 0,
                "global batch ", cfg.global_batch, " is not divisible by data-parallel ranks (", cfg.world,
                ") x micro-batches (", cfg.micro_batches, ")");
  ST_USER_CHECK(cfg.leaf_group >= 0 && (cfg.leaf_group == 0 || cfg.world % cfg.leaf_group == 0), "leaf group ",
                cfg.leaf_group, " does not divide the data-parallel ranks (", cfg.world, ")");
  ST_USER_CHECK(n_ >= cfg.global_batch, "the dataset has ", n_, " samples, fewer than one global batch of ",
                cfg.global_batch);
}

const std::vector<std::int64_t>& IndexSampler::permutation(std::int64_t epoch) const {
  if (perm_epoch_ != epoch) {
    perm_.resize(n_);
    std::iota(perm_.begin(), perm_.end(), 0);
    // Seed mixes (seed, epoch) through one SplitMix64 step so nearby seeds/epochs decorrelate.
    SplitMix64 init{cfg_.seed ^ (0xD1B54A32D192ED03ULL * static_cast<std::uint64_t>(epoch + 1))};
    SplitMix64 rng{init.next()};
    for (std::int64_t i = n_ - 1; i > 0; --i)
      std::swap(perm_[i], perm_[static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i + 1)))]);
    perm_epoch_ = epoch;
  }
  return perm_;
}

std::int64_t IndexSampler::item_at(std::int64_t epoch, std::int64_t index) const {
  ST_CHECK(index >= 0 && index < n_, "sampler index ", index, " outside [0, ", n_, ")");
  return cfg_.shuffle ? permutation(epoch)[index] : index;
}

void IndexSampler::check(const SamplerCursor& c) const {
  ST_USER_CHECK(c.epoch >= 0 && c.position >= 0 && c.position + cfg_.global_batch <= n_, "data cursor (epoch ",
                c.epoch, ", position ", c.position, ") does not fit a dataset of ", n_,
                " samples with global batch ", cfg_.global_batch, ": was it saved for another dataset?");
}

SamplerCursor IndexSampler::next(const SamplerCursor& c) const {
  SamplerCursor n{c.epoch, c.position + cfg_.global_batch};
  if (n.position + cfg_.global_batch > n_) n = {c.epoch + 1, 0};
  return n;
}

std::vector<std::int64_t> IndexSampler::global_items(const SamplerCursor& c) const {
  check(c);
  std::vector<std::int64_t> out(cfg_.global_batch);
  for (std::int64_t i = 0; i < cfg_.global_batch; ++i) out[i] = item_at(c.epoch, c.position + i);
  return out;
}

std::vector<std::int64_t> IndexSampler::local_items(const SamplerCursor& c, int micro) const {
  check(c);
  ST_CHECK(micro >= 0 && micro < cfg_.micro_batches, "micro-batch ", micro, " outside [0, ", cfg_.micro_batches, ")");
  const std::int64_t m = cfg_.micro_batches, g = cfg_.leaf_group;
  const std::int64_t leaf = g > 0 ? (cfg_.rank / g) * (m * g) + micro * g + cfg_.rank % g : cfg_.rank * m + micro;
  std::int64_t first = c.position + leaf * micro_batch();
  std::vector<std::int64_t> out(micro_batch());
  for (std::int64_t i = 0; i < micro_batch(); ++i) out[i] = item_at(c.epoch, first + i);
  return out;
}

namespace {
// The dataset's rows when the packing needs them (UserError naming the key otherwise).
std::shared_ptr<const RowWindows> rows_for(const TokenDataset& ds, std::int64_t seq_len, const PackingOptions& p) {
  check_packing(ds, seq_len, p);
  if (p.mode == Packing::Stream) return nullptr;
  return std::make_shared<const RowWindows>(ds, seq_len, p.mode);  // overlong rows: checked above
}
}  // namespace

void check_packing(const TokenDataset& ds, std::int64_t seq_len, const PackingOptions& p) {
  ST_USER_CHECK(seq_len > 0, "sequence length must be positive, got ", seq_len);
  const bool needs_rows = p.mode != Packing::Stream || p.document_mask;
  const std::string key = p.mode != Packing::Stream ? std::string("data.packing = \"") + to_string(p.mode) + "\""
                                                    : std::string("data.document_mask = true");
  ST_USER_CHECK(!needs_rows || ds.has_rows(), key, " needs row boundaries, which '", ds.path(),
                "' has not: its dataset was written by an older `shardtrain data prepare` (format version ",
                ds.meta().masked ? kMaskedTokenFormatVersion : kTokenFormatVersion, ", before ",
                kRowsTokenFormatVersion, "); prepare it again with this build, or set data.packing = \"stream\"",
                p.document_mask ? " without data.document_mask" : "");
  ST_USER_CHECK(!p.document_mask || p.mode == Packing::Stream, "data.document_mask = true applies to data.packing = "
                "\"stream\"; \"", to_string(p.mode), "\" already computes each row alone");
  if (p.mode == Packing::Stream || p.truncate) return;
  const std::string bad = first_overlong_row(ds, seq_len);
  ST_USER_CHECK(bad.empty(), "data.overlong = \"error\": row ", bad, " is longer than model.seq_len = ", seq_len,
                ": shorten it, raise model.seq_len, or set data.overlong = \"truncate\"");
}

std::int64_t first_row_from(const TokenDataset& ds, std::int64_t t) {
  std::int64_t lo = 0, hi = ds.row_count();  // the first row whose start >= t lies in [lo, hi]
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (ds.row(mid).start < t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

TokenSampler::TokenSampler(const TokenDataset& ds, std::int64_t seq_len, const SamplerConfig& cfg,
                           const PackingOptions& packing)
    : ds_(ds), seq_len_(seq_len), packing_(packing), rows_(rows_for(ds, seq_len, packing)),
      index_(rows_ ? rows_->size() : (ds.size() > 0 ? (ds.size() - 1) / seq_len : 0), cfg) {}

TokenBatch TokenSampler::batch(const SamplerCursor& c, int micro) const { return windows(index_.local_items(c, micro)); }

// Stream with a document mask: window w's pieces of documents, cut at each row start inside it
// (the window's first piece starts mid-document unless a row starts there).
void TokenSampler::stream_segments(std::int64_t w, TokenBatch& b) const {
  const std::int64_t first = w * seq_len_, end = first + seq_len_ + 1;
  std::int64_t at = first, count = 0;
  for (std::int64_t r = first_row_from(ds_, first + 1); r < ds_.row_count() && ds_.row(r).start < end; ++r) {
    const std::int64_t s = ds_.row(r).start;
    b.segments.push_back(static_cast<std::int32_t>(s - at));
    at = s;
    ++count;
  }
  b.segments.push_back(static_cast<std::int32_t>(end - at));
  b.segment_count.push_back(static_cast<std::int32_t>(count + 1));
}

TokenBatch TokenSampler::windows(const std::vector<std::int64_t>& items) const {
  TokenBatch b;
  b.batch = static_cast<std::int64_t>(items.size());
  b.seq_len = seq_len_;
  const std::int64_t w = seq_len_ + 1;
  b.tokens.assign(static_cast<std::size_t>(b.batch * w), 0);
  if (ds_.masked()) b.mask.assign(b.tokens.size(), 0);
  for (std::int64_t i = 0; i < b.batch; ++i) {
    if (!rows_) {
      ds_.read(items[i] * seq_len_, w, &b.tokens[i * w]);
      if (ds_.masked()) ds_.read_mask(items[i] * seq_len_, w, &b.mask[i * w]);
      if (packing_.document_mask) stream_segments(items[i], b);
      continue;
    }
    // Whole rows from position 0; the rest stays padding (id 0, mask 0, no target).
    std::int64_t at = 0, count = 0;
    for (const PlacedRow* r = rows_->rows_begin(items[i]); r != rows_->rows_end(items[i]); ++r) {
      ds_.read(r->start, r->length, &b.tokens[i * w + at]);
      if (ds_.masked()) ds_.read_mask(r->start, r->length, &b.mask[i * w + at]);
      b.segments.push_back(static_cast<std::int32_t>(r->length));
      at += r->length;
      ++count;
    }
    b.segment_count.push_back(static_cast<std::int32_t>(count));
  }
  return b;
}

std::int64_t TokenSampler::window_targets(std::int64_t w) const {
  if (rows_) {
    std::int64_t n = 0;
    for (const PlacedRow* r = rows_->rows_begin(w); r != rows_->rows_end(w); ++r)
      if (r->length >= 2) n += ds_.masked() ? ds_.counted(r->start + 1, r->length - 1) : r->length - 1;
    return n;
  }
  // Window w's targets are tokens w*seq_len + 1 .. w*seq_len + seq_len; with a document mask, a
  // target that starts a document is not its predecessor's.
  const std::int64_t first = w * seq_len_;
  std::int64_t n = ds_.masked() ? ds_.counted(first + 1, seq_len_) : seq_len_;
  if (packing_.document_mask)
    for (std::int64_t r = first_row_from(ds_, first + 1); r < ds_.row_count() && ds_.row(r).start <= first + seq_len_;
         ++r)
      if (!ds_.masked() || ds_.counted(ds_.row(r).start, 1) == 1) --n;
  return n;
}

std::int64_t TokenSampler::counted_targets(const SamplerCursor& c) const {
  if (!ds_.masked() && !rows_ && !packing_.document_mask) return index_.config().global_batch * seq_len_;
  std::int64_t n = 0;
  for (std::int64_t w : index_.global_items(c)) n += window_targets(w);
  return n;
}

PackingStats TokenSampler::stats() const {
  return rows_ ? rows_->stats() : packing_stats(ds_, seq_len_, Packing::Stream);
}

ImageSampler::ImageSampler(const ImageDataset& ds, const SamplerConfig& cfg) : ds_(ds), index_(ds.size(), cfg) {}

ImageBatch ImageSampler::batch(const SamplerCursor& c, int micro) const {
  auto items = index_.local_items(c, micro);
  ImageBatch b;
  b.batch = static_cast<std::int64_t>(items.size());
  b.channels = ds_.meta().channels;
  b.height = ds_.meta().height;
  b.width = ds_.meta().width;
  int px = ds_.pixels();
  b.pixels.resize(b.batch * px);
  b.labels.resize(b.batch);
  for (std::int64_t i = 0; i < b.batch; ++i) {
    std::copy(ds_.image(items[i]), ds_.image(items[i]) + px, b.pixels.begin() + i * px);
    b.labels[i] = ds_.label(items[i]);
  }
  return b;
}

}  // namespace shardtrain::data
