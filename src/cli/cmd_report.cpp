// `shardtrain report RUN_DIR`: PNG plots of a run's metrics.
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "command.h"
#include "shardtrain/report/report.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::cli {
namespace {
void add_report(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand("report", "Draw loss, throughput and memory plots of a run directory (gnuplot)");
  auto dir = std::make_shared<std::string>();
  sub->add_option("run_dir", *dir, "Run directory (run.out_dir), holding metrics.jsonl")->required();
  sub->callback([&selected, dir] {
    selected = [dir](runtime::Runtime& rt) {
      std::vector<std::string> wrote;
      runtime::run_agreed(rt.world(), [&] {
        if (rt.rank() != 0) return;
        // A regular file only (a FIFO would block the reader forever); metrics files grow with
        // the run, so no small cap.
        check_regular_file(*dir + "/metrics.jsonl", std::numeric_limits<std::uint64_t>::max(), "metrics");
        wrote = report::write_report(*dir);
      });
      for (const auto& p : wrote) std::printf("wrote %s\n", p.c_str());
      return 0;
    };
  });
}
}  // namespace
ST_REGISTER_COMMAND(report, add_report);
}  // namespace shardtrain::cli
