// claim_run_dirs: locks, the run id decision, moving another run's files aside (rank 0).
#include "shardtrain/ckpt/run_dirs.h"

#include <filesystem>
#include <map>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/run_dir.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace fs = std::filesystem;

namespace shardtrain::ckpt {
namespace {

void make_dir(const std::string& dir, const char* key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ST_USER_CHECK(fs::is_directory(dir), "cannot create directory '", dir, "' (", key, ")",
                ec ? ": " + ec.message() : std::string());
}

bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

std::string label_of(const StepFile& f) { return f.run_id.empty() ? "no-run-id" : f.run_id; }

// "3 checkpoints of run X (newest step_12.h5)" for the error message.
std::string describe(const std::vector<StepFile>& files) {
  std::map<std::string, int> per_run;
  for (const auto& f : files) ++per_run[f.readable ? label_of(f) : "unreadable"];
  std::string s = std::to_string(files.size()) + " checkpoint" + (files.size() == 1 ? "" : "s") + " (";
  bool first = true;
  for (const auto& [run, n] : per_run) {
    s += (first ? "" : ", ") + std::to_string(n) + " of " +
         (run == "no-run-id" ? std::string("a run without an id") : run == "unreadable" ? "no readable owner" : "run " + run);
    first = false;
  }
  return s + "; newest " + fs::path(files.front().path).filename().string() + ")";
}

// The files and folders a run writes in run.out_dir besides its checkpoints (one list: what
// move_aside moves with them). The lock and previous-runs/ stay.
std::vector<std::string> run_outputs(const std::string& out_dir, const std::string& metrics_file) {
  std::vector<std::string> found;
  for (const std::string& name : {metrics_file, std::string("summary.json"), std::string("deck.resolved.toml"),
                                  std::string("samples.jsonl"), std::string("eval.json"), std::string("plots")}) {
    if (name.empty()) continue;
    const fs::path p = fs::path(out_dir) / name;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(p, ec);
    if (fs::is_regular_file(st) || (name == "plots" && fs::is_directory(st))) found.push_back(p.string());
  }
  return found;
}

// checkpoint.previous_run = move_aside: each earlier run moves whole to
// <out_dir>/previous-runs/<run id>/ (its outputs there, its checkpoints under the same relative
// path as checkpoint.dir has in out_dir, by default checkpoints/). A checkpoint.dir outside
// out_dir keeps its own <checkpoint.dir>/previous-runs/<run id>/ (a rename cannot cross file
// systems). `latest` and run.json go with the directory's run, `owner`.
void move_previous_runs(const RunDirsRequest& req, const std::string& owner, const std::vector<StepFile>& files,
                        const std::vector<std::string>& outputs, RunDirs& out) {
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& f : files) groups[label_of(f)].push_back(f.path);
  for (const char* name : {"latest", "run.json"}) {
    const fs::path p = fs::path(req.checkpoint_dir) / name;
    if (!files.empty() && fs::is_regular_file(p)) groups[owner].push_back(p.string());
  }
  const fs::path rel = fs::path(req.checkpoint_dir).lexically_normal().lexically_relative(fs::path(req.out_dir).lexically_normal());
  const bool inside = !rel.empty() && *rel.begin() != "..";
  groups[owner];  // the owner's folder also receives the outputs
  for (auto& [label, paths] : groups) {
    const std::string to = fresh_previous_run_dir(req.out_dir, label);
    std::string ckpt_to = !inside ? fresh_previous_run_dir(req.checkpoint_dir, label)
                                  : (rel == "." ? to : (fs::path(to) / rel).string());
    if (label == owner && !outputs.empty()) {
      move_into(to, outputs);
      out.notes += "# moved the previous run " + label + "'s outputs to " + to + "\n";
    }
    if (!paths.empty()) {
      move_into(ckpt_to, paths);
      out.notes += "# moved " + std::to_string(paths.size()) + " checkpoint file(s) of run " + label + " to " + ckpt_to +
                   " (checkpoint.previous_run = move_aside)\n";
    }
    for (const std::string& p : paths)
      if (p == req.resume) out.resume = (fs::path(ckpt_to) / fs::path(p).filename()).string();
  }
}

}  // namespace

RunDirs claim_run_dirs(const RunDirsRequest& req, MPI_Comm world) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  RunDirs out;
  out.resume = req.resume;
  runtime::run_agreed(world, [&] {
    if (rank != 0) return;
    make_dir(req.out_dir, "run.out_dir");
    make_dir(req.checkpoint_dir, "checkpoint.dir");
    out.locks.push_back(DirLock::acquire(req.out_dir, "run.out_dir"));
    if (!same_dir(req.out_dir, req.checkpoint_dir))
      out.locks.push_back(DirLock::acquire(req.checkpoint_dir, "checkpoint.dir"));

    const std::optional<RunRecord> record = read_run_record(req.checkpoint_dir);
    const std::vector<StepFile> files = list_step_files(req.checkpoint_dir);
    bool start_new = false;
    std::string why_new;
    if (req.resume == "auto") {
      if (record) {
        out.run_id = record->run_id;
        size_t foreign = 0;
        for (const auto& f : files) foreign += !f.run_id.empty() && f.run_id != out.run_id;
        if (foreign)
          out.notes += "# " + std::to_string(foreign) + " checkpoint(s) of other runs in " + req.checkpoint_dir +
                       " are ignored (this directory belongs to run " + out.run_id + ")\n";
      } else {
        // No record: a directory from before run ids, or one whose record was removed. The
        // newest checkpoint with an owner names the run; files without one are candidates too.
        for (const auto& f : files)
          if (f.readable && !f.run_id.empty()) {
            out.run_id = f.run_id;
            break;
          }
        if (out.run_id.empty()) {
          out.run_id = ckpt::new_run_id();
          out.new_run = true;
        }
        write_run_record(req.checkpoint_dir, this_process_record(out.run_id));
      }
    } else if (req.resume == "never") {
      start_new = true;
      why_new = "checkpoint.resume = never starts a new run";
    } else {
      const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(req.resume);
      if (record && !meta.run_id.empty() && meta.run_id == record->run_id) {
        out.run_id = record->run_id;
      } else {
        start_new = true;
        why_new = "checkpoint.resume = " + req.resume + " starts a new run from that file (it is not of the run " +
                  (record ? record->run_id + " " : std::string()) + "that owns " + req.checkpoint_dir + ")";
      }
    }
    if (!start_new) return;

    out.run_id = ckpt::new_run_id();
    out.new_run = true;
    const std::vector<std::string> outputs = run_outputs(req.out_dir, req.metrics_file);
    if (!files.empty() && req.previous_run != "move_aside")
      throw UserError(why_new + ", but " + req.checkpoint_dir + " holds " + describe(files) +
                      ", which it would mix with. To continue that run: checkpoint.resume = \"auto\". To start "
                      "a new run here and keep them: --set checkpoint.previous_run=move_aside (the whole run moves "
                      "to " + req.out_dir + "/previous-runs/<its run id>/). Or give this run another run.name or "
                      "run.out_dir / checkpoint.dir");
    if (req.previous_run == "move_aside" && (!files.empty() || !outputs.empty()))
      move_previous_runs(req, record ? record->run_id : files.empty() ? "no-run-id" : label_of(files.front()), files,
                         outputs, out);
    write_run_record(req.checkpoint_dir, this_process_record(out.run_id));
  });
  runtime::broadcast(world, out.run_id, 0, "setup.run_dirs");
  runtime::broadcast(world, out.resume, 0, "setup.run_dirs");
  runtime::broadcast(world, out.notes, 0, "setup.run_dirs");
  runtime::broadcast(world, out.new_run, 0, "setup.run_dirs");
  return out;
}

}  // namespace shardtrain::ckpt
