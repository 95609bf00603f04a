// HfOutput and the files beside a Hugging Face directory's weights (see hf_output.h).
#include "hf_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "shardtrain/model/hf_config.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"

namespace shardtrain::model_io {
namespace {

namespace fs = std::filesystem;

// The files of a model directory that are not weights or config, copied as they are.
const char* const kCopiedFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                    "special_tokens_map.json", "generation_config.json"};
constexpr uint64_t kMaxCopiedBytes = uint64_t{1} << 30;

// Copies `from` (a regular file, opened without following a link: a file planted in a
// downloaded directory cannot make the export read elsewhere) to the new file `to`.
void copy_regular_file(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (in < 0)
    throw UserError(from + ": cannot open (" + io::errno_text(errno) + (errno == ELOOP ? "; a symbolic link is not copied" : "") + ")");
  std::unique_ptr<int, void (*)(int*)> guard(new int(in), [](int* f) { ::close(*f); delete f; });
  struct stat st {};
  if (::fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) throw UserError(from + ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxCopiedBytes) throw UserError(from + ": larger than 1 GiB");
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t r = ::read(in, data.data() + got, data.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw UserError(from + ": read failed");
    got += static_cast<size_t>(r);
  }
  io::write_file_atomic(to, data);
}

}  // namespace

HfOutput::HfOutput(const std::string& out_dir, std::string what) : what_(std::move(what)) {
  ST_USER_CHECK(!out_dir.empty(), what_, ": the output directory is empty");
  // "ft-hf/" names the directory ft-hf: without the trailing separator its parent is where
  // the temporary directory goes.
  out_ = fs::path(out_dir).lexically_normal().string();
  while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
  // The output: absent, or an empty directory (a link, a file, a non-empty directory: refused).
  struct stat ost {};
  if (::lstat(out_.c_str(), &ost) == 0) {
    ST_USER_CHECK(S_ISDIR(ost.st_mode), what_, ": the output ", out_dir,
                  " exists and is not a directory (a file or a link); give a new directory name");
    std::error_code ec;
    ST_USER_CHECK(fs::is_empty(out_, ec) && !ec, what_, ": the output directory ", out_dir,
                  " is not empty; give a new or empty directory");
  } else {
    io::check_output_writable(out_, what_ + " output");  // its directory there and writable, before any work
  }
}

void HfOutput::create() {
  fs::path parent = fs::path(out_).parent_path();
  if (parent.empty()) parent = ".";
  std::string tmpl = (parent / ("." + fs::path(out_).filename().string() + ".tmp.XXXXXX")).string();
  ST_USER_CHECK(::mkdtemp(tmpl.data()) != nullptr, what_, ": cannot create a directory in ", parent.string(), ": ",
                io::errno_text(errno));
  tmp_ = tmpl;
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmp_.c_str(), 0777 & ~mask);  // mkdtemp's 0700 -> what mkdir would give
}

void HfOutput::commit() {
  io::fsync_dir(tmp_);
  // An empty output directory is replaced; anything that appeared meanwhile makes rename fail.
  if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
    throw UserError(what_ + ": cannot move " + tmp_ + " to " + out_ + ": " + io::errno_text(errno));
  fs::path parent = fs::path(out_).parent_path();
  io::fsync_dir(parent.empty() ? "." : parent.string());
  tmp_.clear();
}

void HfOutput::abandon() noexcept {
  if (tmp_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // does not follow links inside
  tmp_.clear();
}

std::string choose_hf_dtype(const std::string& flag, const deck::Deck* d, const model::ModelSpec& spec) {
  if (flag == "fp32" || flag == "F32") return "F32";
  if (flag == "bf16" || flag == "BF16") return "BF16";
  if (flag == "fp16" || flag == "F16") return "F16";
  ST_USER_CHECK(flag == "auto" || flag.empty(), "--dtype ", flag, " is not one of auto, fp32, bf16, fp16");
  if (d && d->get_string("fsdp.param_dtype") == "bf16") return "BF16";
  if (spec.torch_dtype == "bfloat16") return "BF16";
  if (spec.torch_dtype == "float16") return "F16";
  return "F32";
}

const char* torch_dtype_name(const std::string& st) {
  return st == "BF16" ? "bfloat16" : st == "F16" ? "float16" : "float32";
}

std::vector<std::string> write_hf_side_files(const std::string& dir, const model::ModelSpec& spec,
                                             const std::string& dtype, std::string source, bool named) {
  std::vector<std::string> files;
  io::write_file_atomic(dir + "/config.json", model::hf_config_json(spec, torch_dtype_name(dtype)));
  files.push_back("config.json");
  std::error_code ec;
  if (!source.empty() && !fs::is_directory(source, ec)) source = fs::path(source).parent_path().string();
  if (named) ST_USER_CHECK(fs::is_directory(source, ec), "--tokenizer-from ", source, ": not a directory");
  bool generation = false;
  std::vector<std::string> copied;
  if (!source.empty() && fs::is_directory(source, ec)) {
    for (const char* name : kCopiedFiles) {
      const fs::path from = fs::path(source) / name;
      if (!fs::exists(fs::symlink_status(from, ec))) continue;
      copy_regular_file(from.string(), dir + "/" + name);
      copied.push_back(name);
      if (std::string(name) == "generation_config.json") generation = true;
    }
  } else if (!source.empty()) {
    log::warn(log::fmt("ckpt export: ", source, " (the model's source directory) is not there: no tokenizer files copied"));
  }
  if (!generation) {
    io::write_file_atomic(dir + "/generation_config.json", model::hf_generation_config_json(spec));
    files.push_back("generation_config.json");
  }
  files.insert(files.end(), copied.begin(), copied.end());
  return files;
}

}  // namespace shardtrain::model_io
