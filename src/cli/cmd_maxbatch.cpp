// `shardtrain maxbatch DECK`: the largest micro-batch (or model depth) that trains under a
// per-rank memory limit, by doubling then bisection; every probe is real training steps.
#include <ATen/Parallel.h>

#include <cstdio>
#include <sstream>

#include "command.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/plan/bytes.h"
#include "shardtrain/plan/strategy_plan.h"
#include "shardtrain/plan/tables.h"
#include "shardtrain/probe/probe.h"
#include "shardtrain/train/plan_settings.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/memory.h"

namespace shardtrain::cli {
namespace {

// Largest v in [1, max] with fits(v), fits being monotone (true up to some value, false above).
// lo: a value known to fit (0 = none), hi: one known not to (0 = none). Without a known
// failure, doubles from lo (or 1) until one fails or max is reached; then bisects (lo, hi).
// Returns 0 when fits(1) is false.
template <typename Fits>
int64_t largest_fitting(Fits&& fits, int64_t lo, int64_t hi, int64_t max) {
  for (int64_t v = lo > 0 ? std::min(2 * lo, max) : 1; hi == 0 && v > lo; v = std::min(2 * v, max)) {
    if (!fits(v)) hi = v;
    else lo = v;
  }
  while (hi > 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

struct MaxBatchArgs {
  DeckArgs deck;
  std::vector<std::string> strategies;
  std::string memory_limit;
  std::string vary = "micro_batch";
  int64_t max_value = 4096;
  int steps = 2;
  std::string search = "planned";
  bool plan_only = false;
};

struct Row {
  fsdp::Strategy strategy;
  int64_t best = 0;            // largest value that fits (0: not even the smallest)
  probe::ProbeResult at_best;  // its probe
  int64_t planned_best = 0;
  int64_t params_at_best = 0;
  int probes = 0;
};

int run_maxbatch(runtime::Runtime& rt, const MaxBatchArgs& a) {
  deck::Deck d = load_deck_agreed(a.deck, rt.world());
  std::vector<fsdp::Strategy> strategies;
  int64_t limit = 0;
  model::ModelSpec base;
  train::BatchPlan bp;
  const bool vary_layers = a.vary == "n_layers";
  runtime::run_agreed(rt.world(), [&] {
    ST_USER_CHECK(a.vary == "micro_batch" || a.vary == "n_layers", "--vary '", a.vary,
                  "': expected micro_batch or n_layers");
    for (const auto& s : a.strategies) {
      std::stringstream ss(s);
      for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) strategies.push_back(fsdp::parse_strategy(item));
    }
    if (strategies.empty()) strategies.push_back(train::strategy_from_deck(d));
    base = train::model_spec_from_deck(d);
    bp = train::plan_batches(d, rt.size());
    if (!a.memory_limit.empty()) limit = parse_byte_size(a.memory_limit, "--memory-limit");
  });
  optim::KokkosScope kokkos;
  train::install_alloc_tracker();
  const int threads = probe::probe_threads(rt.world(), d);
  at::set_num_threads(threads);
  if (limit == 0) {
    // Default: 80% of the memory available now, shared by the ranks of each host.
    const int local_size = runtime::real_host_ranks(rt.world()).size;
    const auto mine = static_cast<int64_t>(0.8 * read_host_memory().available_bytes / local_size);
    limit = runtime::min(rt.world(), mine, "maxbatch.memory");
  }
  const int sim = static_cast<int>(d.get_int("parallel.simulate_ranks_per_host"));
  const int rph = sim > 0 ? sim : rt.size();
  const char* what = vary_layers ? "n_layers" : "micro-batch";
  if (rt.rank() == 0) {
    std::printf("# shardtrain maxbatch: %s %lld x %lld (%s), %d ranks, limit %s per rank (tensor bytes + optimizer "
                "state, counted by the program's allocator), %d step%s per probe; varying %s\n",
                base.arch.c_str(), static_cast<long long>(base.n_layers), static_cast<long long>(base.d_model),
                vary_layers ? "layers varied" : "deck's depth", rt.size(), plan::format_bytes(limit).c_str(), a.steps,
                a.steps > 1 ? "s" : "", what);
    std::fflush(stdout);
  }

  auto spec_for = [&](int64_t v) {
    model::ModelSpec s = base;
    if (vary_layers) s.n_layers = v;
    return s;
  };
  // --vary n_layers: the shallowest depth the deck's model builds at. train.freeze and
  // lora.targets patterns that name layers ("model.layers.3.*") match nothing in a shallower
  // model, which is refused (exit 2); the search starts there instead.
  int64_t floor = 1;
  if (vary_layers) {
    runtime::run_agreed(rt.world(), [&] {
      for (;; ++floor) {
        try {
          model::build_model(spec_for(floor), at::kMeta);
          break;
        } catch (const UserError&) {
          if (floor >= std::min<int64_t>(a.max_value, std::max<int64_t>(base.n_layers, 1))) throw;
        }
      }
    });
    if (floor > 1 && rt.rank() == 0) {
      std::printf("# n_layers below %lld: the deck's train.freeze / lora.targets patterns name layers such a model "
                  "does not have; the search starts at %lld\n",
                  static_cast<long long>(floor), static_cast<long long>(floor));
      std::fflush(stdout);
    }
  }
  std::vector<Row> rows;
  for (fsdp::Strategy st : strategies) {
    Row row;
    row.strategy = st;
    // The planner's answer, by the same search (cheap: no steps).
    plan::PlanSettings ps;
    runtime::run_agreed(rt.world(), [&] { ps = train::plan_settings_from_deck(d, rt.size(), rph); });
    ps.threads = threads;
    auto planned_fits = [&](int64_t v) {
      plan::PlanSettings q = ps;
      q.spec = spec_for(v);
      if (!vary_layers) q.micro_batch = v;
      return plan::plan_strategy(q, st).mem.total <= limit;
    };
    auto planned_peak = [&](int64_t v) {
      plan::PlanSettings q = ps;
      q.spec = spec_for(v);
      if (!vary_layers) q.micro_batch = v;
      return plan::plan_strategy(q, st).mem.total;
    };
    row.planned_best = largest_fitting(planned_fits, floor - 1, 0, a.max_value);
    if (row.planned_best < floor) row.planned_best = 0;  // not even the shallowest

    auto probe = [&](int64_t v) {
      probe::ProbeOptions o;
      o.spec = spec_for(v);
      o.strategy = st;
      o.micro_batch = vary_layers ? bp.micro_batch : v;
      o.grad_accum = 1;
      o.steps = a.steps;
      o.memory_limit = limit;
      o.attention_span = ps.windows.attention_span;
      const probe::ProbeResult r = probe::run_probe(rt.world(), d, o);
      ++row.probes;
      if (rt.rank() == 0) {
        std::printf("probe %-18s %s %5lld: peak %11s (planned %11s), step %7.2f s -> %s\n", fsdp::to_string(st), what,
                    static_cast<long long>(v), plan::format_bytes(r.peak_bytes).c_str(),
                    plan::format_bytes(planned_peak(v)).c_str(), r.step_s, r.fits ? "fits" : "over the limit");
        std::fflush(stdout);
      }
      if (r.fits && v > row.best) {
        row.best = v;
        row.at_best = r;
        row.params_at_best = model::parameter_count(o.spec);
      }
      return r.fits;
    };
    if (a.plan_only) {
      rows.push_back(row);
      continue;
    }
    // The search: every verdict is agreed by all ranks, so all take the same branches.
    // "doubling": from 1, double until a probe fails (or --max), then bisect between the last
    // success and the first failure. "planned": start at the planner's answer and probe
    // outward (its neighbour above, or halving below) until a success and a failure bracket
    // the answer, then bisect; with an accurate planner that is two probes.
    int64_t lo = 0, hi = 0;
    if (a.search == "planned" && row.planned_best > 0) {
      const int64_t v0 = std::min(row.planned_best, a.max_value);
      if (probe(v0)) {
        lo = v0;
        for (int64_t step = 1; lo < a.max_value; step *= 2) {
          const int64_t v = std::min(lo + step, a.max_value);
          if (!probe(v)) {
            hi = v;
            break;
          }
          lo = v;
        }
      } else {
        hi = v0;
        for (int64_t v = v0 / 2; v >= floor; v /= 2) {
          if (probe(v)) {
            lo = v;
            break;
          }
          hi = v;
        }
      }
    }
    if (lo < floor - 1) lo = floor - 1;  // never below the shallowest (only probes that fit set row.best)
    largest_fitting(probe, lo, hi, a.max_value);
    rows.push_back(row);
  }

  if (rt.rank() == 0) {
    std::printf("\n| strategy | ranks | model | max %s | step time (s) | peak / rank | planned max | probes |\n", what);
    std::printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
    for (const auto& r : rows) {
      const model::ModelSpec s = spec_for(vary_layers ? std::max<int64_t>(1, r.best) : base.n_layers);
      char model[128];
      if (vary_layers)
        std::snprintf(model, sizeof model, "%s d=%lld, %.1f M params at max", s.arch.c_str(),
                      static_cast<long long>(s.d_model), r.params_at_best / 1e6);
      else
        std::snprintf(model, sizeof model, "%s %lldx%lld, %.1f M params", s.arch.c_str(),
                      static_cast<long long>(s.n_layers), static_cast<long long>(s.d_model),
                      model::parameter_count(s) / 1e6);
      std::printf("| %s | %d | %s | %s | %s | %s | %lld | %d |\n", fsdp::to_string(r.strategy), rt.size(), model,
                  a.plan_only ? "-" : r.best > 0 ? std::to_string(r.best).c_str() : "OOM",
                  r.best > 0 ? std::to_string(r.at_best.step_s).substr(0, 5).c_str() : "-",
                  r.best > 0 ? plan::format_bytes(r.at_best.peak_bytes).c_str() : "-",
                  static_cast<long long>(r.planned_best), r.probes);
    }
    std::printf("\n");
    for (const auto& r : rows) {
      std::printf("MAXBATCH strategy=%s ranks=%d vary=%s max=%lld planned=%lld step_s=%.4f peak=%lld params=%lld\n",
                  fsdp::to_string(r.strategy), rt.size(), a.vary.c_str(), static_cast<long long>(r.best),
                  static_cast<long long>(r.planned_best), r.at_best.step_s,
                  static_cast<long long>(r.at_best.peak_bytes), static_cast<long long>(r.params_at_best));
    }
    std::fflush(stdout);
  }
  return kExitOk;
}

void add_maxbatch(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand(
      "maxbatch", "Largest micro-batch (or depth) that trains under a per-rank memory limit (real steps, bisection)");
  auto args = std::make_shared<MaxBatchArgs>();
  add_deck_args(sub, args->deck, true);
  sub->add_option("--strategy", args->strategies,
                  "Strategies to search (repeatable or comma-separated; default parallel.strategy)");
  sub->add_option("--memory-limit", args->memory_limit,
                  "Per-rank limit on tensor bytes + optimizer state, e.g. 2GiB (default: 80% of MemAvailable / "
                  "ranks per host)");
  sub->add_option("--vary", args->vary, "What to search: micro_batch, or n_layers at the deck's micro-batch")
      ->capture_default_str();
  sub->add_option("--max", args->max_value, "Largest value tried (1 .. 1048576)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--steps", args->steps, "Training steps per probe (1 .. 10000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  sub->add_option("--search", args->search,
                  "planned: start at the planner's answer and bracket it with probes; doubling: from 1 up")
      ->capture_default_str()
      ->check(CLI::IsMember({"planned", "doubling"}));
  sub->add_flag("--plan-only", args->plan_only, "Print the planner's answers without running probes");
  sub->callback([&selected, args] {
    selected = [args](runtime::Runtime& rt) { return run_maxbatch(rt, *args); };
  });
}

}  // namespace
ST_REGISTER_COMMAND_NEEDS(maxbatch, "maxbatch", add_maxbatch, computing());
}  // namespace shardtrain::cli
