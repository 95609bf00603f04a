// evaluate_split: a model's loss, perplexity (language models) or accuracy (classifiers) over a
// whole split of a prepared dataset, in fixed non-overlapping windows, the same to the last bit
// at every world size. What `shardtrain eval` runs.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "shardtrain/data/packing.h"
#include "shardtrain/model/model.h"

namespace shardtrain::infer {

struct EvalResult {
  std::string dataset, split;
  int64_t items = 0;    // windows of seq_len + 1 tokens (window w: tokens [w*T, w*T + T + 1)), windows of
                        // whole rows (data.packing packed / padded), or images
  int64_t targets = 0;  // predicted tokens (items x seq_len; with a loss mask the counted ones) or images
  int64_t seq_len = 0;  // 0 for images
  double loss = 0;      // mean cross-entropy per (counted) target (nats)
  double perplexity = 0;
  std::optional<double> accuracy;  // classifiers
  double seconds = 0;
  std::string packing;  // language models: the windows' packing line (data::PackingStats::line)
};

// Collective over `world`. Forward f is always items [f*batch, (f+1)*batch) (the last padded
// with its first item), the same input at every world size, since an item's loss depends on
// its row in the batch; rank r runs forwards r, r+size, ... Each item's summed loss (fp32 per
// target, summed in fp64) goes to rank 0, which adds them in item order. `max_items` > 0
// evaluates only the first items.
// UserError (every rank) when the dataset does not fit the model or the split is too short.
// Token windows are made by `packing` (packed / padded rows: each row as if alone, as training).
EvalResult evaluate_split(model::Model& net, const std::string& dataset_dir, const std::string& split, int64_t batch,
                          int64_t max_items, const c10::Device& device, MPI_Comm world,
                          const data::PackingOptions& packing = {});

// One JSON object: the fields above (loss as %.17g, so it reads back to the same double).
std::string eval_json(const EvalResult& r, const std::string& checkpoint, int64_t step);

}  // namespace shardtrain::infer
