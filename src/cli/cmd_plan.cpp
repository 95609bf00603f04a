// `shardtrain plan DECK`: per-strategy memory and communication per rank, sharding diagrams and
// a recommendation; with --measure, real steps under the counting allocator next to the plan.
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include "command.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/model/layers.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/plan/bytes.h"
#include "shardtrain/plan/strategy_plan.h"
#include "shardtrain/plan/tables.h"
#include "shardtrain/probe/probe.h"
#include "shardtrain/train/bf16_choice.h"
#include "shardtrain/train/plan_settings.h"
#include "shardtrain/train/peak_flops.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {

struct PlanArgs {
  DeckArgs deck;
  int ranks = 0, ranks_per_host = 0;
  std::string device_memory = "80GiB";
  std::string inter_host_weight = "8";
  double compute_tflops = 0;  // 0: measure a matmul here
  double intra_busbw = plan::StepTimeSettings{}.intra_busbw_gbps;
  double latency_us = plan::StepTimeSettings{}.latency_us;
  int cores_per_host = 0;     // 0: this machine's cores
  std::string link_core_weight = "1", sync_us = "0";         // rings across the links
  std::string intra_core_weight = "1", intra_sync_us = "0";  // rings inside hosts
  double optimizer_ns = plan::StepTimeSettings{}.optimizer_ns_per_param;
  bool measure = false;
  std::string target;  // cuda | cpu; "" = this machine's kind
  std::vector<std::string> strategies;
  int steps = 2;
  double tolerance = 0;
};

// Strategy names from repeatable / comma-separated flags ("" = all five).
std::vector<fsdp::Strategy> parse_strategies(const std::vector<std::string>& args) {
  std::vector<fsdp::Strategy> out;
  for (const auto& a : args) {
    std::stringstream ss(a);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) out.push_back(fsdp::parse_strategy(item));
  }
  return out;
}

// A flag's comma-separated numbers, each in [lo, hi]; `form` says what the flag takes.
std::vector<double> parse_numbers(const std::string& flag, const std::string& text, double lo, double hi,
                                  const std::string& form) {
  std::vector<double> w;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ST_USER_CHECK(used > 0 && used == item.size() && v >= lo && v <= hi, flag, " '", text, "': ", form,
                  ", each in [", lo, ", ", hi, "], not '", item, "'");
    w.push_back(v);
  }
  ST_USER_CHECK(!w.empty(), flag, " '", text, "': ", form);
  return w;
}

// --inter-host-weight W[,W2,W3...]: W for one ring edge on a host's link, W2 for each of 2 edges
// sharing it at once, ... (measured: perf/cluster/run.sh; docs/memory-planner.md).
void parse_link_weights(const std::string& text, plan::PlanSettings* ps) {
  const std::vector<double> w = parse_numbers(
      "--inter-host-weight", text, 1e-6, 1e6,
      "comma-separated numbers (W for one ring edge on a host's link, then W2 for each of 2 edges sharing it, ...)");
  ps->inter_host_weight = w[0];
  ps->shared_link_weights.assign(w.begin() + 1, w.end());
}

// A per-op flag (--link-core-weight, --sync-us, --intra-...): X for every op, or AG,RS,AR.
std::array<double, 3> parse_per_op(const std::string& flag, const std::string& text, double hi) {
  const char* form = "one number, or three (all-gather, reduce-scatter, all-reduce)";
  const std::vector<double> w = parse_numbers(flag, text, 0, hi, form);
  ST_USER_CHECK(w.size() == 1 || w.size() == 3, flag, " '", text, "': give ", form);
  if (w.size() == 1) return {w[0], w[0], w[0]};
  return {w[0], w[1], w[2]};
}

int run_plan(runtime::Runtime& rt, const PlanArgs& a) {
  deck::Deck d = load_deck_agreed(a.deck, rt.world());
  plan::PlanSettings ps;
  int64_t device_bytes = 0;
  std::vector<fsdp::Strategy> wanted;
  runtime::run_agreed(rt.world(), [&] {
    const int ranks = a.ranks > 0 ? a.ranks : rt.size();
    const int sim = static_cast<int>(d.get_int("parallel.simulate_ranks_per_host"));
    const int rph = a.ranks_per_host > 0 ? a.ranks_per_host : (sim > 0 ? sim : ranks);
    ST_USER_CHECK(!a.measure || ranks == rt.size(), "plan --measure runs real steps on this job's ranks: --ranks ",
                  ranks, " must equal the number of MPI ranks (", rt.size(), ")");
    ST_USER_CHECK(rph >= 1 && ranks % rph == 0, "--ranks-per-host ", rph, " must divide --ranks ", ranks);
    device_bytes = parse_byte_size(a.device_memory, "--device-memory");
    ps = train::plan_settings_from_deck(d, ranks, rph);
    // The planner counts in int64 bytes: a deck beyond 2^62 bytes per rank cannot run on any
    // machine, and its plan would wrap.
    const train::StepBytesBound bound = train::step_bytes_lower_bound(ps.spec, ps.micro_batch, ranks);
    ST_USER_CHECK(bound.total() < 4.0e18, d.source(), ": one step of this deck needs at least ", bound.total(),
                  " bytes per rank (model.seq_len ", ps.spec.seq_len, ", train.micro_batch ", ps.micro_batch,
                  ", ", bound.params, " parameters over ", ranks, " ranks), more than any machine has");
    parse_link_weights(a.inter_host_weight, &ps);
    wanted = parse_strategies(a.strategies);
    ps.step.intra_busbw_gbps = a.intra_busbw;
    ps.step.latency_us = a.latency_us;
    ps.step.link_cores = {parse_per_op("--link-core-weight", a.link_core_weight, 1e6),
                          parse_per_op("--sync-us", a.sync_us, 1e9)};
    ps.step.intra_cores = {parse_per_op("--intra-core-weight", a.intra_core_weight, 1e6),
                           parse_per_op("--intra-sync-us", a.intra_sync_us, 1e9)};
    ps.step.optimizer_ns_per_param = a.optimizer_ns;
    // The device planned for: --target, else this machine's (a GPU if one is visible). The probes
    // of --measure run on this machine's CPU, so only a CPU plan can be compared with them.
    ST_USER_CHECK(!a.measure || a.target != "cuda", "plan --measure runs its probes on this machine's CPU: "
                  "--target cuda cannot be measured here (leave --target out, or give --target cpu)");
    if (a.target == "cuda") {
      ps.target.cuda = true;
      ps.target.fused_attention = true;  // a CUDA build with libtorch >= 2 (the GPU path's)
    } else if (a.target.empty() && !a.measure && fsdp::cuda_device_count() > 0) {
      ps.target.cuda = true;
      ps.target.fused_attention = model::attention_is_fused(true);  // what this build runs there
    }
  });
  // Cores per host: given, else this machine's; under --measure the simulated hosts of this job
  // share this machine's cores (ranks_per_host of its local ranks each).
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int local = a.measure ? runtime::real_host_ranks(rt.world()).size : ps.ranks_per_host;
  ps.step.cores_per_host = a.cores_per_host > 0 ? a.cores_per_host
                                                : std::max(1, hw * ps.ranks_per_host / std::max(ps.ranks_per_host, local));
  // --measure: plan for the threads the probes will use (bf16 GEMM workspace is per thread).
  const int threads = a.measure ? probe::probe_threads(rt.world(), d) : 0;
  if (a.measure) ps.threads = threads;
  // The compute rate of the step estimate: the given one, else the trainer's matmul measured here
  // on one rank's threads (the slowest rank's, when the job has several).
  if (a.compute_tflops > 0) {
    ps.step.compute_tflops = a.compute_tflops;
    ps.step.compute_source = "--compute-tflops";
  } else {
    // bf16 on this CPU: the GEMM path the run would take (fsdp.bf16_gemm; auto's cached choice).
    std::string path;
    if (ps.engine.mp.param_dtype == at::kBFloat16)
      path = std::string(" by ") + model::to_string(train::choose_bf16_gemm(rt.world(), d.get_string("fsdp.bf16_gemm")).path) +
             " GEMMs (fsdp.bf16_gemm)";
    const int before = at::get_num_threads();
    at::set_num_threads(std::max(1, ps.threads));
    const double mine = train::measure_peak_tflops(ps.engine.mp.param_dtype);
    at::set_num_threads(before);
    ps.step.compute_tflops = runtime::min(rt.world(), mine, "plan.compute_rate");
    char src[220];
    std::snprintf(src, sizeof src, "a %s matmul%s measured here on %d thread%s: the peak, so compute is a lower bound; "
                  "give the model's achieved rate with --compute-tflops", fsdp::dtype_name(ps.engine.mp.param_dtype),
                  path.c_str(), std::max(1, ps.threads), ps.threads > 1 ? "s" : "");
    ps.step.compute_source = src;
  }
  std::vector<plan::StrategyPlan> plans;
  runtime::run_agreed(rt.world(), [&] {
    if (wanted.empty()) {
      plans = plan::plan_all(ps);
    } else {
      for (fsdp::Strategy s : wanted) plans.push_back(plan::plan_strategy(ps, s));
    }
  });
  if (rt.rank() == 0) {
    std::fputs(plan::format_plan(ps, plans, device_bytes).c_str(), stdout);
    std::fflush(stdout);
  }
  if (!a.measure) return kExitOk;

  // ---- --measure: the same step for real, strategy by strategy ----------------------------
  train::install_alloc_tracker();
  optim::KokkosScope kokkos;
  at::set_num_threads(threads);
  if (rt.rank() == 0) {
    std::printf("\n# measured: %d step%s per strategy on %d ranks (%d per simulated host), synthetic batches; "
                "peak = tensor bytes (counting allocator) + optimizer state, max over ranks\n",
                a.steps, a.steps > 1 ? "s" : "", rt.size(), ps.ranks_per_host);
    std::printf("%-20s %14s %14s %9s  %-28s %9s %9s\n", "strategy", "planned", "measured", "error", "planned peak at",
                "step (s)", "est. (s)");
    std::fflush(stdout);
  }
  double worst = 0;
  int fastest = -1;
  double fastest_s = 0;
  for (const auto& p : plans) {
    probe::ProbeOptions o;
    o.spec = ps.spec;
    o.strategy = p.strategy;
    o.micro_batch = ps.micro_batch;
    o.grad_accum = ps.grad_accum;
    o.steps = a.steps;
    o.ranks_per_host = ps.ranks_per_host;
    o.attention_span = ps.windows.attention_span;
    const probe::ProbeResult r = probe::run_probe(rt.world(), d, o);
    const double err = r.peak_bytes > 0 ? static_cast<double>(p.mem.total - r.peak_bytes) / r.peak_bytes : 0;
    worst = std::max(worst, std::fabs(err));
    if (rt.rank() == 0) {
      std::printf("%-20s %14s %14s %+8.1f%%  %-28s %9.3f %9.3f\n", fsdp::to_string(p.strategy),
                  plan::format_bytes(p.mem.total).c_str(), plan::format_bytes(r.peak_bytes).c_str(), 100 * err,
                  p.mem.peak_at.c_str(), r.step_s, p.step.step_s());
      std::printf("PLAN_VS_MEASURED strategy=%s planned=%lld measured=%lld\n", fsdp::to_string(p.strategy),
                  static_cast<long long>(p.mem.total), static_cast<long long>(r.peak_bytes));
      std::fflush(stdout);
    }
    // The measured recommendation: the fastest measured step among the plans that fit.
    if (p.mem.total <= device_bytes && (fastest < 0 || r.step_s < fastest_s)) {
      fastest = static_cast<int>(&p - plans.data());
      fastest_s = r.step_s;
    }
  }
  if (rt.rank() == 0 && fastest >= 0) {
    const std::string which = a.steps > 2 ? "the median of steps 2 .. " + std::to_string(a.steps)
                                          : a.steps == 2 ? std::string("the second of 2") : std::string("one step");
    std::printf("measured recommendation: parallel.strategy = \"%s\" (the fastest measured step that fits, %.3f s; "
                "%s, under this machine's load)\n",
                fsdp::to_string(plans[fastest].strategy), fastest_s, which.c_str());
    std::fflush(stdout);
  }
  if (a.tolerance > 0 && worst > a.tolerance) {
    if (rt.rank() == 0)
      std::fprintf(stderr, "plan --measure: the largest planner error is %.1f%%, above --tolerance %.1f%%\n",
                   100 * worst, 100 * a.tolerance);
    return kExitInternal;
  }
  return kExitOk;
}

void add_plan(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand(
      "plan", "Per-rank memory and communication of every sharding strategy for a deck, and the cheapest that fits");
  auto args = std::make_shared<PlanArgs>();
  add_deck_args(sub, args->deck, true);
  sub->add_option("--ranks", args->ranks, "World size to plan for (default: this job's ranks; at most 1048576)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--ranks-per-host", args->ranks_per_host,
                  "Ranks (GPUs) per host (default: parallel.simulate_ranks_per_host, else all on one host)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--device-memory", args->device_memory, "Memory per rank, e.g. 80GiB, 40GB, 512MiB")
      ->capture_default_str();
  sub->add_option("--inter-host-weight", args->inter_host_weight,
                  "Cost of an inter-host byte in intra-host bytes, for the recommendation: W for one ring edge "
                  "on a host's link, or W,W2,... with the measured cost when 2, ... edges share it (default W x edges)")
      ->capture_default_str();
  sub->add_option("--compute-tflops", args->compute_tflops,
                  "Step estimate: the model's achieved TFLOP/s per rank on its own threads (default: a matmul "
                  "measured here, the peak)")
      ->check(CLI::Range(1e-9, 1e9));
  sub->add_option("--intra-host-busbw", args->intra_busbw,
                  "Step estimate: GB/s of one ring edge inside a host (bench collectives busbw over one host's ranks); "
                  "an edge across a host's link runs at this / --inter-host-weight")
      ->capture_default_str()
      ->check(CLI::Range(1e-9, 1e9));
  sub->add_option("--latency-us", args->latency_us, "Step estimate: microseconds per ring step of a collective")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  sub->add_option("--cores-per-host", args->cores_per_host,
                  "Step estimate: cores of one host (default: this machine's; under --measure its share for "
                  "--ranks-per-host of its ranks); ranks x threads above it share them, and communication's core "
                  "time does not overlap compute")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--link-core-weight", args->link_core_weight,
                  "Step estimate, shared cores: core time of a byte sent over a ring across the links, in intra-host "
                  "bytes, one number or AG,RS,AR per op (bench collectives --compute-ms: core_us over such a ring); the "
                  "link's time beyond it overlaps compute")
      ->capture_default_str();
  sub->add_option("--intra-core-weight", args->intra_core_weight,
                  "Step estimate, shared cores: the same for rings inside a host (bench collectives --compute-ms "
                  "--group-size G: core_us over one host's G ranks, every host's group at once)")
      ->capture_default_str();
  sub->add_option("--optimizer-ns-per-param", args->optimizer_ns,
                  "Step estimate: one core's optimizer step (+ clipping norm) per parameter it updates, ns (bench_optim); "
                  "given, --compute-tflops is forward + backward alone and each rank updates its shards (default 0: the "
                  "optimizer is inside the rate)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--sync-us", args->sync_us,
                  "Step estimate, shared cores: core time lost per collective over a ring across the links by ranks "
                  "arriving out of phase, one number or AG,RS,AR (bench collectives --compute-ms: sync_us)")
      ->capture_default_str();
  sub->add_option("--intra-sync-us", args->intra_sync_us,
                  "Step estimate, shared cores: the same for rings inside a host (--group-size G: sync_us)")
      ->capture_default_str();
  sub->add_option("--target", args->target,
                  "The device to plan for: cuda (a GPU with libtorch >= 2: fused attention, no T x T scores) or cpu "
                  "(the explicit attention, libtorch's CPU GEMM workspace); default: this machine's (cuda when a GPU "
                  "is visible)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  sub->add_option("--strategy", args->strategies, "Only these strategies (repeatable or comma-separated)");
  sub->add_flag("--measure", args->measure,
                "Also run real steps for each strategy (needs --ranks MPI ranks) and print planned vs measured peaks");
  sub->add_option("--steps", args->steps, "--measure: training steps per strategy (1 .. 10000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  sub->add_option("--tolerance", args->tolerance,
                  "--measure: exit 1 if a planned peak is off by more than this fraction of the measured one")
      ->check(CLI::Range(0.0, 1e6));
  sub->callback([&selected, args] {
    selected = [args](runtime::Runtime& rt) { return run_plan(rt, *args); };
  });
}

}  // namespace
ST_REGISTER_COMMAND_NEEDS(plan, "plan", add_plan, computing_with("--measure"));
}  // namespace shardtrain::cli
