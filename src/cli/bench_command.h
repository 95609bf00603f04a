// The `bench` parent subcommand, shared by cmd_bench*.cpp files (collectives, engine, ...).
#pragma once
#include <CLI/CLI.hpp>

namespace shardtrain::cli {

// Returns `shardtrain bench`, creating it on the first call. Each benchmark file calls this
// from its registration function and adds its own child (`bench collectives`,
// `bench engine`, ...), so the files stay independent and the order does not matter.
inline CLI::App* bench_command(CLI::App& app) {
  try {
    return app.get_subcommand("bench");
  } catch (const CLI::OptionNotFound&) {
    CLI::App* b = app.add_subcommand("bench", "Benchmarks (tables on rank 0); see perf/README.md");
    b->require_subcommand(1);
    return b;
  }
}

}  // namespace shardtrain::cli
