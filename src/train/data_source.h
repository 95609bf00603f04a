// DataSource: what the loop needs from a dataset (token windows or labelled images).
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "shardtrain/data/sampler.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/model/model.h"
#include "shardtrain/util/choices.h"

namespace shardtrain::train {

struct Batch {
  at::Tensor inputs, targets;
  model::Rows rows;  // rows apart (data.packing packed / padded, data.document_mask); else empty
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
  // Tokens per item (language models: seq_len for stream windows; the rows' tokens of a packed /
  // padded window on average over the split, padding left out; 0 for images). Tokens/s and
  // tokens_seen count these.
  virtual int64_t tokens_per_item() const = 0;
  // Rows apart: the attention length per token, sum L^2 / sum L over the rows (each row attends
  // only to itself), what MFU counts; 0 = seq_len, the stream's.
  virtual double attention_length() const { return 0; }
  virtual bool classification() const = 0;
  // Instruction data (a token dataset with a loss mask) or rows apart (a row's last token
  // predicts nothing, padding nothing): targets that do not count are -100 in the batches, and
  // the loss is the mean over the counted targets of the global batch.
  virtual bool counted_targets_only() const { return false; }
  // The counted targets of the whole training global batch at c (counted_targets_only()): the
  // same on every rank, computed from the dataset (the sampler is deterministic), no
  // communication.
  virtual int64_t counted_targets(const data::SamplerCursor& c) const {
    (void)c;
    return 0;
  }
  virtual std::string describe() const = 0;
  // How the split becomes windows, for the data identity a checkpoint records ("" = fixed by
  // the dataset: images, synthetic items).
  virtual std::string windows() const { return ""; }
};

// Deck keys a token dataset is checked against (empty / negative: not checked), and how its
// windows are made.
struct DataKeys {
  std::string tokenizer;      // data.tokenizer
  double val_fraction = -1;   // data.val_fraction, when the deck sets it
  std::string packing = choices::kPackingAuto;  // data.packing: auto | stream | packed | padded
  bool document_mask = false;    // data.document_mask
  bool truncate = true;          // data.overlong = "truncate" (false: "error")
};
DataKeys data_keys_from_deck(const deck::Deck& d);

// data.packing for a token dataset: "auto" is packed for instruction data (a mask) with row
// boundaries, stream otherwise. The rules between the keys and the dataset are
// data::check_packing's (every sampler applies them).
data::PackingOptions resolve_packing(const DataKeys& keys, const data::TokenDatasetMeta& meta);

// Opens data.dataset for the model: a token dataset for gpt2/llama, an image dataset for vit,
// synthetic items when dataset_dir is empty.
std::unique_ptr<DataSource> open_data(const std::string& dataset_dir, const model::ModelSpec& spec,
                                      const data::SamplerConfig& train_cfg, int64_t seq_len, const DataKeys& keys = {});

}  // namespace shardtrain::train
