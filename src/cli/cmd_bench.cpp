// `shardtrain bench collectives`: our comm layer against the raw MPI calls, nccl-tests style.
#include <iostream>
#include <memory>

#include "bench_command.h"
#include "command.h"
#include "shardtrain/comm/bench.h"
#include "shardtrain/runtime/agree.h"

namespace shardtrain::cli {
namespace {

struct BenchCollectivesArgs {
  comm::CollectivesBenchOptions opts;
  std::string min_bytes = "1K", max_bytes = "64M";
};

int run_bench_collectives(runtime::Runtime& rt, BenchCollectivesArgs& a) {
  runtime::run_agreed(rt.world(), [&] {
    a.opts.min_bytes = comm::parse_byte_size(a.min_bytes);
    a.opts.max_bytes = comm::parse_byte_size(a.max_bytes);
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
  sub->add_option("--dtype", args->opts.dtype, "fp32 | fp64 | bf16 | fp16")
      ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--iters", args->opts.iters, "Timed iterations per size")->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--warmup", args->opts.warmup, "Untimed iterations per size")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->callback([&selected, args] {
    selected = [args](runtime::Runtime& rt) { return run_bench_collectives(rt, *args); };
  });
}

}  // namespace
ST_REGISTER_COMMAND(bench_collectives, add_bench_collectives);
}  // namespace shardtrain::cli
