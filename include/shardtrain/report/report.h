// Plots of a run directory's metrics.jsonl (PNG, drawn by gnuplot).
#pragma once
#include <string>
#include <vector>

namespace shardtrain::report {

// Writes RUN_DIR/plots/{loss,throughput,memory}.png (and the .dat files gnuplot reads).
// Returns the PNG paths. UserError when the metrics file is missing or malformed, or
// when gnuplot is not installed.
std::vector<std::string> write_report(const std::string& run_dir, const std::string& metrics_file = "metrics.jsonl");

}  // namespace shardtrain::report
