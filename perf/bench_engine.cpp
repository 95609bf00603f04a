// bench_engine: per-rank memory and step time of the FSDP engine on a GPT-2, per strategy, plus
// the fused AdamW step on this rank's shard next to memcpy and torch::optim::AdamW.
//
// Run under mpirun at world size N. `--table engine` prints one row per strategy:
//   state B/rank  engine.memory().master_bytes + grad_bytes + optimizer.state_bytes()
//   /(16Psi/N)    that over the ZeRO-3 ideal (fp32 master 4 + grad 4 + Adam 8 = 16 B/param)
//   ideal         what the strategy should hold: 16Psi/N sharded, 16Psi no_shard, 16Psi/S hybrid
//   peaks         the engine's peak unsharded-parameter and unsharded-gradient buffer bytes,
//                 and VmHWM (a process-lifetime peak: run one strategy per process for a
//                 clean value; several strategies in one process reset it between them)
//   step ms       median over the timed steps of (zero_grad, forward, backward, clip,
//                 optimizer), each step the max over ranks
// `--table optim` times adamw_step on ceil(Psi/N) elements (the full_shard shard) on every
// rank at once, as in a real step; bytes: 28 B/elem as in perf/bench_optim.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <mpi.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <time.h>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/model/model.h"
#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/timer.h"

using namespace shardtrain;

namespace {

struct Args {
  model::ModelSpec spec;
  int64_t batch = 1;  // sequences per rank per step
  int steps = 3, warmup = 1;
  int threads = 0;    // 0: max(1, hardware threads / N)
  int ranks_per_host = 0;  // hybrid: simulated host size; 0: max(1, N/2)
  int limit_all_gathers = 2;
  uint64_t seed = 1234;
  std::string table = "engine";  // engine | optim
  std::vector<std::string> strategies{"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "full_shard+bf16"};
  bool header = true;
  int optim_reps = 3;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "bench_engine [--table engine|optim] [--strategy s1,s2,...] [--d-model 384] [--layers 6]\n"
               "  [--heads 6] [--seq 128] [--vocab 8192] [--batch 1] [--steps 3] [--warmup 1]\n"
               "  [--threads 0] [--ranks-per-host 0] [--limit-all-gathers 2] [--optim-reps 3] [--no-header]\n"
               "strategies: full_shard shard_grad_op no_shard hybrid_shard hybrid_shard_zero2 full_shard+bf16\n");
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  a.spec.arch = "gpt2";
  // Default size: a step of about a second per rank on one core of a 2-core VM, with the
  // blocks (not the vocab x d embedding) holding most of the parameters.
  a.spec.d_model = 384;
  a.spec.n_layers = 6;
  a.spec.n_heads = 6;
  a.spec.seq_len = 128;
  a.spec.vocab_size = 8192;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (k == "--table") a.table = val();
    else if (k == "--strategy") {
      a.strategies.clear();
      std::stringstream ss(val());
      for (std::string s; std::getline(ss, s, ',');) a.strategies.push_back(s);
    } else if (k == "--d-model") a.spec.d_model = std::atoll(val().c_str());
    else if (k == "--layers") a.spec.n_layers = std::atoll(val().c_str());
    else if (k == "--heads") a.spec.n_heads = std::atoll(val().c_str());
    else if (k == "--seq") a.spec.seq_len = std::atoll(val().c_str());
    else if (k == "--vocab") a.spec.vocab_size = std::atoll(val().c_str());
    else if (k == "--batch") a.batch = std::atoll(val().c_str());
    else if (k == "--steps") a.steps = std::atoi(val().c_str());
    else if (k == "--warmup") a.warmup = std::atoi(val().c_str());
    else if (k == "--threads") a.threads = std::atoi(val().c_str());
    else if (k == "--ranks-per-host") a.ranks_per_host = std::atoi(val().c_str());
    else if (k == "--limit-all-gathers") a.limit_all_gathers = std::atoi(val().c_str());
    else if (k == "--optim-reps") a.optim_reps = std::atoi(val().c_str());
    else if (k == "--no-header") a.header = false;
    else usage();
  }
  if (a.steps < 1 || a.batch < 1 || (a.table != "engine" && a.table != "optim")) usage();
  return a;
}

int rank_of(MPI_Comm c) { int r; MPI_Comm_rank(c, &r); return r; }
int size_of(MPI_Comm c) { int n; MPI_Comm_size(c, &n); return n; }

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
int64_t max_over_ranks(int64_t v) {
  int64_t m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// CPU seconds of this process (all its threads): unlike wall time, barely moved by other
// processes competing for the cores, so it shows the work a step costs on a busy machine.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", bytes / (1024.0 * 1024.0));
  return b;
}

// ---- engine table -----------------------------------------------------------------------

struct Row {
  std::string name;
  int shard = 1, replicas = 1;
  int64_t state = 0;
  double ideal = 0;
  int64_t peak_unsharded = 0, peak_grad_buf = 0, hwm = 0;
  double step_s = 0, cpu_s = 0, loss0 = 0;
};

Row run_strategy(const Args& a, const std::string& name, int64_t psi) {
  const int N = size_of(MPI_COMM_WORLD), r = rank_of(MPI_COMM_WORLD);
  const bool bf16 = name == "full_shard+bf16";
  const fsdp::Strategy strategy = fsdp::parse_strategy(bf16 ? "full_shard" : name);
  const int k = a.ranks_per_host > 0 ? a.ranks_per_host : std::max(1, N / 2);
  // Hybrid: pretend every k consecutive ranks form a host; else the real (single) host.
  fsdp::GroupOptions go;
  go.strategy = strategy;
  go.simulate_ranks_per_host = fsdp::is_hybrid(strategy) ? k : 0;
  go.backend = "mpi";
  fsdp::ShardedGroups groups = fsdp::open_groups(MPI_COMM_WORLD, go);
  fsdp::StrategyComms& sc = groups.comms;

  std::shared_ptr<model::Model> m = model::build_model(a.spec, at::kMeta);
  fsdp::EngineOptions eo;
  eo.strategy = strategy;
  eo.wrap_types = m->block_types();
  eo.limit_all_gathers = a.limit_all_gathers;
  if (bf16) eo.mp.param_dtype = at::kBFloat16;
  eo.mp.keep_fp32 = m->norm_param_patterns();
  const uint64_t seed = a.seed;
  fsdp::InitFn init = [&](const std::string& pname, at::Tensor& t) {
    model::init_parameter(t, m->init_for(pname), model::param_seed(seed, pname));
  };
  fsdp::Engine engine(*m, sc.engine(), eo, init);
  fsdp::OptimizerConfig oc;
  oc.adamw = optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f};
  oc.no_decay = m->no_decay_patterns();
  fsdp::ShardedOptimizer opt(engine, oc);

  const int64_t T = a.spec.seq_len;
  std::vector<double> times, cpu_times;
  double loss0 = 0;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    // This rank's slice of the global batch: distinct per rank and step, same in every run.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000003ULL * step + r);
    at::Tensor tok = at::randint(a.spec.vocab_size, {a.batch, T + 1}, gen, at::kLong);
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t;
    const double c0 = process_cpu_seconds();
    engine.zero_grad();
    engine.set_last_micro_batch(true);
    at::Tensor loss = m->loss(tok.narrow(1, 0, T), tok.narrow(1, 1, T));
    loss.backward();
    engine.clip_grad_norm(1.0);
    opt.step(3e-4f);
    const double s = t.seconds(), cpu = process_cpu_seconds() - c0;
    if (step == 0) {
      double l = loss.item<double>(), sum = 0;
      MPI_Allreduce(&l, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      loss0 = sum / N;
    }
    const double smax = max_over_ranks(s), cmax = max_over_ranks(cpu);
    if (step >= a.warmup) {
      times.push_back(smax);
      cpu_times.push_back(cmax);
    }
  }

  Row row;
  row.name = name;
  row.shard = sc.shard_size();
  row.replicas = sc.replicate_size();
  fsdp::MemoryStats ms = engine.memory();
  row.state = max_over_ranks(ms.master_bytes + ms.grad_bytes + opt.state_bytes());
  row.ideal = 16.0 * double(psi) / double(strategy == fsdp::Strategy::NoShard ? 1 : row.shard);
  row.peak_unsharded = max_over_ranks(ms.peak_unsharded_bytes);
  row.peak_grad_buf = max_over_ranks(ms.peak_grad_buffer_bytes);
  row.hwm = max_over_ranks(read_process_memory().hwm_bytes);
  row.step_s = median(times);
  row.cpu_s = median(cpu_times);
  row.loss0 = loss0;
  return row;
}

void engine_table(const Args& a) {
  const int N = size_of(MPI_COMM_WORLD), r = rank_of(MPI_COMM_WORLD);
  const int64_t psi = model::parameter_count(model::resolve_spec(a.spec));
  const double tokens = double(N) * double(a.batch) * double(a.spec.seq_len);
  if (r == 0 && a.header) {
    std::printf("# bench_engine: gpt2 d_model %lld, %lld layers, %lld heads, seq %lld, vocab %lld: Psi = %lld "
                "(%.1f M); batch %lld seq/rank; N = %d; torch threads/rank %d; %d warm-up + %d timed steps\n",
                (long long)a.spec.d_model, (long long)a.spec.n_layers, (long long)a.spec.n_heads,
                (long long)a.spec.seq_len, (long long)a.spec.vocab_size, (long long)psi, psi / 1e6,
                (long long)a.batch, N, at::get_num_threads(), a.warmup, a.steps);
    std::printf("# 16Psi/N = %s MiB. MiB columns: max over ranks. step: median of per-step max over ranks.\n",
                mib(16.0 * double(psi) / N).c_str());
    std::printf("| N | strategy | SxR | state MiB/rank | /(16Psi/N) | ideal MiB | /ideal | peak unsharded MiB | "
                "peak grad buf MiB | peak RSS MiB | step ms | cpu ms | tokens/s | loss step 0 |\n");
    std::printf("|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    std::fflush(stdout);
  }
  for (size_t i = 0; i < a.strategies.size(); ++i) {
    // VmHWM is a process-lifetime peak: reset it so each strategy's peak is its own
    // (the driver runs one strategy per process anyway).
    if (i > 0) reset_peak_rss();
    Row row = run_strategy(a, a.strategies[i], psi);
    if (r == 0) {
      std::printf("| %d | %s | %dx%d | %s | %.3f | %s | %.3f | %s | %s | %s | %.0f | %.0f | %.0f | %.6f |\n", N,
                  row.name.c_str(), row.shard, row.replicas, mib(row.state).c_str(),
                  row.state / (16.0 * double(psi) / N), mib(row.ideal).c_str(), row.state / row.ideal,
                  mib(row.peak_unsharded).c_str(), mib(row.peak_grad_buf).c_str(), mib(row.hwm).c_str(),
                  row.step_s * 1e3, row.cpu_s * 1e3, tokens / row.step_s, row.loss0);
      std::fflush(stdout);
    }
  }
}

// ---- optimizer table --------------------------------------------------------------------

// Best of `reps` after one warm-up; each repetition starts on all ranks after a barrier (they
// share the machine's memory bandwidth, as in a real optimizer step). Returns the best of the
// per-repetition max over ranks of each rank's own time, and the best span from the first
// rank's start to the last rank's end (steady_clock is one clock for all processes of a
// host): with more ranks than cores the ranks run one after another, each fast on its own,
// and only the span shows what the machine as a whole delivers.
struct Timing {
  double rank_s = 1e300, span_s = 1e300;
};
Timing best_seconds_all_ranks(int reps, const std::function<void()>& fn) {
  fn();
  Timing best;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now_seconds();
    fn();
    const double end = now_seconds();
    double neg_start = -start, first_start = 0, last_end = 0;
    MPI_Allreduce(&neg_start, &first_start, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&end, &last_end, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best.rank_s = std::min(best.rank_s, max_over_ranks(end - start));
    best.span_s = std::min(best.span_s, last_end + first_start);
  }
  return best;
}

void optim_table(const Args& a) {
  const int N = size_of(MPI_COMM_WORLD), r = rank_of(MPI_COMM_WORLD);
  const int64_t psi = model::parameter_count(model::resolve_spec(a.spec));
  const int64_t n = (psi + N - 1) / N;
  const double bytes = 28.0 * double(n);

  torch::manual_seed(r);
  at::Tensor p_t = torch::randn({n}), g_t = torch::randn({n});
  std::vector<float> p(p_t.data_ptr<float>(), p_t.data_ptr<float>() + n);
  std::vector<float> g(g_t.data_ptr<float>(), g_t.data_ptr<float>() + n);
  std::vector<float> m(size_t(n), 0.f), v(size_t(n), 0.f);
  const optim::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 1e-4f;
  int64_t step = 0;
  const optim::DecayMask all = optim::DecayMask::all(n);
  const Timing fused = best_seconds_all_ranks(a.optim_reps, [&] {
    optim::adamw_step(p.data(), g.data(), m.data(), v.data(), n, all, cfg, lr, ++step);
  });
  Timing copy;
  {
    // Half the kernel's bytes copied: read + write = the same traffic.
    const size_t half = size_t(bytes / 2);
    std::vector<char> src(half, 1), dst(half, 0);
    copy = best_seconds_all_ranks(a.optim_reps, [&] { std::memcpy(dst.data(), src.data(), half); });
  }
  Timing torch_s;
  {
    at::Tensor param = p_t.clone();
    param.mutable_grad() = g_t.clone();
    torch::optim::AdamW o({param}, torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.1));
    torch_s = best_seconds_all_ranks(a.optim_reps, [&] { o.step(); });
  }
  if (r == 0) {
    if (a.header) {
      std::printf("# fused AdamW on ceil(Psi/N) elements per rank, all %d ranks at once; 28 B/elem; best of %d, "
                  "max over ranks; torch threads/rank %d, Kokkos Serial\n", N, a.optim_reps, at::get_num_threads());
      std::printf("# per rank: each rank's own time (max over ranks); all ranks: N x bytes over the span "
                  "from the first start to the last end\n");
      std::printf("| N | elems/rank | fused ms/rank | GB/s/rank | memcpy GB/s/rank | of memcpy | fused span ms | "
                  "all ranks GB/s | memcpy all ranks GB/s | torch ms/rank | torch/fused |\n");
      std::printf("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    }
    std::printf("| %d | %.1fM | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1fx |\n", N, n / 1e6,
                fused.rank_s * 1e3, bytes / fused.rank_s / 1e9, bytes / copy.rank_s / 1e9,
                copy.rank_s / fused.rank_s, fused.span_s * 1e3, N * bytes / fused.span_s / 1e9,
                N * bytes / copy.span_s / 1e9, torch_s.rank_s * 1e3, torch_s.rank_s / fused.rank_s);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  runtime::Runtime rt(&argc, &argv);
  Args a = parse(argc, argv);
  optim::KokkosScope kokkos;
  // libtorch defaults to one intra-op thread; N ranks share the machine's cores.
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(a.threads > 0 ? a.threads : std::max(1, hw / rt.size()));
  if (a.table == "engine")
    engine_table(a);
  else
    optim_table(a);
  return 0;
}
