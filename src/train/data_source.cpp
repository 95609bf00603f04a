// Token and image data sources over the data layer's datasets and samplers.
#include "data_source.h"

#include <filesystem>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/mnist.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {

data::SamplerConfig val_config(const data::SamplerConfig& train) {
  data::SamplerConfig v = train;
  v.shuffle = false;
  return v;
}

// What the token and image sources share: a train and a val split of one dataset directory, a
// sampler over each (the val one only when the split holds a batch), and the batch plumbing.
// Derived::to_batch picks a sampled batch's two tensors.
template <typename Dataset, typename Sampler, typename Derived>
class SplitSource : public DataSource {
 public:
  Batch train_batch(const data::SamplerCursor& c, int m) const override {
    return Derived::to_batch(data::to_tensors(train_sampler_.batch(c, m)));
  }
  data::SamplerCursor next(const data::SamplerCursor& c) const override { return train_sampler_.next(c); }
  void check_cursor(const data::SamplerCursor& c) const override { train_sampler_.index().check(c); }
  int64_t train_steps_per_epoch() const override { return train_sampler_.index().steps_per_epoch(); }
  int64_t val_batches() const override { return val_sampler_ ? val_sampler_->index().steps_per_epoch() : 0; }
  Batch val_batch(int64_t i, int m) const override {
    data::SamplerCursor c{0, i * val_sampler_->index().config().global_batch};
    return Derived::to_batch(data::to_tensors(val_sampler_->batch(c, m)));
  }

 protected:
  template <typename... SamplerArgs>
  explicit SplitSource(const std::string& dir, const SamplerArgs&... args)
      : train_(dir, "train"), val_(dir, "val"), train_sampler_(train_, args...) {}
  template <typename... SamplerArgs>
  void open_val(const SamplerArgs&... args) {
    val_sampler_ = std::make_unique<Sampler>(val_, args...);
  }

  Dataset train_, val_;
  Sampler train_sampler_;
  std::unique_ptr<Sampler> val_sampler_;
};

class TokenSource : public SplitSource<data::TokenDataset, data::TokenSampler, TokenSource> {
 public:
  TokenSource(const std::string& dir, const model::ModelSpec& spec, const data::SamplerConfig& cfg, int64_t seq,
              const data::PackingOptions& packing)
      : SplitSource(dir, seq, cfg, packing), seq_(seq), packing_(packing) {
    ST_USER_CHECK(train_.meta().vocab_size <= spec.vocab_size, "data.dataset '", dir, "' has vocabulary size ",
                  train_.meta().vocab_size, " but model.vocab_size is ", spec.vocab_size);
    ST_USER_CHECK(seq <= spec.seq_len, "sequence length ", seq, " exceeds model.seq_len ", spec.seq_len);
    ST_USER_CHECK(train_sampler_.index().steps_per_epoch() > 0, "data.dataset '", dir, "': the training split has ",
                  train_.size(), " tokens (", train_sampler_.index().num_items(), " ", to_string(packing.mode),
                  " windows of ", seq, "), fewer than one global batch of ", cfg.global_batch, " windows");
    if (packing.mode == data::Packing::Stream ? val_.size() > seq + 1 : val_.size() > 0) open_val(seq, val_config(cfg), packing);
  }
  template <typename T>
  static Batch to_batch(const T& t) {
    return {t.inputs, t.targets, model::Rows{t.positions, t.cu_seqlens}};
  }
  int64_t tokens_per_item() const override {
    if (packing_.mode == data::Packing::Stream) return seq_;
    return std::max<int64_t>(1, std::llround(static_cast<double>(seq_) * train_sampler_.stats().fill()));
  }
  double attention_length() const override {  // document masks: counted as the stream's (an upper bound)
    return packing_.mode == data::Packing::Stream ? 0 : train_sampler_.stats().attention_length();
  }
  bool classification() const override { return false; }
  std::string windows() const override {
    return std::string(to_string(packing_.mode)) + (packing_.document_mask ? " with data.document_mask" : "") +
           (packing_.mode != data::Packing::Stream ? " of " + std::to_string(seq_) : "");
  }
  bool counted_targets_only() const override {
    return train_.masked() || packing_.mode != data::Packing::Stream || packing_.document_mask;
  }
  int64_t counted_targets(const data::SamplerCursor& c) const override { return train_sampler_.counted_targets(c); }
  const data::TokenDatasetMeta& meta() const { return train_.meta(); }
  std::string describe() const override {
    std::ostringstream os;
    os << train_.meta().tokenizer << " tokens: " << train_.size() << " train, " << val_.size() << " val";
    if (train_.masked())
      os << "; loss mask (" << train_.meta().chat_format << "): " << train_.meta().train_counted << " train, "
         << train_.meta().val_counted << " val tokens counted";
    if (train_.has_rows() || packing_.mode != data::Packing::Stream) {
      os << "\n# data: train " << train_sampler_.stats().line(seq_, packing_.mode);
      if (packing_.document_mask) os << "; attention and positions restart at each document (data.document_mask)";
    }
    return os.str();
  }

 private:
  int64_t seq_;
  data::PackingOptions packing_;
};

class ImageSource : public SplitSource<data::ImageDataset, data::ImageSampler, ImageSource> {
 public:
  ImageSource(const std::string& dir, const model::ModelSpec& spec, const data::SamplerConfig& cfg)
      : SplitSource(dir, cfg) {
    const auto& m = train_.meta();
    ST_USER_CHECK(m.height == spec.image_size && m.width == spec.image_size && m.channels == spec.channels,
                  "data.dataset '", dir, "' holds ", m.channels, "x", m.height, "x", m.width,
                  " images but the model expects ", spec.channels, "x", spec.image_size, "x", spec.image_size);
    ST_USER_CHECK(m.num_classes <= spec.num_classes, "data.dataset '", dir, "' has ", m.num_classes,
                  " classes but model.num_classes is ", spec.num_classes);
    ST_USER_CHECK(train_sampler_.index().steps_per_epoch() > 0, "data.dataset '", dir, "': fewer training images (",
                  train_.size(), ") than one global batch (", cfg.global_batch, ")");
    if (val_.size() >= cfg.global_batch) open_val(val_config(cfg));
  }
  template <typename T>
  static Batch to_batch(const T& t) {
    return {t.images, t.labels};
  }
  int64_t tokens_per_item() const override { return 0; }
  bool classification() const override { return true; }
  std::string describe() const override {
    std::ostringstream os;
    os << "images: " << train_.size() << " train, " << val_.size() << " val";
    return os.str();
  }
};

// data.dataset = "": items drawn from (run.seed, item index) alone, so a global batch is the same
// whatever the world size and micro-batching, like a real dataset's: uniform random tokens for
// language models, N(0,1) images and uniform labels for ViT. No files and no validation split;
// for throughput, scaling and memory runs (the loss only shows that training runs).
class SyntheticSource : public DataSource {
 public:
  // Items per "epoch": large enough never to wrap in a real run, small enough for int64 cursors.
  static constexpr int64_t kItems = int64_t{1} << 40;

  SyntheticSource(const model::ModelSpec& spec, const data::SamplerConfig& cfg, int64_t seq)
      : spec_(spec), seq_(seq), seed_(cfg.seed), index_(kItems, [&] {
          data::SamplerConfig c = cfg;
          c.shuffle = false;  // item ids are already random draws; no permutation of 2^40 items
          return c;
        }()) {
    ST_USER_CHECK(seq <= spec.seq_len, "sequence length ", seq, " exceeds model.seq_len ", spec.seq_len);
  }
  Batch train_batch(const data::SamplerCursor& c, int m) const override {
    const std::vector<int64_t> items = index_.local_items(c, m);
    const int64_t n = static_cast<int64_t>(items.size());
    const bool vit = model::input_kind(spec_) == model::InputKind::Images;
    at::Tensor x = vit ? at::empty({n, spec_.channels, spec_.image_size, spec_.image_size})
                       : at::empty({n, seq_ + 1}, at::TensorOptions().dtype(at::kLong));
    at::Tensor y = vit ? at::empty({n}, at::TensorOptions().dtype(at::kLong)) : at::Tensor();
    for (int64_t i = 0; i < n; ++i) {
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(item_seed(items[i]));
      if (vit) {
        x[i].normal_(0, 1, g);
        y[i].random_(0, spec_.num_classes, g);
      } else {
        x[i].random_(0, spec_.vocab_size, g);
      }
    }
    if (vit) return {x, y};
    return {x.narrow(1, 0, seq_).contiguous(), x.narrow(1, 1, seq_).contiguous()};
  }
  data::SamplerCursor next(const data::SamplerCursor& c) const override { return index_.next(c); }
  void check_cursor(const data::SamplerCursor& c) const override { index_.check(c); }
  int64_t train_steps_per_epoch() const override { return index_.steps_per_epoch(); }
  int64_t val_batches() const override { return 0; }
  Batch val_batch(int64_t, int) const override { ST_CHECK(false, "synthetic data has no validation split"); return {}; }
  int64_t tokens_per_item() const override { return classification() ? 0 : seq_; }
  bool classification() const override { return model::input_kind(spec_) == model::InputKind::Images; }
  std::string describe() const override {
    std::ostringstream os;
    if (classification())
      os << "synthetic images (data.dataset = \"\"): N(0,1) pixels, uniform labels, no validation";
    else
      os << "synthetic tokens (data.dataset = \"\"): uniform over " << spec_.vocab_size << " ids, no validation";
    return os.str();
  }

 private:
  uint64_t item_seed(int64_t item) const {
    uint64_t x = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(item) + 0x632BE59BD9B4E019ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  model::ModelSpec spec_;
  int64_t seq_;
  uint64_t seed_;
  data::IndexSampler index_;
};

// This program as the user would type it: relative to the working directory when it lies
// below it (build/bin/shardtrain), else its absolute path.
std::string program_as_typed() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "shardtrain";
  const std::filesystem::path rel = exe.lexically_relative(std::filesystem::current_path(ec));
  return !ec && !rel.empty() && *rel.begin() != ".." ? rel.string() : exe.string();
}

// A data.dataset that was never prepared: the error gives the command that prepares it.
// .data/austen-<tokenizer> and .data/mnist* are the project's own sources; others are the
// user's corpus.
void check_prepared(const std::string& dir, bool images, const std::string& tokenizer) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / "meta.json", ec)) return;
  const std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
  const std::string tok = tokenizer.empty() ? choices::kTokenizers[0] : tokenizer;
  std::string cmd = program_as_typed() + " data prepare ";
  if (images) cmd += "--source mnist --out " + dir;
  else if (name.rfind("austen-", 0) == 0) cmd += "--source austen --tokenizer " + name.substr(7) + " --out " + dir;
  else cmd += "--source <your corpus: JSONL, text, .gz, a directory> --tokenizer " + tok + " --out " + dir;
  throw UserError("data.dataset '" + dir + "' is not a prepared dataset (no " + dir + "/meta.json). Prepare it with: " +
                  cmd + "   (docs/data.md)");
}

}  // namespace

std::unique_ptr<DataSource> open_data(const std::string& dir, const model::ModelSpec& spec,
                                      const data::SamplerConfig& cfg, int64_t seq_len, const DataKeys& keys) {
  if (dir.empty()) return std::make_unique<SyntheticSource>(spec, cfg, seq_len);
  check_prepared(dir, model::input_kind(spec) == model::InputKind::Images, keys.tokenizer);
  if (model::input_kind(spec) == model::InputKind::Images) return std::make_unique<ImageSource>(dir, spec, cfg);
  auto src = std::make_unique<TokenSource>(dir, spec, cfg, seq_len, resolve_packing(keys, data::read_token_meta(dir)));
  // The tokenizer and split are fixed when the dataset is prepared: the deck's keys must agree.
  const data::TokenDatasetMeta& m = src->meta();
  ST_USER_CHECK(keys.tokenizer.empty() || keys.tokenizer == m.tokenizer, "data.tokenizer = \"", keys.tokenizer,
                "\" but data.dataset '", dir, "' was prepared with the ", m.tokenizer, " tokenizer");
  ST_USER_CHECK(keys.val_fraction < 0 || std::fabs(keys.val_fraction - m.val_fraction) < 1e-9,
                "data.val_fraction = ", keys.val_fraction, " but data.dataset '", dir, "' was prepared with ",
                m.val_fraction, " (the split is made by `shardtrain data prepare --val-fraction`)");
  return src;
}

DataKeys data_keys_from_deck(const deck::Deck& d) {
  DataKeys k;
  if (d.is_set("data.tokenizer")) k.tokenizer = d.get_string("data.tokenizer");
  if (d.is_set("data.val_fraction")) k.val_fraction = d.get_float("data.val_fraction");
  k.packing = d.get_string("data.packing");
  k.document_mask = d.get_bool("data.document_mask");
  k.truncate = d.get_string("data.overlong") == choices::kOverlong[0];
  return k;
}

data::PackingOptions resolve_packing(const DataKeys& keys, const data::TokenDatasetMeta& meta) {
  data::PackingOptions p;
  p.mode = keys.packing == choices::kPackingAuto
               ? (meta.masked && meta.rows ? data::Packing::Packed : data::Packing::Stream)
               : data::parse_packing(keys.packing);
  p.document_mask = keys.document_mask;
  p.truncate = keys.truncate;
  return p;  // the rules between the keys and the dataset: data::check_packing, where every sampler applies them
}

data::PackingOptions packing_from_deck(const deck::Deck& d, const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_regular_file(dir + "/meta.json", ec)) return {};
  const data::TokenDatasetMeta meta = data::read_token_meta(dir);
  return resolve_packing(data_keys_from_deck(d), meta);
}

void check_data_rules(const deck::Deck& d, const model::ModelSpec& spec) {
  const std::string dir = d.get_string("data.dataset");
  if (dir.empty() || model::input_kind(spec) != model::InputKind::Tokens ||
      !std::filesystem::exists(dir + "/meta.json"))
    return;
  const DataKeys keys = data_keys_from_deck(d);
  const data::PackingOptions p = resolve_packing(keys, data::read_token_meta(dir));
  if (p.mode == data::Packing::Stream && !p.document_mask) return;
  // The samplers' own checks (their constructors call the same function), on both splits.
  for (const char* split : {"train", "val"}) data::check_packing(data::TokenDataset(dir, split), spec.seq_len, p);
}

}  // namespace shardtrain::train
