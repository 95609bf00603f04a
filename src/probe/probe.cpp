// run_probe: the trainer's step (forward/backward per micro-batch, clip, optimizer) on
// synthetic batches, under the counting allocator.
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/probe/probe.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::probe {
namespace {
// Windows of rows of o.attention_span tokens each (the last one shorter): the most score memory
// rows no longer than the span can hold in a window (sum L^2 <= span x T).
model::Rows probe_rows(const ProbeOptions& o, const model::ModelSpec& s) {
  model::Rows rows;
  if (o.attention_span <= 0 || model::input_kind(s) != model::InputKind::Tokens) return rows;
  const int64_t T = s.seq_len, span = std::min(o.attention_span, T);
  rows.positions = at::empty({o.micro_batch, T}, at::kLong);
  rows.cu_seqlens = {0};
  for (int64_t b = 0; b < o.micro_batch; ++b)
    for (int64_t first = 0; first < T; first += span) {
      const int64_t len = std::min(span, T - first);
      rows.positions[b].narrow(0, first, len).copy_(at::arange(len, at::kLong));
      rows.cu_seqlens.push_back(b * T + first + len);
    }
  return rows;
}
}  // namespace

ProbeResult run_probe(MPI_Comm world, const deck::Deck& d, const ProbeOptions& o) {
  ST_CHECK(train::alloc_tracker_installed(), "run_probe needs install_alloc_tracker()");
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ProbeResult res;
  {
    fsdp::OptimizerConfig opt_cfg;
    runtime::run_agreed(world, [&] { opt_cfg = train::optimizer_config_from_deck(d); });
    // The counting allocator sees host memory: the probe runs on the CPU.
    train::JobOptions jo;
    jo.strategy = o.strategy;
    jo.ranks_per_host = o.ranks_per_host > 0 ? o.ranks_per_host : -1;
    jo.spec = o.spec;
    jo.host_only = true;
    train::ShardedJob job = train::open_sharded_job(world, d, jo);
    model::Model* net = job.net.get();
    const fsdp::EngineOptions& eopts = job.engine_options;
    const uint64_t seed = static_cast<uint64_t>(d.get_int("run.seed"));
    const fsdp::InitFn init = train::seeded_init(*net, seed);

    // Everything from here on is the probe's memory. Initialisation runs before the optimizer
    // state exists; the steps run with it (Kokkos memory, not tensors: added to the count).
    runtime::barrier(world, "probe.start");
    const int64_t live_before = train::alloc_counters().live_bytes;
    train::reset_alloc_peak();
    train::set_alloc_limit(o.memory_limit > 0 ? live_before + o.memory_limit : 0);
    std::unique_ptr<fsdp::Engine> engine = std::make_unique<fsdp::Engine>(*net, job.comms.engine(), eopts, init);
    const int64_t init_peak = train::alloc_counters().peak_bytes - live_before;
    bool over = train::alloc_limit_exceeded();
    std::unique_ptr<fsdp::ShardedOptimizer> opt = std::make_unique<fsdp::ShardedOptimizer>(*engine, opt_cfg);
    res.optim_bytes = opt->state_bytes();
    train::reset_alloc_peak();
    train::set_alloc_limit(o.memory_limit > 0 ? std::max<int64_t>(1, live_before + o.memory_limit - res.optim_bytes)
                                              : 0);

    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + static_cast<uint64_t>(rank));
    const model::ModelSpec& s = net->spec();
    const model::Rows rows = probe_rows(o, s);
    double loss_sum = 0;
    std::vector<double> step_s;  // each step's seconds on this rank
    for (int step = 0; step < o.steps; ++step) {
      Timer t;
      engine->zero_grad();
      loss_sum = 0;
      for (int64_t mb = 0; mb < o.grad_accum; ++mb) {
        engine->set_last_micro_batch(mb == o.grad_accum - 1);
        at::Tensor x, y;
        if (model::input_kind(s) == model::InputKind::Images) {
          x = at::randn({o.micro_batch, s.channels, s.image_size, s.image_size}, gen);
          y = at::randint(0, s.num_classes, {o.micro_batch}, gen);
        } else {
          x = at::randint(0, s.vocab_size, {o.micro_batch, s.seq_len}, gen);
          y = at::randint(0, s.vocab_size, {o.micro_batch, s.seq_len}, gen);
        }
        at::Tensor loss = net->loss(x, y, rows) / static_cast<double>(o.grad_accum);
        loss.backward();
        loss_sum += loss.item<double>();
      }
      engine->clip_grad_norm(d.get_float("optimizer.grad_clip"));
      opt->step(static_cast<float>(d.get_float("optimizer.lr")));
      step_s.push_back(t.seconds());
    }
    const int64_t peak = std::max(init_peak, train::alloc_counters().peak_bytes - live_before + res.optim_bytes);
    over = over || train::alloc_limit_exceeded() || (o.memory_limit > 0 && res.optim_bytes > o.memory_limit);
    opt.reset();
    engine.reset();
    train::set_alloc_limit(0);

    const double global_peak = runtime::max(world, static_cast<double>(peak), "probe.peak");
    // Each step's time is its slowest rank's; the result is the median of the steps after the
    // first (which also allocates what later steps reuse): the last one's for 2 steps.
    std::vector<double> slowest = step_s;
    runtime::max(world, slowest, "probe.step_time");
    std::vector<double> later(slowest.size() > 1 ? slowest.begin() + 1 : slowest.begin(), slowest.end());
    std::sort(later.begin(), later.end());
    const size_t m = later.size();
    const double median = m == 0 ? 0.0 : m % 2 ? later[m / 2] : 0.5 * (later[m / 2 - 1] + later[m / 2]);
    const bool any_over = runtime::any_rank(world, over, "probe.over_limit");
    const double loss_all = runtime::sum(world, loss_sum, "probe.loss");
    int size = 1;
    ST_MPI_CHECK(MPI_Comm_size(world, &size));
    res.peak_bytes = static_cast<int64_t>(global_peak);
    res.step_s = median;
    res.fits = !any_over;
    res.loss = loss_all / size;
  }
  return res;
}

int probe_threads(MPI_Comm world, const deck::Deck& d) {
  return train::threads_per_rank(d, runtime::real_host_ranks(world).size);
}

}  // namespace shardtrain::probe
