// Run ids, the run record, DirLock and move_aside: directory ownership in plain POSIX calls.
#include "shardtrain/ckpt/attributes.h"
#include "shardtrain/ckpt/run_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "file_checks.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/small_file.h"
#include "shardtrain/util/log.h"

namespace fs = std::filesystem;

namespace shardtrain::ckpt {
namespace {

constexpr const char* kRecordName = "run.json";
constexpr const char* kLockName = "shardtrain.lock";
constexpr size_t kSmallFileCap = 64 << 10;  // run.json and lock files are a few hundred bytes

std::string utc_now(const char* fmt) {
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

std::string host_name() {
  char h[256] = {0};
  if (gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

std::string describe_holder(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    std::string s = "host " + j.value("host", std::string("?")) + " pid " + std::to_string(j.value("pid", int64_t{0}));
    const std::string job = j.value("job_id", std::string());
    if (!job.empty()) s += " (Slurm job " + job + ")";
    return s + " since " + j.value("since", std::string("?"));
  } catch (const std::exception&) {
    return "an unknown holder";
  }
}

// The holder a lock file names is a live process on this host.
bool holder_alive_here(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("host", std::string()) != host_name()) return false;
    const int64_t pid = j.value("pid", int64_t{0});
    return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
  } catch (const std::exception&) {
    return false;
  }
}

bool holder_on_other_host(const std::string& text) {
  try {
    return nlohmann::json::parse(text).value("host", std::string()) != host_name();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::string new_run_id() {
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "%08x", static_cast<unsigned>(rd()));
  return utc_now("%Y%m%dT%H%M%SZ") + "-" + tail;
}

RunRecord this_process_record(const std::string& run_id) {
  RunRecord r;
  r.run_id = run_id;
  r.started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  r.host = host_name();
  r.pid = static_cast<int64_t>(::getpid());
  if (const char* j = std::getenv("SLURM_JOB_ID")) r.job_id = j;
  return r;
}

std::optional<RunRecord> read_run_record(const std::string& dir) {
  const std::string path = (fs::path(dir) / kRecordName).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const std::string text = read_small_file(path, kSmallFileCap, "run record");
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    RunRecord r;
    r.run_id = j.at("run_id").get<std::string>();
    r.started = j.value("started", std::string());
    r.host = j.value("host", std::string());
    r.job_id = j.value("job_id", std::string());
    r.pid = j.value("pid", int64_t{0});
    if (r.run_id.empty() || r.run_id.size() > 128) throw UserError("bad run_id");
    return r;
  } catch (const std::exception& e) {
    throw UserError(path + ": not a shardtrain run record (" + e.what() +
                    "); it says which run owns the checkpoints here: remove it only if no run does");
  }
}

void write_run_record(const std::string& dir, const RunRecord& r) {
  nlohmann::json j = {{"run_id", r.run_id}, {"started", r.started}, {"host", r.host},
                      {"pid", r.pid},       {"job_id", r.job_id}};
  io::write_file_atomic((fs::path(dir) / kRecordName).string(), j.dump(2) + "\n");
}

std::vector<StepFile> list_step_files(const std::string& dir) {
  std::vector<StepFile> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex re("^step_([0-9]{1,18})\\.h5$");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    // lstat: a symbolic link planted under a checkpoint's name is no checkpoint of anyone's.
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
    if (!std::regex_match(name, m, re)) continue;
    StepFile f;
    f.step = std::stoll(m[1]);
    f.path = e.path().string();
    try {
      H5Id file = open_checkpoint(f.path, MPI_COMM_NULL);
      if (has_attr(file, attr::kRunId)) f.run_id = read_attr_string(file, attr::kRunId, f.path);
      if (has_attr(file, attr::kSaveSeq)) f.save_seq = read_attr_int64(file, attr::kSaveSeq, f.path);
      f.readable = true;
    } catch (const Error&) {
      f.readable = false;  // truncated, not HDF5, another format: nobody's we can name
    }
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const StepFile& a, const StepFile& b) {
    return a.save_seq != b.save_seq ? a.save_seq > b.save_seq : a.step > b.step;
  });
  return out;
}

std::unique_ptr<DirLock> DirLock::acquire(const std::string& dir, const std::string& what) {
  const std::string path = (fs::path(dir) / kLockName).string();
  // Never through a planted link, never a FIFO or device (io::open_in_place).
  int fd = io::open_in_place(path, O_RDWR, "the lock file of " + what);
  if (fd < 0)
    throw UserError("cannot create the lock file " + path + " of " + what + ": " + std::strerror(errno));
  auto content = [&] {
    std::string s(kSmallFileCap, '\0');
    ssize_t n = ::pread(fd, s.data(), s.size(), 0);
    s.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
    return s;
  };
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // the whole file
  bool locked = ::fcntl(fd, F_SETLK, &fl) == 0;
  const int err = errno;
  const std::string previous = content();
  if (!locked) {
    if (err == EAGAIN || err == EACCES) {
      ::close(fd);
      throw UserError(what + " " + dir + " is in use by another job: " +
                      (previous.empty() ? std::string("a process that has not yet written its name")
                                        : describe_holder(previous)) +
                      " holds " + path + ". Wait for it to end, or give this run another run.out_dir / checkpoint.dir");
    }
    // No record locks on this filesystem (ENOLCK, EOPNOTSUPP, ...): the file's content decides.
    if (!previous.empty() && (holder_alive_here(previous) || holder_on_other_host(previous))) {
      ::close(fd);
      throw UserError(what + " " + dir + " is in use by another job: " + describe_holder(previous) + " (" + path +
                      "; this filesystem has no file locks (" + std::strerror(err) +
                      "), so the file alone says so: delete it if that job is no longer running)");
    }
  }
  if (!previous.empty())
    log::warn("taking over " + path + ", left by " + describe_holder(previous) + ", which no longer holds it");
  const RunRecord me = this_process_record("");
  nlohmann::json j = {{"host", me.host}, {"pid", me.pid}, {"job_id", me.job_id}, {"since", me.started}};
  if (::ftruncate(fd, 0) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError(path + ": cannot write the lock file: " + std::strerror(e));
  }
  try {
    std::string text = j.dump() + "\n";
    ssize_t n = ::pwrite(fd, text.data(), text.size(), 0);
    if (n != static_cast<ssize_t>(text.size())) throw IoError(path + ": cannot write the lock file: " + std::strerror(errno));
    ::fsync(fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return std::unique_ptr<DirLock>(new DirLock(path, fd));
}

DirLock::~DirLock() {
  // Emptied, so the next job sees a clean hand-over; the record lock goes with the close.
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::close(fd_);
}

std::string fresh_previous_run_dir(const std::string& dir, const std::string& label) {
  const fs::path base = fs::path(dir) / "previous-runs" / label;
  fs::path target = base;
  std::error_code ec;
  for (int i = 2; fs::exists(target, ec); ++i) target = base.string() + "." + std::to_string(i);
  return target.string();
}

void move_into(const std::string& target, const std::vector<std::string>& paths) {
  std::error_code ec;
  fs::create_directories(target, ec);
  if (ec) throw IoError("cannot create " + target + ": " + ec.message());
  std::vector<std::string> parents;
  for (const std::string& f : paths) {
    const fs::path to = fs::path(target) / fs::path(f).filename();
    // A name already there is never replaced (the target is fresh, or a folder made just now).
    if (fs::exists(fs::symlink_status(to, ec))) throw IoError("cannot move " + f + " to " + to.string() + ": it exists");
    if (std::rename(f.c_str(), to.c_str()) != 0)
      throw IoError("cannot move " + f + " to " + to.string() + ": " + std::strerror(errno));
    parents.push_back(fs::path(f).parent_path().string());
  }
  io::fsync_dir(target);
  std::sort(parents.begin(), parents.end());
  parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
  for (const std::string& p : parents) io::fsync_dir(p.empty() ? "." : p);
}

std::string move_aside(const std::string& dir, const std::string& label, const std::vector<std::string>& files) {
  const std::string target = fresh_previous_run_dir(dir, label);
  move_into(target, files);
  return target;
}

}  // namespace shardtrain::ckpt
