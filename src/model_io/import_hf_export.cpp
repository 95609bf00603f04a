// export_hf_directory: a checkpoint -> a Hugging Face model directory (config.json, safetensors
// shards and index, generation_config.json, the source's tokenizer files), written atomically.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model_io/import.h"
#include "shardtrain/model_io/inference_model.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/deck/deck.h"
#include "spec_from_json.h"

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

// The export's dtype: the flag; else bf16 for a bf16 run; else what the source had; else F32.
std::string choose_dtype(const std::string& flag, const deck::Deck* d, const model::ModelSpec& spec) {
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

}  // namespace

void export_hf_directory(const std::string& path, const std::string& out_dir, const HfExportOptions& o) {
  ST_USER_CHECK(!out_dir.empty(), "ckpt export: the output directory is empty");
  // The output: absent, or an empty directory (a link, a file, a non-empty directory: refused).
  struct stat ost {};
  // "ft-hf/" names the directory ft-hf: without the trailing separator its parent is where
  // the temporary directory goes.
  std::string out = fs::path(out_dir).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (::lstat(out.c_str(), &ost) == 0) {
    ST_USER_CHECK(S_ISDIR(ost.st_mode), "ckpt export: the output ", out_dir,
                  " exists and is not a directory (a file or a link); give a new directory name");
    std::error_code ec;
    ST_USER_CHECK(fs::is_empty(out, ec) && !ec, "ckpt export: the output directory ", out_dir,
                  " is not empty; give a new or empty directory");
  } else {
    io::check_output_writable(out, "ckpt export output");  // its directory there and writable, before any work
  }
  const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(path);
  const model::ModelSpec spec = model_spec_from_json(meta.model_spec_json, "checkpoint " + path);
  ST_USER_CHECK(spec.arch == "llama", "ckpt export --format hf: ", path, " holds a ", spec.arch,
                " model; a Hugging Face directory is written for the llama arch (Llama, Mistral, Qwen2)");
  std::unique_ptr<deck::Deck> d;
  try {
    // The deck as trained (checkpoint_deck would swap a Hugging Face source for the recorded
    // spec): its model.from_hf / init_from directory holds the tokenizer files to copy.
    d = std::make_unique<deck::Deck>(deck::Deck::parse(meta.deck_text, path + " (its resolved deck)", {}));
  } catch (const UserError& e) {
    log::warn(log::fmt("ckpt export: the checkpoint's deck is not readable (", e.what(), "); using the defaults"));
  }
  const std::string dtype = choose_dtype(o.dtype, d.get(), spec);
  const std::string config = model::hf_config_json(spec, torch_dtype_name(dtype));  // errors before any file
  // Where the tokenizer files come from: the flag, or the directory the model came from.
  std::string source = o.tokenizer_from;
  const bool named = !source.empty();
  if (!named && d) source = train::hf_model_source(*d);
  std::error_code ec;
  if (!source.empty() && !fs::is_directory(source, ec)) source = fs::path(source).parent_path().string();
  if (named) ST_USER_CHECK(fs::is_directory(source, ec), "--tokenizer-from ", o.tokenizer_from, ": not a directory");
  const std::vector<ckpt::ExpectedTensor> expected = expected_tensors(spec);

  // Everything goes into a fresh temporary directory beside the output, renamed into place at
  // the end: a failure leaves nothing behind, and no reader sees half a model.
  fs::path parent = fs::path(out).parent_path();
  if (parent.empty()) parent = ".";
  std::string tmpl = (parent / ("." + fs::path(out).filename().string() + ".tmp.XXXXXX")).string();
  ST_USER_CHECK(::mkdtemp(tmpl.data()) != nullptr, "ckpt export: cannot create a directory in ", parent.string(), ": ",
                io::errno_text(errno));
  const std::string tmp = tmpl;
  try {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::chmod(tmp.c_str(), 0777 & ~mask);  // mkdtemp's 0700 -> what mkdir would give
    std::vector<std::string> files = ckpt::write_safetensors_shards(path, tmp, expected, dtype, o.max_shard_bytes, o.allow_overflow);
    io::write_file_atomic(tmp + "/config.json", config);
    files.push_back("config.json");
    bool generation = false;
    std::vector<std::string> copied;
    if (!source.empty() && fs::is_directory(source, ec)) {
      for (const char* name : kCopiedFiles) {
        const fs::path from = fs::path(source) / name;
        if (!fs::exists(fs::symlink_status(from, ec))) continue;
        copy_regular_file(from.string(), tmp + "/" + name);
        copied.push_back(name);
        if (std::string(name) == "generation_config.json") generation = true;
      }
    } else if (!source.empty()) {
      log::warn(log::fmt("ckpt export: ", source, " (the model's source directory) is not there: no tokenizer files copied"));
    }
    if (!generation) {
      io::write_file_atomic(tmp + "/generation_config.json", model::hf_generation_config_json(spec));
      files.push_back("generation_config.json");
    }
    files.insert(files.end(), copied.begin(), copied.end());
    io::fsync_dir(tmp);
    // An empty output directory is replaced; anything that appeared meanwhile makes rename fail.
    if (std::rename(tmp.c_str(), out.c_str()) != 0)
      throw UserError("ckpt export: cannot move " + tmp + " to " + out_dir + ": " + io::errno_text(errno));
    io::fsync_dir(parent.string());
    std::printf("exported %s -> %s: %s (%s), %zu files:", path.c_str(), out_dir.c_str(),
                spec.hf_architecture.empty() ? "llama" : spec.hf_architecture.c_str(), dtype.c_str(), files.size());
    for (const std::string& f : files) std::printf(" %s", f.c_str());
    std::printf("\n");
    std::fflush(stdout);
  } catch (...) {
    fs::remove_all(tmp, ec);  // does not follow links inside
    throw;
  }
}

}  // namespace shardtrain::model_io
