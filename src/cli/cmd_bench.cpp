// `shardtrain bench collectives`: our comm layer against the raw MPI calls, nccl-tests style.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench_command.h"
#include "command.h"
#include "shardtrain/comm/bench.h"
#include "shardtrain/comm/dtype.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {

struct BenchCollectivesArgs {
  comm::CollectivesBenchOptions opts;
  std::string min_bytes = "1K", max_bytes = "64M";
};

int run_bench_collectives(runtime::Runtime& rt, BenchCollectivesArgs& a) {
  runtime::run_agreed(rt.world(), [&] {
    a.opts.min_bytes = parse_byte_size(a.min_bytes, "--min-bytes");
    a.opts.max_bytes = parse_byte_size(a.max_bytes, "--max-bytes");
    ST_USER_CHECK(a.opts.max_bytes <= (int64_t{16} << 30), "--max-bytes ", a.max_bytes,
                  " is too large (at most 16G: the benchmark allocates buffers of this size)");
    ST_USER_CHECK(a.opts.min_bytes >= 1 && a.opts.min_bytes <= a.opts.max_bytes, "--min-bytes ", a.min_bytes,
                  " must be at least 1 and at most --max-bytes ", a.max_bytes);
    comm::parse_float_dtype(a.opts.dtype);
  });
  comm::run_collectives_bench(rt.world(), a.opts, std::cout);
  return 0;
}

void add_bench_collectives(CLI::App& app, CommandFn& selected) {
  auto args = std::make_shared<BenchCollectivesArgs>();
  auto* sub = bench_command(app)->add_subcommand(
      "collectives", "all_gather / reduce_scatter / all_reduce bandwidth of the MPI backend vs raw MPI");
  sub->add_option("--op", args->opts.op, "all_gather | reduce_scatter | all_reduce | all")
      ->check(CLI::IsMember({"all_gather", "reduce_scatter", "all_reduce", "all"}))
      ->capture_default_str();
  sub->add_option("--min-bytes", args->min_bytes, "Smallest total size (e.g. 1K)")->capture_default_str();
  sub->add_option("--max-bytes", args->max_bytes, "Largest total size (e.g. 64M); sizes double")
      ->capture_default_str();
  const std::vector<std::string> dtypes = comm::float_dtype_short_names();
  std::string dtype_help;
  for (const std::string& n : dtypes) dtype_help += (dtype_help.empty() ? "" : " | ") + n;
  sub->add_option("--dtype", args->opts.dtype, dtype_help)
      ->check(CLI::IsMember(dtypes))
      ->capture_default_str();
  sub->add_option("--iters", args->opts.iters, "Timed iterations per size (1 .. 1000000)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--warmup", args->opts.warmup, "Untimed iterations per size (0 .. 1000000)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  sub->add_option("--compute-ms", args->opts.compute_ms,
                  "Also time each collective issued after this many ms of matmuls on every rank (sync_us column)")
      ->check(CLI::Range(0.0, 1e5));
  sub->add_option("--group-size", args->opts.group_size,
                  "Run in groups of this many ranks at once, each its own collective (default: all ranks)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_flag("--strided", args->opts.group_strided,
                "Groups of ranks equal modulo (ranks / group size) (replicate groups), not consecutive ranks");
  sub->callback([&selected, args] {
    selected = [args](runtime::Runtime& rt) { return run_bench_collectives(rt, *args); };
  });
}

}  // namespace
ST_REGISTER_COMMAND_NEEDS(bench_collectives, "bench", add_bench_collectives, computing());
}  // namespace shardtrain::cli
