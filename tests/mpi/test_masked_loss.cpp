// Instruction data's loss mask in `eval` (infer::evaluate_split): on a dataset with a mask, the
// loss is the mean cross-entropy over the counted targets only, equal (to fp64 rounding of the
// same fp32 terms) to a reference computed here from the plain model's logits, the raw
// train.bin / train.mask bytes and a log-softmax written out by hand; the same bits at every
// world size; an unmasked copy of the same tokens gives the mean over all targets.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "shardtrain/data/token_dataset.h"
#include "shardtrain/infer/evaluate.h"
#include "shardtrain/model/model.h"

using namespace shardtrain;
namespace fs = std::filesystem;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

model::ModelSpec tiny_spec() {
  model::ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 256;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = 2;
  s.n_heads = 2;
  return model::resolve_spec(s);
}

// A dataset of n byte tokens with a mask of runs (prompt-like runs of 0, completion-like runs
// of 1) written on rank 0 under a directory every rank sees.
struct Dataset {
  std::string dir;
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> mask;
};
Dataset make_dataset(const std::string& dir, std::int64_t n, bool masked) {
  Dataset d;
  d.dir = dir;
  d.ids.resize(static_cast<size_t>(n));
  d.mask.resize(static_cast<size_t>(n));
  std::uint64_t x = 12345;
  std::int64_t ones = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    d.ids[i] = static_cast<std::int32_t>((x >> 33) % 256);
    d.mask[i] = (i % 23) >= 15 ? 1 : 0;  // 8 of every 23 tokens count
    ones += d.mask[i];
  }
  if (world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    data::TokenDatasetMeta m;
    m.tokenizer = "byte";
    m.vocab_size = 256;
    m.dtype = "uint16";
    m.eot_id = -1;
    m.train_tokens = n;
    m.masked = masked;
    m.train_counted = masked ? ones : 0;
    m.chat_format = "plain";
    data::write_ids(dir + "/train.bin", d.ids, "uint16");
    data::write_ids(dir + "/val.bin", {}, "uint16");
    if (masked) {
      data::write_mask(dir + "/train.mask", d.mask);
      data::write_mask(dir + "/val.mask", {});
    }
    data::write_token_meta(dir, m);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The reference: windows w = tokens [w T, w T + T + 1) read from the raw files, one window per
// forward, -log softmax(logits)[target] by hand in fp64, averaged over the positions whose
// target token has mask byte 1 (all positions when `use_mask` is false).
double reference_loss(model::Model& net, const std::string& dir, std::int64_t windows, std::int64_t T, bool use_mask,
                      std::int64_t* counted) {
  const auto bin = read_bytes(dir + "/train.bin");
  const auto msk = use_mask ? read_bytes(dir + "/train.mask") : std::vector<unsigned char>();
  torch::NoGradGuard ng;
  double sum = 0;
  std::int64_t n = 0;
  for (std::int64_t w = 0; w < windows; ++w) {
    std::vector<std::int64_t> tok(static_cast<size_t>(T + 1));
    for (std::int64_t t = 0; t <= T; ++t) tok[t] = bin[2 * (w * T + t)] | (bin[2 * (w * T + t) + 1] << 8);
    auto in = torch::tensor(std::vector<std::int64_t>(tok.begin(), tok.end() - 1)).reshape({1, T});
    at::Tensor logits = net.forward(in).to(at::kDouble)[0];  // [T, V]
    for (std::int64_t t = 0; t < T; ++t) {
      if (use_mask && msk[w * T + t + 1] == 0) continue;
      const at::Tensor row = logits[t];
      const double m = row.max().item<double>();
      const double lse = m + std::log((row - m).exp().sum().item<double>());
      sum += lse - row[tok[t + 1]].item<double>();
      ++n;
    }
  }
  *counted = n;
  return sum / static_cast<double>(n);
}

}  // namespace

TEST(MaskedLoss, EvalIsTheMeanOverCountedTargets) {
  const model::ModelSpec spec = tiny_spec();
  auto net = model::build_model(spec, at::kCPU);
  model::init_parameters(*net, 99);
  const std::int64_t T = spec.seq_len, windows = 13, n = windows * T + 1;
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string base = (fs::temp_directory_path() / ("st_masked_loss_" + std::to_string(pid))).string();
  Dataset masked = make_dataset(base + "/masked", n, true);
  make_dataset(base + "/plain", n, false);

  // micro-batches of 4: 4 forwards, the last padded; dealt over the ranks.
  const infer::EvalResult r = infer::evaluate_split(*net, base + "/masked", "train", 4, 0, at::kCPU, MPI_COMM_WORLD);
  std::int64_t ref_n = 0;
  const double ref = reference_loss(*net, base + "/masked", windows, T, true, &ref_n);
  EXPECT_EQ(r.items, windows);
  EXPECT_EQ(r.targets, ref_n);
  EXPECT_GT(ref_n, 0);
  EXPECT_LT(ref_n, windows * T);
  // fp32 per-target terms (eval) vs fp64 throughout (reference): agree to fp32 rounding.
  EXPECT_NEAR(r.loss, ref, 2e-6 * ref) << "eval " << r.loss << " reference " << ref;

  // The mean over all targets is a different number: the mask was applied.
  std::int64_t all_n = 0;
  const double all = reference_loss(*net, base + "/plain", windows, T, false, &all_n);
  EXPECT_EQ(all_n, windows * T);
  EXPECT_GT(std::fabs(all - ref), 1e-4);
  const infer::EvalResult p = infer::evaluate_split(*net, base + "/plain", "train", 4, 0, at::kCPU, MPI_COMM_WORLD);
  EXPECT_EQ(p.targets, windows * T);
  EXPECT_NEAR(p.loss, all, 2e-6 * all);

  // The same bits at every world size: each rank alone (MPI_COMM_SELF) gives the world's loss.
  const infer::EvalResult one = infer::evaluate_split(*net, base + "/masked", "train", 4, 0, at::kCPU, MPI_COMM_SELF);
  EXPECT_EQ(one.loss, r.loss);
  EXPECT_EQ(one.targets, r.targets);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(base);
}
