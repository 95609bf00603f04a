// DataSource: what the loop needs from a dataset (token windows or labelled images).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "shardtrain/data/sampler.h"
#include "shardtrain/model/model.h"

namespace shardtrain::train {

struct Batch {
  at::Tensor inputs, targets;
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  // This rank's micro-batch m of the training global batch at cursor c.
  virtual Batch train_batch(const data::SamplerCursor& c, int micro) const = 0;
  virtual data::SamplerCursor next(const data::SamplerCursor& c) const = 0;
  // UserError when a cursor read from a checkpoint does not fit this dataset and batch.
  virtual void check_cursor(const data::SamplerCursor& c) const = 0;
  virtual int64_t train_steps_per_epoch() const = 0;
  // Validation global batches (in order, no shuffling) and this rank's micro-batch of one.
  virtual int64_t val_batches() const = 0;
  virtual Batch val_batch(int64_t index, int micro) const = 0;
  // Tokens per item (seq_len for language models; 0 for images).
  virtual int64_t tokens_per_item() const = 0;
  virtual bool classification() const = 0;
  // Instruction data (a token dataset with a loss mask): targets that do not count are -100 in
  // the batches, and the loss is the mean over the counted targets of the global batch.
  virtual bool masked() const { return false; }
  // The counted targets of the whole training global batch at c (masked() only): the same on
  // every rank, computed from the dataset (the sampler is deterministic), no communication.
  virtual int64_t counted_targets(const data::SamplerCursor& c) const {
    (void)c;
    return 0;
  }
  virtual std::string describe() const = 0;
};

// Deck keys a token dataset is checked against (empty / negative: not checked).
struct DataKeys {
  std::string tokenizer;      // data.tokenizer
  double val_fraction = -1;   // data.val_fraction, when the deck sets it
};

// Opens data.dataset for the model: a token dataset for gpt2/llama, an image dataset for vit,
// synthetic items when dataset_dir is empty.
std::unique_ptr<DataSource> open_data(const std::string& dataset_dir, const model::ModelSpec& spec,
                                      const data::SamplerConfig& train_cfg, int64_t seq_len, const DataKeys& keys = {});

}  // namespace shardtrain::train
