// read_safetensors_header and load_safetensors (each rank preads only its shard slices).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "plan.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::ckpt {
namespace {

// A Hugging Face index lists tensor -> file names: a few hundred KB even for big models.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  ~Fd() { if (fd >= 0) ::close(fd); }
};

void pread_all(int fd, void* dst, int64_t n, int64_t off, const std::string& path) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)), off);
    if (got <= 0) throw UserError("safetensors " + path + ": read failed at byte " + std::to_string(off));
    p += got;
    n -= got;
    off += got;
  }
}

int dtype_bytes(const std::string& d) {
  static const std::map<std::string, int> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                   {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},   {"BOOL", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

// Floating-point dtypes a model can be imported from (converted to the fp32 masters on read;
// Hugging Face checkpoints are mostly BF16 or F16).
const std::map<std::string, at::ScalarType>& float_dtypes() {
  static const std::map<std::string, at::ScalarType> m = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}};
  return m;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path) {
  const std::string what = "safetensors " + path;
  // A regular file only: open() of a FIFO would wait for a writer forever.
  struct stat pre {};
  if (::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode))
    throw UserError(what + (S_ISDIR(pre.st_mode) ? ": is a directory" : ": is not a regular file (a FIFO, device or socket)") +
                    "; give a .safetensors file, an index .json or a model directory");
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) throw UserError(what + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw UserError(what + ": cannot stat");
  if (!S_ISREG(st.st_mode)) throw UserError(what + ": not a regular file");
  const int64_t size = st.st_size;
  if (size < 8) throw UserError(what + ": shorter than the 8-byte header length");
  unsigned char le[8];
  pread_all(f.fd, le, 8, 0, path);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (hlen > static_cast<uint64_t>(size - 8) || hlen > (uint64_t{100} << 20))
    throw UserError(what + ": header length " + std::to_string(hlen) + " does not fit the file");
  std::string text(hlen, '\0');
  pread_all(f.fd, text.data(), static_cast<int64_t>(hlen), 8, path);
  check_json_depth(text, kMaxJsonDepth, what + ": header");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw UserError(what + ": header is not a JSON object");
  const int64_t base = 8 + static_cast<int64_t>(hlen);
  std::vector<SafetensorsEntry> out;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string tw = what + ": tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      throw UserError(tw + ": entry needs dtype, shape and data_offsets [begin, end]");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    int eb = dtype_bytes(e.dtype);
    if (eb == 0) throw UserError(tw + ": unknown dtype " + e.dtype);
    int64_t numel = 1;
    if (v["shape"].size() > static_cast<size_t>(kMaxRank)) throw UserError(tw + ": too many dimensions");
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
        throw UserError(tw + ": bad dimension " + d.dump());
      int64_t x = d.get<int64_t>();
      if (x != 0 && numel > kMaxDim / x) throw UserError(tw + ": absurd size");
      numel *= x;
      e.shape.push_back(x);
    }
    auto& o = v["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) throw UserError(tw + ": bad data_offsets");
    uint64_t b = o[0].get<uint64_t>(), en = o[1].get<uint64_t>();
    if (b > en || en > static_cast<uint64_t>(size - base))
      throw UserError(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                      ") outside the file's data (" + std::to_string(size - base) + " bytes; truncated?)");
    if (static_cast<int64_t>(en - b) != numel * eb)
      throw UserError(tw + ": " + std::to_string(en - b) + " bytes for shape " + v["shape"].dump() + " of " + e.dtype);
    e.begin = base + static_cast<int64_t>(b);
    e.end = base + static_cast<int64_t>(en);
    out.push_back(std::move(e));
  }
  // The data buffer is the tensors back to back, as the format requires: sorted by offset,
  // each begins where the previous ended (no overlap: two names must not share bytes; no
  // gap) and the last ends at the end of the file.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : out) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t at = base;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < at)
      throw UserError(what + ": tensor '" + e->name + "' (bytes [" + std::to_string(e->begin - base) + ", " +
                      std::to_string(e->end - base) + ")) overlaps tensor '" + (prev ? prev->name : "") +
                      "' (a crafted or damaged header)");
    if (e->begin > at)
      throw UserError(what + ": " + std::to_string(e->begin - at) + " bytes before tensor '" + e->name +
                      "' belong to no tensor (the data must be the tensors back to back)");
    at = e->end;
    prev = e;
  }
  if (at != size)
    throw UserError(what + ": " + std::to_string(size - at) +
                    " bytes at the end of the file belong to no tensor (the data must be the tensors back to back)");
  return out;
}

std::vector<std::string> safetensors_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::string index = path;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec)))
    throw UserError("safetensors " + path + ": no such file or directory; give a .safetensors file, a "
                    "model.safetensors.index.json, or a directory that holds model.safetensors or the index (a "
                    "Hugging Face model directory)");
  if (fs::is_directory(path)) {
    // transformers' order (modeling_utils: SAFE_WEIGHTS_NAME before SAFE_WEIGHTS_INDEX_NAME):
    // model.safetensors wins, so a directory holding both loads the same model here and there.
    const fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(fs::symlink_status(single, ec))) return {single.string()};
    index = (fs::path(path) / "model.safetensors.index.json").string();
    if (!fs::exists(fs::symlink_status(index, ec)))
      throw UserError("safetensors " + path + ": a directory without model.safetensors or model.safetensors.index.json");
  } else if (path.size() < 5 || path.compare(path.size() - 5, 5, ".json") != 0) {
    return {path};
  }
  std::string text;
  try {
    text = read_small_file(index, kMaxIndexBytes, "safetensors index");
  } catch (const UserError& e) {
    throw UserError("safetensors index " + std::string(e.what()));
  }
  nlohmann::json j;
  try {
    check_json_depth(text, kMaxJsonDepth, "safetensors index " + index);
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw UserError("safetensors index " + index + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw UserError("safetensors index " + index + ": needs an object \"weight_map\": {tensor: file}");
  std::set<std::string> files;
  for (auto& [name, f] : j["weight_map"].items()) {
    if (!f.is_string() || f.get<std::string>().find('/') != std::string::npos)
      throw UserError("safetensors index " + index + ": weight_map[\"" + name + "\"] must be a file name in the same directory");
    files.insert((fs::path(index).parent_path() / f.get<std::string>()).string());
  }
  if (files.empty()) throw UserError("safetensors index " + index + ": weight_map is empty");
  return {files.begin(), files.end()};
}

bool has_safetensors_weights(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(fs::symlink_status(fs::path(dir) / name, ec))) return true;
  return false;
}

int64_t safetensors_float_values(const std::string& path) {
  int64_t values = 0;
  for (const std::string& f : safetensors_files(path))
    for (const SafetensorsEntry& e : read_safetensors_header(f)) {
      if (!float_dtypes().count(e.dtype)) continue;
      // Each tensor lies inside its file (read_safetensors_header): the sum is at most the files' bytes.
      values += (e.end - e.begin) / dtype_bytes(e.dtype);
    }
  return values;
}

SafetensorsMatch match_safetensors(const std::string& path, const std::vector<ExpectedTensor>& expected,
                                   const std::string& what) {
  SafetensorsMatch m;
  m.files = safetensors_files(path);
  for (size_t i = 0; i < m.files.size(); ++i)
    for (auto& e : read_safetensors_header(m.files[i])) {
      if (m.entries.count(e.name))
        throw UserError(what + " " + path + ": tensor '" + e.name + "' is in both " + m.files[m.entries[e.name].first] +
                        " and " + m.files[i]);
      m.entries[e.name] = {i, e};
    }
  std::set<std::string> wanted;
  for (const ExpectedTensor& t : expected) {
    wanted.insert(t.name);
    auto it = m.entries.find(t.name);
    if (it == m.entries.end()) throw UserError(what + " " + path + ": tensor '" + t.name + "' is missing");
    const SafetensorsEntry& e = it->second.second;
    if (!float_dtypes().count(e.dtype))
      throw UserError(what + " " + path + ": tensor '" + t.name + "' is " + e.dtype +
                      ", need a floating-point dtype (F32, BF16, F16, F64)");
    if (e.shape != t.shape)
      throw UserError(what + " " + path + ": tensor '" + t.name + "' has shape " + shape_text(e.shape) +
                      ", the model's is " + shape_text(t.shape) + " (is the deck's model the file's?)");
  }
  for (const auto& [name, e] : m.entries)
    if (!wanted.count(name)) m.extra.push_back(name);
  return m;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  SafetensorsMatch m = match_safetensors(path, {});
  files_ = std::move(m.files);
  entries_ = std::move(m.entries);
  fds_.assign(files_.size(), -1);
}

SafetensorsReader::~SafetensorsReader() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second.second;
}

at::Tensor SafetensorsReader::read(const std::string& name, int64_t first, int64_t n) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError("safetensors " + path_ + ": tensor '" + name + "' is missing");
  const auto& [fi, e] = it->second;
  if (!float_dtypes().count(e.dtype))
    throw UserError("safetensors " + path_ + ": tensor '" + name + "' is " + e.dtype + ", need a floating-point dtype");
  const int64_t eb = dtype_bytes(e.dtype);
  ST_CHECK(first >= 0 && n >= 0 && e.begin + (first + n) * eb <= e.end, "safetensors read of ", name, " [", first, ", ",
           first + n, ") outside the tensor");
  int& fd = fds_[fi];
  if (fd < 0) {
    fd = ::open(files_[fi].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw UserError("safetensors " + files_[fi] + ": cannot open");
  }
  at::Tensor raw = at::empty({n}, at::TensorOptions().dtype(float_dtypes().at(e.dtype)));
  if (n > 0) pread_all(fd, raw.data_ptr(), n * eb, e.begin + first * eb, files_[fi]);
  return raw.to(at::kFloat);
}

void load_safetensors(const std::string& path, fsdp::Engine& engine, MPI_Comm world, const TensorPick& pick) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  // The wanted parameters, by their names in the file.
  std::map<std::string, std::pair<fsdp::FlatParam*, const fsdp::ParamSlot*>> params;
  std::map<const fsdp::ParamSlot*, std::string> file_name;
  for (fsdp::FlatParam* fp : flats)
    for (const auto& s : fp->slots()) {
      if (pick.wanted && !pick.wanted(s.name)) continue;
      const std::string n = pick.in_file ? pick.in_file(s.name) : s.name;
      params[n] = {fp, &s};
      file_name[&s] = n;
    }
  // Check everything first; then every rank reads only what its shards cover.
  std::vector<ExpectedTensor> expected;
  for (const auto& [name, ps] : params) expected.push_back({name, ps.second->shape});
  SafetensorsMatch match;
  runtime::run_agreed(world, [&] {
    match = match_safetensors(path, expected, pick.what);
    // "lm_head.weight" of a model whose head is tied (GPT-2) is no parameter: skipped quietly.
    std::vector<std::string> extra;
    for (const std::string& n : match.extra)
      if (pick.extras_are_errors || n != "lm_head.weight") extra.push_back(n);
    if (!extra.empty() && pick.extras_are_errors)
      throw UserError(pick.what + " " + path + ": tensor '" + extra[0] + "' fits no parameter this run takes from it" +
                      (extra.size() > 1 ? " (and " + std::to_string(extra.size() - 1) + " more)" : std::string()));
    if (!extra.empty() && rank == 0)
      log::warn(log::fmt(pick.what, " ", path, ": ", extra.size(), " tensors are not model parameters, ignored (first: ",
                         extra[0], ")"));
  });
  const std::vector<std::string>& files = match.files;
  std::map<std::string, std::pair<size_t, SafetensorsEntry>>& entries = match.entries;
  runtime::run_agreed(world, [&] {
    std::vector<Fd> fds(files.size());
    for (fsdp::FlatParam* fp : flats) {
      if (std::none_of(fp->slots().begin(), fp->slots().end(),
                       [&](const fsdp::ParamSlot& s) { return file_name.count(&s) > 0; }))
        continue;  // nothing of this flat is read
      const int64_t sb = static_cast<int64_t>(fp->shard_rank()) * fp->shard_numel(), se = sb + fp->shard_numel();
      // Shards in device memory, frozen ones kept in bf16/fp16 and NF4 ones: read into an fp32 host
      // copy (its padding stays as it was), written back (NF4: quantized, one flat at a time).
      const bool on_host = !fp->nf4() && fp->master().device().is_cpu() && fp->master().scalar_type() == at::kFloat;
      at::Tensor host = on_host ? fp->write_master() : fp->shard_values().to(at::kCPU, at::kFloat);
      float* master = host.data_ptr<float>();
      for (const auto& s : fp->slots()) {
        int64_t a = std::max(sb, s.offset), b = std::min(se, s.offset + s.numel);
        if (a >= b || !file_name.count(&s)) continue;
        const auto& [fi, e] = entries[file_name[&s]];
        const std::string& file = files[fi];
        if (fds[fi].fd < 0) {
          fds[fi].fd = ::open(file.c_str(), O_RDONLY);
          if (fds[fi].fd < 0) throw UserError("safetensors " + file + ": cannot open");
        }
        const int fd = fds[fi].fd;
        float* dst = master + (a - sb);
        if (e.dtype == "F32") {
          pread_all(fd, dst, (b - a) * 4, e.begin + (a - s.offset) * 4, file);
        } else {
          // Other float dtypes: read this rank's slice as stored, widen into the master shard.
          const at::ScalarType st = float_dtypes().at(e.dtype);
          const int64_t eb = dtype_bytes(e.dtype);
          at::Tensor raw = at::empty({b - a}, at::TensorOptions().dtype(st));
          pread_all(fd, raw.data_ptr(), (b - a) * eb, e.begin + (a - s.offset) * eb, file);
          at::from_blob(dst, {b - a}, at::TensorOptions().dtype(at::kFloat)).copy_(raw);
        }
        // Weights that are NaN/Inf would train nothing: refuse them where they are found.
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < b - a; ++i)
          if (!std::isfinite(dst[i])) {
            if (first < 0) first = a - s.offset + i;
            ++bad;
          }
        if (bad)
          throw UserError("safetensors " + file + ": tensor '" + s.name + "' holds non-finite values (NaN or Inf; " +
                          std::to_string(bad) + " in this rank's part, the first at flat index " +
                          std::to_string(first) + ")");
      }
      if (!on_host) fp->write_values(host);
    }
  });
  engine.finish_nf4();  // NF4 statistics double-quantized over the shard groups (after every read succeeded)
}

}  // namespace shardtrain::ckpt
