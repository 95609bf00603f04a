// `shardtrain report RUN_DIR`: PNG plots of a run's metrics.
#include <cstdio>

#include "command.h"
#include "shardtrain/train/report.h"

namespace shardtrain::cli {
namespace {
void add_report(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand("report", "Draw loss, throughput and memory plots of a run directory (gnuplot)");
  auto dir = std::make_shared<std::string>();
  sub->add_option("run_dir", *dir, "Run directory (run.out_dir), holding metrics.jsonl")->required();
  sub->callback([&selected, dir] {
    selected = [dir](runtime::Runtime& rt) {
      if (rt.rank() != 0) return 0;
      for (const auto& p : train::write_report(*dir)) std::printf("wrote %s\n", p.c_str());
      return 0;
    };
  });
}
}  // namespace
ST_REGISTER_COMMAND(report, add_report);
}  // namespace shardtrain::cli
