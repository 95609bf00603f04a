// write_report: metrics.jsonl -> columns -> one gnuplot script -> PNGs. No shell: gnuplot is
// spawned with an argument vector in the plots directory, and the script names only fixed
// file names there; the one user string in it (the run directory, in a title) is quoted.
#include "shardtrain/report/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"

namespace shardtrain::report {
namespace {

constexpr const char* kPlots[] = {"loss.png", "throughput.png", "memory.png"};

// `s` as a gnuplot single-quoted string: '' stands for a quote, nothing else is special there
// (and the terminal is noenhanced); control characters, which could end the script line,
// become '?'.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c == '\'') out += "''";
    else if (c < 0x20 || c == 0x7f) out += '?';
    else out += static_cast<char>(c);
  }
  return out + "'";
}

// plots/ inside the run directory: created, and refused when it is anything but a directory
// of its own (a symbolic link would send the plots elsewhere).
void make_plots_dir(const std::string& plots) {
  if (::mkdir(plots.c_str(), 0755) != 0 && errno != EEXIST)
    throw IoError("cannot create " + plots + ": " + io::errno_text(errno));
  struct stat st {};
  if (::lstat(plots.c_str(), &st) != 0) throw IoError("cannot create " + plots + ": " + io::errno_text(errno));
  if (!S_ISDIR(st.st_mode))
    throw UserError(plots + " exists and is not a directory (a symbolic link or a file): remove it; report writes "
                    "its plots only into a directory of its own (docs/security.md)");
}

// Runs `gnuplot plots.gp` in `dir` with stderr to gnuplot.log: fork + execvp, no shell.
// Returns the exit status; UserError when gnuplot is not installed.
int run_gnuplot(const std::string& dir) {
  const std::string log_path = dir + "/gnuplot.log";
  const int log = io::open_in_place(log_path, O_WRONLY, "gnuplot log");
  if (log < 0) throw IoError(log_path + ": cannot open for writing: " + io::errno_text(errno));
  if (::ftruncate(log, 0) != 0) {
    ::close(log);
    throw IoError(log_path + ": cannot truncate: " + io::errno_text(errno));
  }
  int report[2];  // the child's execvp errno, if it fails (closed by a successful exec)
  if (::pipe2(report, O_CLOEXEC) != 0) {
    ::close(log);
    throw Error("pipe2 failed: " + io::errno_text(errno));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    int err = 0;
    if (::chdir(dir.c_str()) != 0 || ::dup2(log, 2) < 0) err = errno;
    if (err == 0) {
      char prog[] = "gnuplot", script[] = "plots.gp";
      char* argv[] = {prog, script, nullptr};
      ::execvp(prog, argv);
      err = errno;
    }
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    throw Error("fork failed: " + io::errno_text(fork_errno));
  }
  int child_err = 0;
  const bool exec_failed = ::read(report[0], &child_err, sizeof child_err) == static_cast<ssize_t>(sizeof child_err);
  ::close(report[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed) {
    if (child_err == ENOENT) throw UserError("gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    throw UserError("cannot run gnuplot in " + dir + ": " + io::errno_text(child_err));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

std::vector<std::string> write_report(const std::string& run_dir, const std::string& metrics_file) {
  const std::string path = run_dir + "/" + metrics_file;
  std::ifstream in(path);
  ST_USER_CHECK(in.good(), "cannot read '", path, "': is '", run_dir, "' a run directory?");
  const std::string plots = run_dir + "/plots";
  std::ostringstream train, val;
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
  ST_USER_CHECK(n_train > 0, "'", path, "' has no training records to plot");
  make_plots_dir(plots);
  io::write_file_atomic(plots + "/train.dat", train.str());
  io::write_file_atomic(plots + "/val.dat", val.str());

  // Relative names only: gnuplot runs in plots/. Each PNG is drawn into a temporary this
  // process created exclusively (gnuplot's own open follows links), then renamed.
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,560 noenhanced\nset grid\nset key top right\n"
     << "set xlabel 'step'\n"
     << "set output 'loss.png.tmp'\nset title " << gp_quote("loss (" + run_dir + ")") << "\nset ylabel 'loss'\n"
     << "plot 'train.dat' using 1:2 with lines lw 2 title 'train'";
  if (n_val > 0) gp << ", 'val.dat' using 1:2 with linespoints pt 7 lw 2 title 'validation'";
  gp << "\nset output 'throughput.png.tmp'\nset title 'throughput'\nset ylabel '"
     << (tokens ? "tokens/s" : "samples/s") << "'\nset y2label 'exposed communication (%)'\nset y2tics\n"
     << "plot 'train.dat' using 1:3 with linespoints pt 7 title '" << (tokens ? "tokens/s" : "samples/s")
     << "', '' using 1:5 axes x1y2 with lines title 'exposed comm %'\nunset y2tics\nunset y2label\n"
     << "set output 'memory.png.tmp'\nset title 'peak resident memory per rank (max over ranks)'\n"
     << "set ylabel 'GiB'\nset yrange [0:*]\n"
     << "plot 'train.dat' using 1:4 with linespoints pt 7 title 'peak RSS'\nset output\n";
  io::write_file_atomic(plots + "/plots.gp", gp.str());
  std::vector<std::string> out;
  for (const char* png : kPlots) {
    const std::string p = plots + "/" + png;
    io::check_output_path(p, "plot");
    ::close(io::create_temp(p + ".tmp", "plot"));
    out.push_back(p);
  }
  const int rc = run_gnuplot(plots);
  if (rc != 0) {
    for (const std::string& p : out) ::unlink((p + ".tmp").c_str());
    throw UserError("gnuplot failed (exit " + std::to_string(rc) + "); see " + plots + "/gnuplot.log");
  }
  for (const std::string& p : out) io::commit_temp(p + ".tmp", p, "plot");
  return out;
}

}  // namespace shardtrain::report
