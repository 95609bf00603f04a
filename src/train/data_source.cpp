// Token and image data sources over the data layer's datasets and samplers.
#include "data_source.h"

#include <sstream>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/mnist.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {

data::SamplerConfig val_config(const data::SamplerConfig& train) {
  data::SamplerConfig v = train;
  v.shuffle = false;
  return v;
}

class TokenSource : public DataSource {
 public:
  TokenSource(const std::string& dir, const model::ModelSpec& spec, const data::SamplerConfig& cfg, int64_t seq)
      : train_(dir, "train"), val_(dir, "val"), seq_(seq), train_sampler_(train_, seq, cfg) {
    ST_USER_CHECK(train_.meta().vocab_size <= spec.vocab_size, "data.dataset '", dir, "' has vocabulary size ",
                  train_.meta().vocab_size, " but model.vocab_size is ", spec.vocab_size);
    ST_USER_CHECK(seq <= spec.seq_len, "sequence length ", seq, " exceeds model.seq_len ", spec.seq_len);
    ST_USER_CHECK(train_sampler_.index().steps_per_epoch() > 0, "data.dataset '", dir, "': the training split has ",
                  train_.size(), " tokens, fewer than one global batch of ", cfg.global_batch, " x ", seq + 1);
    if (val_.size() > seq + 1) {
      val_sampler_ = std::make_unique<data::TokenSampler>(val_, seq, val_config(cfg));
    }
  }
  Batch train_batch(const data::SamplerCursor& c, int m) const override {
    auto t = data::to_tensors(train_sampler_.batch(c, m));
    return {t.inputs, t.targets};
  }
  data::SamplerCursor next(const data::SamplerCursor& c) const override { return train_sampler_.next(c); }
  void check_cursor(const data::SamplerCursor& c) const override { train_sampler_.index().check(c); }
  int64_t train_steps_per_epoch() const override { return train_sampler_.index().steps_per_epoch(); }
  int64_t val_batches() const override { return val_sampler_ ? val_sampler_->index().steps_per_epoch() : 0; }
  Batch val_batch(int64_t i, int m) const override {
    data::SamplerCursor c{0, i * val_sampler_->index().config().global_batch};
    auto t = data::to_tensors(val_sampler_->batch(c, m));
    return {t.inputs, t.targets};
  }
  int64_t tokens_per_item() const override { return seq_; }
  bool classification() const override { return false; }
  std::string describe() const override {
    std::ostringstream os;
    os << train_.meta().tokenizer << " tokens: " << train_.size() << " train, " << val_.size() << " val";
    return os.str();
  }

 private:
  data::TokenDataset train_, val_;
  int64_t seq_;
  data::TokenSampler train_sampler_;
  std::unique_ptr<data::TokenSampler> val_sampler_;
};

class ImageSource : public DataSource {
 public:
  ImageSource(const std::string& dir, const model::ModelSpec& spec, const data::SamplerConfig& cfg)
      : train_(dir, "train"), val_(dir, "val"), train_sampler_(train_, cfg) {
    const auto& m = train_.meta();
    ST_USER_CHECK(m.height == spec.image_size && m.width == spec.image_size && m.channels == spec.channels,
                  "data.dataset '", dir, "' holds ", m.channels, "x", m.height, "x", m.width,
                  " images but the model expects ", spec.channels, "x", spec.image_size, "x", spec.image_size);
    ST_USER_CHECK(m.num_classes <= spec.num_classes, "data.dataset '", dir, "' has ", m.num_classes,
                  " classes but model.num_classes is ", spec.num_classes);
    ST_USER_CHECK(train_sampler_.index().steps_per_epoch() > 0, "data.dataset '", dir, "': fewer training images (",
                  train_.size(), ") than one global batch (", cfg.global_batch, ")");
    if (val_.size() >= cfg.global_batch) val_sampler_ = std::make_unique<data::ImageSampler>(val_, val_config(cfg));
  }
  Batch train_batch(const data::SamplerCursor& c, int m) const override {
    auto t = data::to_tensors(train_sampler_.batch(c, m));
    return {t.images, t.labels};
  }
  data::SamplerCursor next(const data::SamplerCursor& c) const override { return train_sampler_.next(c); }
  void check_cursor(const data::SamplerCursor& c) const override { train_sampler_.index().check(c); }
  int64_t train_steps_per_epoch() const override { return train_sampler_.index().steps_per_epoch(); }
  int64_t val_batches() const override { return val_sampler_ ? val_sampler_->index().steps_per_epoch() : 0; }
  Batch val_batch(int64_t i, int m) const override {
    data::SamplerCursor c{0, i * val_sampler_->index().config().global_batch};
    auto t = data::to_tensors(val_sampler_->batch(c, m));
    return {t.images, t.labels};
  }
  int64_t tokens_per_item() const override { return 0; }
  bool classification() const override { return true; }
  std::string describe() const override {
    std::ostringstream os;
    os << "images: " << train_.size() << " train, " << val_.size() << " val";
    return os.str();
  }

 private:
  data::ImageDataset train_, val_;
  data::ImageSampler train_sampler_;
  std::unique_ptr<data::ImageSampler> val_sampler_;
};

}  // namespace

std::unique_ptr<DataSource> open_data(const std::string& dir, const model::ModelSpec& spec,
                                      const data::SamplerConfig& cfg, int64_t seq_len) {
  ST_USER_CHECK(!dir.empty(), "data.dataset is empty: point it at a directory made by `shardtrain data prepare`");
  if (spec.arch == "vit") return std::make_unique<ImageSource>(dir, spec, cfg);
  return std::make_unique<TokenSource>(dir, spec, cfg, seq_len);
}

}  // namespace shardtrain::train
