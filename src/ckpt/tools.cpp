// inspect_checkpoint, consolidate_checkpoint, export_safetensors: one-process file tools.
#include "shardtrain/ckpt/tools.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>

#include "file_checks.h"
#include "plan.h"
#include "write_guard.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"

namespace shardtrain::ckpt {
namespace {

struct Entry {
  std::string path;
  DatasetCheck check;
};

// Every dataset of the checkpoint with its validated shape (same order as verify).
std::vector<Entry> list_datasets(hid_t file, const std::string& path) {
  std::vector<Entry> out;
  for (const auto& n : list_links(file, kModelGroup))
    out.push_back({model_path(n), check_dataset(file, path, model_path(n), Elem::F32, nullptr)});
  for (const auto& s : list_links(file, kOptimGroup))
    for (const auto& n : list_links(file, std::string(kOptimGroup) + "/" + s))
      out.push_back({optim_path(s, n), check_dataset(file, path, optim_path(s, n), Elem::F32, nullptr)});
  for (auto [name, elem] : {std::pair<const char*, Elem>{"data_cursor", Elem::I64}, {"rng_state", Elem::U8}}) {
    std::string p = std::string(kTrainGroup) + "/" + name;
    out.push_back({p, check_dataset(file, path, p, elem, nullptr)});
  }
  std::vector<DatasetCheck> checks;
  for (const Entry& e : out) checks.push_back(e.check);
  check_total_size(file, path, checks);
  return out;
}

// Reads a whole dataset (serial) and checks its digest.
std::vector<unsigned char> read_whole(hid_t file, const std::string& path, const Entry& e) {
  H5Id d(ST_H5_CHECK(H5Dopen2(file, e.path.c_str(), H5P_DEFAULT)), H5Dclose);
  std::vector<unsigned char> buf(static_cast<size_t>(std::max<int64_t>(e.check.numel, 1) * elem_bytes(e.check.elem)));
  if (e.check.numel > 0) ST_H5_CHECK(H5Dread(d, elem_mem_type(e.check.elem), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
  Digest dg;
  dg.add(buf.data(), e.check.numel, elem_bytes(e.check.elem), 0);
  if (dg != e.check.stored) throw UserError(path + ": dataset /" + e.path + ": checksum mismatch (the data is corrupt)");
  buf.resize(static_cast<size_t>(e.check.numel * elem_bytes(e.check.elem)));
  return buf;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; ++i; }
  char s[32];
  std::snprintf(s, sizeof s, i ? "%.1f %s" : "%.0f %s", b, u[i]);
  return s;
}

}  // namespace

void inspect_checkpoint(const std::string& path, std::ostream& out) {
  CheckpointMeta m = read_checkpoint_meta(path);
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  std::vector<Entry> all;
  file_errors_are_user_errors(path, [&] { all = list_datasets(file, path); });
  out << path << ": " << kFormatName << " v" << m.version << "\n"
      << "  step " << m.step << ", tokens seen " << m.tokens_seen << ", created " << m.created << "\n"
      << "  written by " << m.world_size << " ranks: strategy " << m.strategy << ", shard group " << m.shard_group_size
      << ", replicate " << m.replicate_size << "\n"
      << "  optimizer " << m.optimizer << ", steps taken " << m.optimizer_steps << "\n"
      << "  " << m.library_versions << "\n"
      << "  model spec " << m.model_spec_json << "\n";
  int64_t params = 0, bytes = 0;
  for (const Entry& e : all) {
    bytes += e.check.numel * elem_bytes(e.check.elem);
    if (e.path.rfind(kModelGroup, 0) == 0) params += e.check.numel;
  }
  out << "  " << params << " parameters, " << all.size() << " datasets, " << human_bytes(static_cast<double>(bytes))
      << " of data\n\n";
  for (const Entry& e : all)
    out << "  /" << std::left << std::setw(60) << e.path << " " << std::setw(8) << elem_name(e.check.elem) << " "
        << std::setw(16) << shape_str(e.check.shape) << " "
        << human_bytes(static_cast<double>(e.check.numel * elem_bytes(e.check.elem))) << "\n";
  if (!m.deck_text.empty()) out << "\n  deck (" << m.deck_text.size() << " bytes): see attribute /deck\n";
}

namespace {
herr_t copy_attr(hid_t loc, const char* name, const H5A_info_t*, void* dst) {
  // Attributes are small: read raw with the file type and write it back unchanged.
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t t = H5Aget_type(a), s = H5Aget_space(a);
  std::vector<unsigned char> buf(H5Tget_size(t) * static_cast<size_t>(std::max<hssize_t>(1, H5Sget_simple_extent_npoints(s))));
  herr_t rc = H5Aread(a, t, buf.data());
  hid_t b = rc < 0 ? -1 : H5Acreate2(*static_cast<hid_t*>(dst), name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  if (b >= 0) { rc = H5Awrite(b, t, buf.data()); H5Aclose(b); } else rc = -1;
  H5Sclose(s); H5Tclose(t); H5Aclose(a);
  return rc;
}
}  // namespace

void consolidate_checkpoint(const std::string& path, const std::string& out_path) {
  refuse_overwriting_inputs(out_path, {path}, "ckpt consolidate");
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  file_errors_are_user_errors(path, [&] {
    for (const Entry& e : list_datasets(file, path)) read_whole(file, path, e);  // digests
  });
  H5Id fcpl(ST_H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  ST_H5_CHECK(H5Pset_attr_phase_change(fcpl, 0, 0));
  H5Id fapl(ST_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  ST_H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  const std::string tmp = out_path + ".tmp";
  io::check_output_path(out_path, "ckpt consolidate output");
  io::clear_temp_name(tmp, "ckpt consolidate output");
  {
    // The space first, as a checkpoint save probes it (write_guard.h): on a full disk HDF5's
    // object copy (H5Ocopy, 1.10) crashes instead of failing, so it must not start there. The
    // copy is about the input's size (the same contiguous datasets, metadata rewritten).
    struct stat in {};
    const int64_t in_bytes = ::stat(path.c_str(), &in) == 0 ? static_cast<int64_t>(in.st_size) : 0;
    const int64_t need = in_bytes + in_bytes / 10 + 65536;
    ::close(io::create_temp(tmp, "ckpt consolidate output"));
    const std::string why = detail::reserve_space(tmp, need, io::available_bytes(io::parent_dir(tmp)));
    ::unlink(tmp.c_str());
    if (!why.empty()) throw IoError("ckpt consolidate output " + tmp + ": " + why);
  }
  // EXCL: HDF5 creates the name with O_EXCL, following no link planted there.
  hid_t o = H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, fcpl, fapl);
  if (o < 0) throw UserError("cannot create " + tmp + " (" + detail::h5_innermost_message() + ")");
  try {
    H5Id out(o, H5Fclose);
    hid_t out_id = out.get();
    ST_H5_CHECK(H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_INC, nullptr, copy_attr, &out_id));
    for (const char* g : {kModelGroup, kOptimGroup, kTrainGroup})
      ST_H5_CHECK(H5Ocopy(file, g, out, g, H5P_DEFAULT, H5P_DEFAULT));
    out.close();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  io::commit_temp(tmp, out_path, "ckpt consolidate output");
}

void refuse_overwriting_inputs(const std::string& out, const std::vector<std::string>& inputs,
                               const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty()) throw UserError(what + ": the output path is empty");
  if (fs::is_directory(out, ec))
    throw UserError(what + ": the output " + out + " is a directory; give a file name");
  for (const std::string& candidate : {out, out + ".tmp"}) {
    if (!fs::exists(candidate, ec)) continue;
    for (const std::string& in : inputs) {
      std::error_code e2;
      if (fs::exists(in, e2) && fs::equivalent(candidate, in, e2) && !e2)
        throw UserError(what + ": the output " + out + (candidate == out ? "" : " (its temporary " + candidate + ")") +
                        " is the input " + in + "; refusing to overwrite it: write to another path");
    }
  }
  // A link, device node or FIFO at the output name, or a directory that is missing or not
  // writable, is refused before any work is done (exit 2, as for every command: docs/
  // troubleshooting.md); the writer checks again when it renames its temporary onto it.
  io::check_output_writable(out, what + " output");
}

namespace {
// The model's parameters in the model's order, each with its shape; nothing else.
std::vector<Entry> expected_entries(hid_t file, const std::string& path, const std::vector<ExpectedTensor>& expected) {
  std::vector<Entry> params;
  std::set<std::string> want;
  for (const ExpectedTensor& t : expected) {
    want.insert(t.name);
    params.push_back({model_path(t.name), check_dataset(file, path, model_path(t.name), Elem::F32, &t.shape)});
  }
  for (const auto& n : list_links(file, kModelGroup))
    if (!want.count(n))
      throw UserError(path + ": dataset /" + model_path(n) + " is not a parameter of the model its model_spec describes");
  std::vector<DatasetCheck> checks;
  for (const Entry& e : params) checks.push_back(e.check);
  check_total_size(file, path, checks);
  return params;
}
}  // namespace

void check_model_datasets(const std::string& path, const std::vector<ExpectedTensor>& expected) {
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  file_errors_are_user_errors(path, [&] { expected_entries(file, path, expected); });
}

void export_safetensors(const std::string& path, const std::string& out_path,
                        const std::vector<ExpectedTensor>* expected) {
  refuse_overwriting_inputs(out_path, {path}, "ckpt export");
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  std::vector<Entry> params;
  file_errors_are_user_errors(path, [&] {
    if (expected) {
      params = expected_entries(file, path, *expected);
    } else {
      for (const auto& n : list_links(file, kModelGroup))
        params.push_back({model_path(n), check_dataset(file, path, model_path(n), Elem::F32, nullptr)});
    }
    std::vector<DatasetCheck> checks;
    for (const Entry& e : params) checks.push_back(e.check);
    check_total_size(file, path, checks);
  });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"source", path}};
  int64_t offset = 0;
  for (const Entry& e : params) {
    int64_t n = e.check.numel * 4;
    header[e.path.substr(std::string(kModelGroup).size() + 1)] = {
        {"dtype", "F32"}, {"shape", e.check.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors writes it
  io::OutputFile out(out_path, "ckpt export output");  // out.tmp, renamed by commit(); removed on error
  uint64_t hlen = h.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(hlen >> (8 * i));
  out.write(le, 8);
  out.write(h);
  file_errors_are_user_errors(path, [&] {
    for (const Entry& e : params) {
      std::vector<unsigned char> data = read_whole(file, path, e);
      out.write(data.data(), data.size());
    }
  });
  out.commit();
}

}  // namespace shardtrain::ckpt

namespace shardtrain::ckpt {
namespace {

int out_dtype_bytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

}  // namespace

std::vector<std::vector<size_t>> safetensors_shard_groups(const std::vector<int64_t>& bytes, int64_t max_shard_bytes) {
  // Shards in the model's order, each up to max_shard_bytes of tensor data (a larger tensor
  // alone), as transformers' save_pretrained splits them.
  std::vector<std::vector<size_t>> shards;
  int64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (shards.empty() || (filled > 0 && filled + bytes[i] > max_shard_bytes)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(i);
    filled += bytes[i];
  }
  if (shards.empty()) shards.emplace_back();
  return shards;
}

std::string safetensors_shard_file(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char b[64];
  std::snprintf(b, sizeof b, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return b;
}

std::vector<std::pair<std::string, at::Tensor>> read_model_tensors(const std::string& path,
                                                                    const std::vector<ExpectedTensor>& expected) {
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  std::vector<std::pair<std::string, at::Tensor>> out;
  file_errors_are_user_errors(path, [&] {
    for (const Entry& e : expected_entries(file, path, expected)) {
      std::vector<unsigned char> data = read_whole(file, path, e);
      at::Tensor t = at::empty(e.check.shape, at::TensorOptions().dtype(at::kFloat));
      if (!data.empty()) std::memcpy(t.data_ptr(), data.data(), data.size());
      out.emplace_back(e.path.substr(std::string(kModelGroup).size() + 1), t);
    }
  });
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::string& what) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t n = t.numel() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors writes it
  io::OutputFile out(path, what);
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(static_cast<uint64_t>(h.size()) >> (8 * i));
  out.write(le, 8);
  out.write(h.data(), h.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.to(at::kFloat).contiguous();
    out.write(c.data_ptr(), static_cast<size_t>(c.numel() * 4));
  }
  out.commit();
}

namespace {
// A tensor's model name from its /model dataset path.
std::string tensor_name(const Entry& e) { return e.path.substr(std::string(kModelGroup).size() + 1); }

// A finite fp32 value past the narrow dtype's range rounds to inf (fp16 holds at most 65504):
// the export would write what its own import refuses. Refused naming the tensor and the dtype,
// or with allow_overflow saturated to the dtype's largest finite value (a warning counts them),
// so that export -> import always round-trips. Non-finite values stay as they are (a checkpoint
// holds none: they are refused when it is saved).
at::Tensor fit_narrowed(const at::Tensor& f32, const at::Tensor& narrow, const std::string& name, const std::string& dtype,
                        bool allow_overflow) {
  const at::Tensor overflow = at::logical_and(at::isinf(narrow), at::isfinite(f32));
  const int64_t n = overflow.sum().item<int64_t>();
  if (n == 0) return narrow;
  const double largest = dtype == "F16" ? 65504.0 : static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
  const double worst = f32.abs().masked_select(overflow).max().item<double>();
  if (!allow_overflow)
    throw UserError("tensor '" + name + "': " + std::to_string(n) + " value(s) beyond " + dtype + "'s range (largest " +
                    log::fmt(worst) + ", " + dtype + " holds at most " + log::fmt(largest) +
                    "): they would become inf, which import refuses. Export as fp32 or bf16 (--dtype), or pass "
                    "--allow-overflow to write them as +-" + log::fmt(largest));
  log::warn(log::fmt("ckpt export: tensor '", name, "': ", n, " value(s) beyond ", dtype, "'s range saturated to +-",
                     largest, " (--allow-overflow)"));
  return at::where(overflow, at::sign(f32).to(narrow.scalar_type()) * largest, narrow).contiguous();
}
}  // namespace

at::Tensor narrow_for_export(const at::Tensor& f32, const std::string& name, const std::string& dtype,
                             bool allow_overflow) {
  if (dtype == "F32") return f32.contiguous();
  const at::Tensor narrow = f32.to(dtype == "BF16" ? at::kBFloat16 : at::kHalf).contiguous();
  return fit_narrowed(f32, narrow, name, dtype, allow_overflow);
}

std::vector<std::string> write_safetensors_shards(const std::string& path, const std::string& dir,
                                                  const std::vector<ExpectedTensor>& expected, const std::string& dtype,
                                                  int64_t max_shard_bytes, bool allow_overflow) {
  ST_USER_CHECK(dtype == "F32" || dtype == "BF16" || dtype == "F16", "safetensors dtype ", dtype,
                " is not one of F32, BF16, F16");
  ST_USER_CHECK(max_shard_bytes > 0, "the shard size must be positive");
  H5Id file = open_checkpoint(path, MPI_COMM_NULL);
  std::vector<Entry> params;
  file_errors_are_user_errors(path, [&] { params = expected_entries(file, path, expected); });
  const int eb = out_dtype_bytes(dtype);
  std::vector<int64_t> bytes;
  for (const Entry& e : params) bytes.push_back(e.check.numel * eb);
  const std::vector<std::vector<size_t>> shards = safetensors_shard_groups(bytes, max_shard_bytes);
  const at::ScalarType st = dtype == "F32" ? at::kFloat : dtype == "BF16" ? at::kBFloat16 : at::kHalf;
  std::vector<std::string> names;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t si = 0; si < shards.size(); ++si) {
    const std::string name = safetensors_shard_file(si, shards.size());
    names.push_back(name);
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}};
    int64_t offset = 0;
    for (size_t i : shards[si]) {
      const Entry& e = params[i];
      const std::string tname = tensor_name(e);
      const int64_t n = e.check.numel * eb;
      header[tname] = {{"dtype", dtype}, {"shape", e.check.shape}, {"data_offsets", {offset, offset + n}}};
      weight_map[tname] = name;
      offset += n;
      total += n;
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors writes it
    io::OutputFile out((std::filesystem::path(dir) / name).string(), "ckpt export output");
    unsigned char le[8];
    const uint64_t hlen = h.size();
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(hlen >> (8 * i));
    out.write(le, 8);
    out.write(h.data(), h.size());
    file_errors_are_user_errors(path, [&] {
      for (size_t i : shards[si]) {
        std::vector<unsigned char> data = read_whole(file, path, params[i]);
        if (dtype == "F32") {
          out.write(data.data(), data.size());
          continue;
        }
        // Round to nearest even, as torch's .to(bfloat16 / float16): a value that came from a
        // BF16 / F16 file comes back as the same bits.
        const at::Tensor f32 = at::from_blob(data.data(), {params[i].check.numel}, at::TensorOptions().dtype(at::kFloat));
        at::Tensor narrow = f32.to(st).contiguous();
        narrow = fit_narrowed(f32, narrow, tensor_name(params[i]), dtype, allow_overflow);
        out.write(narrow.data_ptr(), static_cast<size_t>(narrow.numel() * eb));
      }
    });
    out.commit();
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    io::write_file_atomic((std::filesystem::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    names.push_back("model.safetensors.index.json");
  }
  return names;
}

}  // namespace shardtrain::ckpt
