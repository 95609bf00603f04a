// read_safetensors_header and load_safetensors (each rank preads only its shard slices).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "plan.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::ckpt {
namespace {

struct Fd {
  int fd = -1;
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

}  // namespace

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path) {
  const std::string what = "safetensors " + path;
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  if (f.fd < 0) throw UserError(what + ": cannot open");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw UserError(what + ": cannot stat");
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
  return out;
}

void load_safetensors(const std::string& path, fsdp::Engine& engine, MPI_Comm world) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  std::map<std::string, std::pair<fsdp::FlatParam*, const fsdp::ParamSlot*>> params;
  for (fsdp::FlatParam* fp : flats)
    for (const auto& s : fp->slots) params[s.name] = {fp, &s};
  std::map<std::string, SafetensorsEntry> entries;
  // Check everything first; then every rank reads only what its shards cover.
  runtime::run_agreed(world, [&] {
    for (auto& e : read_safetensors_header(path)) entries[e.name] = e;
    std::vector<std::string> extra;
    for (auto& [name, e] : entries)
      if (!params.count(name) && name != "lm_head.weight") extra.push_back(name);
    for (auto& [name, ps] : params) {
      auto it = entries.find(name);
      if (it == entries.end()) throw UserError("safetensors " + path + ": tensor '" + name + "' is missing");
      if (it->second.dtype != "F32")
        throw UserError("safetensors " + path + ": tensor '" + name + "' is " + it->second.dtype + ", need F32");
      if (it->second.shape != ps.second->shape)
        throw UserError("safetensors " + path + ": tensor '" + name + "' has another shape than the model's");
    }
    if (!extra.empty() && rank == 0)
      log::warn(log::fmt("safetensors ", path, ": ", extra.size(), " tensors are not model parameters, ignored (first: ",
                         extra[0], ")"));
  });
  runtime::run_agreed(world, [&] {
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY);
    if (f.fd < 0) throw UserError("safetensors " + path + ": cannot open");
    for (fsdp::FlatParam* fp : flats) {
      const int64_t sb = static_cast<int64_t>(fp->shard_rank) * fp->shard_numel, se = sb + fp->shard_numel;
      float* master = fp->master.data_ptr<float>();
      for (const auto& s : fp->slots) {
        int64_t a = std::max(sb, s.offset), b = std::min(se, s.offset + s.numel);
        if (a >= b) continue;
        pread_all(f.fd, master + (a - sb), (b - a) * 4, entries[s.name].begin + (a - s.offset) * 4, path);
      }
    }
  });
  engine.mark_params_updated();
}

}  // namespace shardtrain::ckpt
