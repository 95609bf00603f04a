// Sampling: choose_token (temperature / top-k / top-p on the host in double) and the
// generation loop over a sharded model.
#include "shardtrain/infer/sampling.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::infer {

void check_sampling_options(const SamplingOptions& o, const std::vector<std::string>& n) {
  ST_CHECK(n.size() == 4, "check_sampling_options needs 4 names");
  ST_USER_CHECK(std::isfinite(o.temperature) && o.temperature >= 0 && o.temperature <= 100, n[0],
                " must be in [0, 100] (0 = greedy), got ", o.temperature);
  ST_USER_CHECK(o.top_k >= 0, n[1], " must be >= 0 (0 = no limit), got ", o.top_k);
  ST_USER_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, n[2], " must be in (0, 1], got ", o.top_p);
  ST_USER_CHECK(o.max_new_tokens >= 0 && o.max_new_tokens <= (int64_t{1} << 20), n[3], " must be in [0, 1048576], got ",
                o.max_new_tokens);
}

int32_t choose_token(const std::vector<float>& logits, int64_t vocab, const SamplingOptions& o, std::mt19937_64& rng) {
  const int64_t v = std::min<int64_t>(vocab, static_cast<int64_t>(logits.size()));
  ST_CHECK(v > 0, "choose_token: no logits");
  if (o.temperature == 0) {  // greedy; std::max_element keeps the first of equal maxima
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + v) - logits.begin());
  }
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; equal logits by id, so the order is a function of the logits alone.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (o.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(o.top_k));
  std::vector<double> p(keep);
  const double top = static_cast<double>(logits[order[0]]) / o.temperature;
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += p[i] = std::exp(static_cast<double>(logits[order[i]]) / o.temperature - top);
  if (o.top_p < 1) {
    double c = 0;
    size_t n = 0;
    while (n < keep && c < o.top_p * z) c += p[n++];
    keep = std::max<size_t>(n, 1);
    z = 0;
    for (size_t i = 0; i < keep; ++i) z += p[i];
  }
  // A uniform double in [0, z) from 53 random bits: the same on every platform.
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * z;
  double c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (u < c) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate_tokens(model::Model& net, std::vector<int32_t> context, int64_t vocab,
                                     const SamplingOptions& o, const c10::Device& device, MPI_Comm world,
                                     int32_t stop_id, const std::function<void(int64_t generated)>& after_token) {
  ST_CHECK(!context.empty(), "generate_tokens: empty context");
  torch::autograd::AutoGradMode no_grad(false);
  const bool was_training = net.is_training();
  net.eval();
  std::mt19937_64 rng(o.seed);
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  const int64_t window = net.spec().seq_len;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(context.size()));
    at::Tensor ids = at::empty({1, n}, at::kLong);
    int64_t* d = ids.data_ptr<int64_t>();
    for (int64_t t = 0; t < n; ++t) d[t] = context[context.size() - n + t];
    at::Tensor logits = net.forward(ids.to(device)).select(1, n - 1).reshape({-1}).to(at::kFloat).cpu().contiguous();
    int32_t next = 0;
    if (rank == 0) {
      std::vector<float> row(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel());
      next = choose_token(row, vocab, o, rng);
    }
    runtime::broadcast(world, next, 0, "generate.token");
    context.push_back(next);
    if (after_token) after_token(i + 1);
    if (stop_id >= 0 && next == stop_id) break;
  }
  if (was_training) net.train();
  return context;
}

}  // namespace shardtrain::infer
