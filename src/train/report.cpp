// write_report: metrics.jsonl -> columns -> one gnuplot script -> PNGs.
#include "shardtrain/train/report.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/util/error.h"

namespace shardtrain::train {

std::vector<std::string> write_report(const std::string& run_dir, const std::string& metrics_file) {
  const std::string path = run_dir + "/" + metrics_file;
  std::ifstream in(path);
  ST_USER_CHECK(in.good(), "cannot read '", path, "': is '", run_dir, "' a run directory?");
  const std::string plots = run_dir + "/plots";
  mkdir(plots.c_str(), 0755);
  std::ofstream train(plots + "/train.dat"), val(plots + "/val.dat");
  std::string line;
  int lineno = 0, n_train = 0, n_val = 0;
  bool tokens = true;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw UserError(path + ":" + std::to_string(lineno) + ": not a JSON record: " + e.what());
    }
    ST_USER_CHECK(j.contains("step"), path, ":", lineno, ": record without 'step'");
    if (j.contains("val_loss")) {
      val << j["step"].get<double>() << " " << j["val_loss"].get<double>() << " "
          << (j.contains("val_acc") ? j["val_acc"].get<double>() : -1) << "\n";
      ++n_val;
    } else if (j.contains("loss")) {
      if (j.contains("samples_per_s")) tokens = false;
      double ips = j.contains("samples_per_s") ? j["samples_per_s"].get<double>() : j.value("tokens_per_s", 0.0);
      train << j["step"].get<double>() << " " << j["loss"].get<double>() << " " << ips << " "
            << j.value("peak_mem_bytes", 0.0) / 1073741824.0 << " " << 100 * j.value("comm_share", 0.0) << "\n";
      ++n_train;
    }
  }
  train.close();
  val.close();
  ST_USER_CHECK(n_train > 0, "'", path, "' has no training records to plot");
  ST_USER_CHECK(std::system("command -v gnuplot >/dev/null 2>&1") == 0,
                "gnuplot is not installed (Debian: apt-get install gnuplot-nox)");

  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,560 noenhanced\nset grid\nset key top right\n"
     << "set xlabel 'step'\n"
     << "set output '" << plots << "/loss.png'\nset title 'loss (" << run_dir << ")'\nset ylabel 'loss'\n"
     << "plot '" << plots << "/train.dat' using 1:2 with lines lw 2 title 'train'";
  if (n_val > 0) gp << ", '" << plots << "/val.dat' using 1:2 with linespoints pt 7 lw 2 title 'validation'";
  gp << "\nset output '" << plots << "/throughput.png'\nset title 'throughput'\nset ylabel '"
     << (tokens ? "tokens/s" : "samples/s") << "'\nset y2label 'exposed communication (%)'\nset y2tics\n"
     << "plot '" << plots << "/train.dat' using 1:3 with linespoints pt 7 title '" << (tokens ? "tokens/s" : "samples/s")
     << "', '' using 1:5 axes x1y2 with lines title 'exposed comm %'\nunset y2tics\nunset y2label\n"
     << "set output '" << plots << "/memory.png'\nset title 'peak resident memory per rank (max over ranks)'\n"
     << "set ylabel 'GiB'\nset yrange [0:*]\n"
     << "plot '" << plots << "/train.dat' using 1:4 with linespoints pt 7 title 'peak RSS'\n";
  const std::string script = plots + "/plots.gp";
  std::ofstream(script) << gp.str();
  const std::string cmd = "gnuplot '" + script + "' 2>'" + plots + "/gnuplot.log'";
  ST_USER_CHECK(std::system(cmd.c_str()) == 0, "gnuplot failed; see ", plots, "/gnuplot.log");
  return {plots + "/loss.png", plots + "/throughput.png", plots + "/memory.png"};
}

}  // namespace shardtrain::train
