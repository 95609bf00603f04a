// evaluate_split: whole-split evaluation with a reduction order fixed by item index.
#include "shardtrain/infer/evaluate.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/mnist.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::infer {
namespace {

// Item i's inputs and targets for one forward of `n` items starting at `first` (items past
// `last` repeat item `first`: padding whose results are dropped).
struct Items {
  virtual ~Items() = default;
  virtual int64_t count() const = 0;
  virtual void batch(int64_t first, int64_t last, int64_t n, at::Tensor& in, at::Tensor& tgt,
                     model::Rows& rows) const = 0;
};

data::SamplerConfig in_order() {
  data::SamplerConfig c;
  c.global_batch = 1;
  c.shuffle = false;
  return c;
}

// The split's windows as training reads them (stream, or rows packed / padded / with
// document masks: the same TokenSampler), in window order.
struct TokenItems : Items {
  TokenItems(const std::string& dir, const std::string& split, int64_t seq, const data::PackingOptions& packing)
      : ds(dir, split), windows(ds, seq, in_order(), packing) {}
  data::TokenDataset ds;
  data::TokenSampler windows;
  int64_t count() const override { return windows.index().num_items(); }
  void batch(int64_t first, int64_t last, int64_t n, at::Tensor& in, at::Tensor& tgt,
             model::Rows& rows) const override {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) ids[j] = first + j < last ? first + j : first;
    auto t = data::to_tensors(windows.windows(ids));
    in = t.inputs;
    tgt = t.targets;
    rows = {t.positions, t.cu_seqlens};
  }
};

struct ImageItems : Items {
  ImageItems(const std::string& dir, const std::string& split) : ds(dir, split) {}
  data::ImageDataset ds;
  int64_t count() const override { return ds.size(); }
  void batch(int64_t first, int64_t last, int64_t n, at::Tensor& in, at::Tensor& tgt, model::Rows&) const override {
    data::ImageBatch b;
    b.batch = n;
    b.channels = ds.meta().channels;
    b.height = ds.meta().height;
    b.width = ds.meta().width;
    const int px = ds.pixels();
    b.pixels.resize(static_cast<size_t>(n * px));
    b.labels.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = first + j < last ? first + j : first;
      std::copy(ds.image(i), ds.image(i) + px, b.pixels.data() + j * px);
      b.labels[j] = ds.label(i);
    }
    auto t = data::to_tensors(b);
    in = t.images;
    tgt = t.labels;
  }
};

}  // namespace

EvalResult evaluate_split(model::Model& net, const std::string& dir, const std::string& split, int64_t batch,
                          int64_t max_items, const c10::Device& device, MPI_Comm world,
                          const data::PackingOptions& packing) {
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  const model::ModelSpec& spec = net.spec();
  const bool images = model::input_kind(spec) == model::InputKind::Images;
  EvalResult r;
  r.dataset = dir;
  r.split = split;
  r.seq_len = images ? 0 : spec.seq_len;
  std::unique_ptr<Items> items;
  runtime::run_agreed(world, [&] {
    ST_USER_CHECK(!dir.empty(), "eval: no dataset (data.dataset is \"\", synthetic items): give --dataset DIR");
    ST_USER_CHECK(split == "train" || split == "val", "eval: --split must be train or val, got '", split, "'");
    ST_USER_CHECK(batch > 0, "eval: the batch (train.micro_batch) must be > 0");
    if (images) {
      auto im = std::make_unique<ImageItems>(dir, split);
      const auto& m = im->ds.meta();
      ST_USER_CHECK(m.height == spec.image_size && m.width == spec.image_size && m.channels == spec.channels,
                    "eval: dataset '", dir, "' has ", m.channels, "x", m.height, "x", m.width,
                    " images but the model expects ", spec.channels, "x", spec.image_size, "x", spec.image_size);
      items = std::move(im);
    } else {
      auto tk = std::make_unique<TokenItems>(dir, split, spec.seq_len, packing);
      r.packing = tk->windows.stats().line(spec.seq_len, packing.mode);
      ST_USER_CHECK(tk->ds.meta().vocab_size <= spec.vocab_size, "eval: dataset '", dir, "' has vocabulary size ",
                    tk->ds.meta().vocab_size, " but the model's vocab_size is ", spec.vocab_size);
      items = std::move(tk);
    }
    ST_USER_CHECK(items->count() > 0, "eval: the ", split, " split of '", dir, "' holds no complete item (",
                  images ? std::string("image")
                  : packing.mode == data::Packing::Stream
                      ? "window of model.seq_len + 1 = " + std::to_string(spec.seq_len + 1) + " tokens"
                      : std::string("row: it has none"), ")");
  });
  Timer timer;
  const int64_t total = max_items > 0 ? std::min(max_items, items->count()) : items->count();
  // Why whole forwards are dealt out, not contiguous item ranges: a window's loss depends on its
  // row in the batch (measured: OpenBLAS's Haswell kernels with OPENBLAS_L2_SIZE=512 round a
  // row's GEMM differently by its position, the 10th digit of the mean loss at 1 vs 2 ranks).
  // Forward f of the split is always windows [f*batch, (f+1)*batch) (the last padded with its
  // first window), the same input tensor at every world size; rank r runs forwards r, r+size, ...
  const int64_t blocks = (total + batch - 1) / batch;
  const int64_t rounds = (blocks + size - 1) / size;  // forwards per rank, the same on every rank
  auto block_items = [&](int64_t f) { return std::min(batch, total - f * batch); };
  int64_t mine = 0;
  for (int64_t f = rank; f < blocks; f += size) mine += block_items(f);
  std::vector<double> loss(static_cast<size_t>(mine), 0.0), correct(static_cast<size_t>(mine), 0.0);

  // Progress on stderr (stdout is the result line): the start, then a line every 5 s.
  if (rank == 0)
    std::fprintf(stderr, "# eval: %lld %s of %s/%s in %lld forwards of %lld (%lld per rank, %d rank%s)\n",
                 static_cast<long long>(total), images ? "images" : "windows", dir.c_str(), split.c_str(),
                 static_cast<long long>(blocks), static_cast<long long>(batch), static_cast<long long>(rounds), size,
                 size == 1 ? "" : "s");
  if (rank == 0 && packing.mode != data::Packing::Stream) std::fprintf(stderr, "# eval: %s\n", r.packing.c_str());
  double last_report = 0;

  torch::autograd::AutoGradMode no_grad(false);
  const bool was_training = net.is_training();
  net.eval();
  int64_t at = 0;  // next slot in loss / correct
  for (int64_t k = 0; k < rounds; ++k) {
    if (rank == 0 && timer.seconds() - last_report >= 5) {
      last_report = timer.seconds();
      std::fprintf(stderr, "# eval: %lld of %lld forwards, %.0f s\n", static_cast<long long>(std::min(blocks, k * size)),
                   static_cast<long long>(blocks), last_report);
    }
    const int64_t f = rank + k * size;
    const int64_t real = f < blocks ? block_items(f) : 0, first = f < blocks ? f * batch : 0;
    at::Tensor in, tgt;
    model::Rows rows;
    // A rank with no forward left still runs one (the engine's gathers are collective).
    runtime::run_agreed(world, [&] { items->batch(first, real > 0 ? first + real : 1, batch, in, tgt, rows); });
    at::Tensor logits = net.forward(in.to(device), rows).to(at::kFloat);
    at::Tensor flat = logits.reshape({-1, logits.size(-1)});
    at::Tensor ce = at::cross_entropy_loss(flat, tgt.to(device).reshape({-1}), {}, at::Reduction::None)
                        .reshape({batch, -1}).cpu().contiguous();
    at::Tensor hit = flat.argmax(-1).eq(tgt.to(device).reshape({-1})).reshape({batch, -1}).cpu().contiguous();
    // A target of -100 (instruction data's prompt tokens) has cross-entropy 0 and does not count.
    at::Tensor counts = tgt.reshape({batch, -1}).ne(-100).cpu().contiguous();
    const float* c = ce.data_ptr<float>();
    const bool* h = hit.data_ptr<bool>();
    const bool* counted = counts.data_ptr<bool>();
    const int64_t per = ce.size(1);
    for (int64_t j = 0; j < real; ++j, ++at) {
      double s = 0, n = 0;
      for (int64_t t = 0; t < per; ++t) {
        if (!counted[j * per + t]) continue;
        s += static_cast<double>(c[j * per + t]);
        n += h[j * per + t] ? 1 : 0;
        ++r.targets;
      }
      loss[at] = s;
      correct[at] = n;
    }
  }
  if (was_training) net.train();

  // Rank 0 puts the items back in item order and adds them in that order: the same additions at
  // every world size. Rank q sends its forwards' items in its own order (q, q+size, ...).
  std::vector<int64_t> counts(size, 0), displs(size, 0);
  for (int64_t f = 0; f < blocks; ++f) counts[f % size] += block_items(f);
  for (int q = 1; q < size; ++q) displs[q] = displs[q - 1] + counts[q - 1];
  const std::vector<double> got_loss = runtime::gather_to(world, 0, loss, "eval.gather");
  const std::vector<double> got_correct = runtime::gather_to(world, 0, correct, "eval.gather");
  std::vector<double> all_loss(got_loss.size()), all_correct(got_correct.size());
  if (rank == 0) {
    std::vector<int64_t> next(displs.begin(), displs.end());  // rank q's next received item
    for (int64_t f = 0; f < blocks; ++f)
      for (int64_t j = 0; j < block_items(f); ++j) {
        const int64_t from = next[f % size]++;
        all_loss[f * batch + j] = got_loss[from];
        all_correct[f * batch + j] = got_correct[from];
      }
  }
  const int64_t targets = runtime::sum(world, r.targets, "eval.targets");
  double sums[2] = {0, 0};
  if (rank == 0)
    for (int64_t i = 0; i < total; ++i) {
      sums[0] += all_loss[i];
      sums[1] += all_correct[i];
    }
  runtime::broadcast(world, sums, 0, "eval.sums");
  r.items = total;
  r.targets = targets;
  r.loss = sums[0] / static_cast<double>(targets);
  r.perplexity = std::exp(r.loss);
  if (images) r.accuracy = sums[1] / static_cast<double>(targets);
  r.seconds = timer.seconds();
  return r;
}

std::string eval_json(const EvalResult& r, const std::string& checkpoint, int64_t step) {
  char loss[64], ppl[64];
  std::snprintf(loss, sizeof loss, "%.17g", r.loss);
  std::snprintf(ppl, sizeof ppl, "%.17g", r.perplexity);
  nlohmann::ordered_json j;
  j["checkpoint"] = checkpoint;
  j["step"] = step;
  j["dataset"] = r.dataset;
  j["split"] = r.split;
  j["items"] = r.items;
  j["targets"] = r.targets;
  if (r.seq_len > 0) j["seq_len"] = r.seq_len;
  // NaN / Inf (a diverged checkpoint) have no JSON number: null.
  auto number = [](double x, const char* text) { return std::isfinite(x) ? nlohmann::ordered_json::parse(text) : nlohmann::ordered_json(); };
  j["loss"] = number(r.loss, loss);
  if (!r.accuracy) j["perplexity"] = number(r.perplexity, ppl);
  if (r.accuracy) j["accuracy"] = *r.accuracy;
  j["seconds"] = r.seconds;
  return j.dump() + "\n";
}

}  // namespace shardtrain::infer
