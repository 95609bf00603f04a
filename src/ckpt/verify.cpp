// open_checkpoint, check_dataset and verify_checkpoint (every digest, ranks split the reading).
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "file_checks.h"
#include "plan.h"
#include "shardtrain/ckpt/attributes.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/format.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::ckpt {

int elem_bytes(Elem e) { return e == Elem::F32 ? 4 : e == Elem::I64 ? 8 : 1; }
hid_t elem_mem_type(Elem e) {
  return e == Elem::F32 ? H5T_NATIVE_FLOAT : e == Elem::I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT8;
}
const char* elem_name(Elem e) { return e == Elem::F32 ? "float32" : e == Elem::I64 ? "int64" : "uint8"; }

uint64_t count_nonfinite_f32(const void* data, int64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t w;
    std::memcpy(&w, p + 4 * j, 4);
    bad += (w & 0x7f800000u) == 0x7f800000u;  // exponent all ones: Inf or NaN
  }
  return bad;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {
// The first link of the file that is not a hard link (H5Lvisit descends through hard links
// only, so nothing is opened through the link it reports).
struct ForeignLink {
  std::string name;
  H5L_type_t type = H5L_TYPE_HARD;
};
herr_t find_foreign_link(hid_t, const char* name, const H5L_info_t* info, void* out) {
  if (info->type == H5L_TYPE_HARD) return 0;
  auto* f = static_cast<ForeignLink*>(out);
  f->name = name;
  f->type = info->type;
  return 1;  // stop
}

// Every link inside the file must be a hard link: a soft link can make a dataset name another
// one, an external link another file's data (docs/security.md). Checked before any object of
// the file is opened by name.
void refuse_foreign_links(hid_t file, const std::string& what) {
  ForeignLink f;
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, find_foreign_link, &f) < 0)
    throw UserError(what + ": cannot list its links (" + detail::h5_innermost_message() + ")");
  if (f.name.empty()) return;
  const std::string kind = f.type == H5L_TYPE_SOFT       ? "a soft link"
                           : f.type == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                                         : "a user-defined link";
  throw UserError(what + ": /" + f.name + " is " + kind +
                  "; shardtrain checkpoints hold hard links only, and a checkpoint never makes shardtrain read "
                  "another object or file (a file not written by shardtrain, or edited)");
}
}  // namespace

H5Id open_checkpoint(const std::string& path, MPI_Comm comm) {
  // HDF5 open()s the path: a FIFO would block there forever, a device read nonsense.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError("checkpoint " + path + ": " +
                    (S_ISDIR(st.st_mode) ? std::string("is a directory") : std::string("is not a regular file")) +
                    " (a FIFO, device or socket is not a checkpoint)");
  detail::quiet_hdf5();
  H5Id fapl(ST_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  if (comm != MPI_COMM_NULL) ST_H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (f < 0) {
    const std::string why = detail::h5_innermost_message();
    throw UserError("checkpoint " + path + ": cannot open as HDF5 (missing, truncated or not HDF5" +
                    (why.empty() ? "" : ": " + why) + ")");
  }
  H5Id file(f, H5Fclose);
  const std::string what = "checkpoint " + path;
  refuse_foreign_links(file, what);
  std::string format = read_attr_string(file, attr::kFormat, what);
  if (format != kFormatName) throw UserError(what + ": format is '" + format + "', not '" + kFormatName + "'");
  int64_t version = read_attr_int64(file, attr::kVersion, what);
  if (version != kFormatVersion)
    throw UserError(what + ": format version " + std::to_string(version) + " (this build reads " +
                    std::to_string(kFormatVersion) + ")");
  return file;
}

DatasetCheck check_dataset(hid_t file, const std::string& file_path, const std::string& dpath, Elem elem,
                           const std::vector<int64_t>* want_shape) {
  const std::string what = file_path + ": dataset /" + dpath;
  if (!link_exists(file, dpath)) throw UserError(what + " is missing");
  H5O_info_t oi;
  if (H5Oget_info_by_name(file, dpath.c_str(), &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET)
    throw UserError(what + " is not a dataset");
  H5Id d(ST_H5_CHECK(H5Dopen2(file, dpath.c_str(), H5P_DEFAULT)), H5Dclose);
  DatasetCheck c;
  c.elem = elem;
  {
    H5Id t(ST_H5_CHECK(H5Dget_type(d)), H5Tclose);
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    bool ok = false;
    if (elem == Elem::F32) ok = cls == H5T_FLOAT && size == 4 && H5Tget_order(t) == H5T_ORDER_LE;
    if (elem == Elem::I64) ok = cls == H5T_INTEGER && size == 8 && H5Tget_sign(t) == H5T_SGN_2 && H5Tget_order(t) == H5T_ORDER_LE;
    if (elem == Elem::U8) ok = cls == H5T_INTEGER && size == 1 && H5Tget_sign(t) == H5T_SGN_NONE;
    if (!ok) throw UserError(what + ": element type is not " + elem_name(elem) + " (little-endian)");
  }
  {
    H5Id s(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
    H5S_class_t sc = H5Sget_simple_extent_type(s);
    if (sc != H5S_SCALAR && sc != H5S_SIMPLE) throw UserError(what + ": has no dataspace (null)");
    int nd = H5Sget_simple_extent_ndims(s);
    if (nd < 0 || nd > kMaxRank) throw UserError(what + ": " + std::to_string(nd) + " dimensions");
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    if (nd > 0) ST_H5_CHECK(H5Sget_simple_extent_dims(s, dims.data(), nullptr));
    c.numel = 1;
    for (hsize_t dim : dims) {
      if (dim > static_cast<hsize_t>(kMaxDim)) throw UserError(what + ": absurd dimension " + std::to_string(dim));
      c.shape.push_back(static_cast<int64_t>(dim));
      // kMaxDim = 2^40 bounds each factor; stop before the product overflows.
      if (dim != 0 && c.numel > kMaxDim / static_cast<int64_t>(dim))
        throw UserError(what + ": absurd size (more than 2^40 elements)");
      c.numel *= static_cast<int64_t>(dim);
    }
  }
  if (want_shape && c.shape != *want_shape)
    throw UserError(what + ": shape " + shape_str(c.shape) + ", the model has " + shape_str(*want_shape) +
                    " (a checkpoint of another model?)");
  {
    H5Id dcpl(ST_H5_CHECK(H5Dget_create_plist(d)), H5Pclose);
    // The writer makes every dataset contiguous (docs/checkpoint-format.md). A chunked or
    // compact one cannot be size-checked against the file (a chunked dataset may declare
    // 2^40 elements and store none, and reading it then takes forever): refuse it.
    // External storage: the data would come from other files, named by the file itself.
    if (H5Pget_external_count(dcpl) != 0)
      throw UserError(what + ": its data is stored in external files; shardtrain checkpoints hold their data "
                      "inside the file (a file not written by shardtrain, or edited)");
    const H5D_layout_t layout = H5Pget_layout(dcpl);
    if (layout != H5D_CONTIGUOUS)
      throw UserError(what + ": stored with a " +
                      (layout == H5D_CHUNKED ? std::string("chunked")
                       : layout == H5D_COMPACT ? std::string("compact")
                       : layout == H5D_VIRTUAL ? std::string("virtual")
                                               : std::string("unknown")) +
                      " layout; shardtrain checkpoints hold contiguous datasets only (a file not written by "
                      "shardtrain, or edited)");
    if (c.numel > 0) {
      haddr_t off = H5Dget_offset(d);
      hsize_t storage = H5Dget_storage_size(d);
      hsize_t eof = 0;
      ST_H5_CHECK(H5Fget_filesize(file, &eof));
      hsize_t need = static_cast<hsize_t>(c.numel) * elem_bytes(elem);
      if (off == HADDR_UNDEF || storage < need) throw UserError(what + ": data was never written");
      if (off + need > eof)
        throw UserError(what + ": data ends at byte " + std::to_string(off + need) + " but the file has " +
                        std::to_string(eof) + " bytes (truncated)");
    }
  }
  if (!has_attr(d, kDigestAttr)) throw UserError(what + ": digest attribute is missing");
  std::vector<uint64_t> dg = read_attr_uint64s(d, kDigestAttr, what);
  if (dg.size() != 2) throw UserError(what + ": digest attribute must have 2 elements");
  c.stored.sum = dg[0];
  c.stored.weighted = dg[1];
  return c;
}

void check_total_size(hid_t file, const std::string& file_path, const std::vector<DatasetCheck>& checks) {
  hsize_t eof = 0;
  ST_H5_CHECK(H5Fget_filesize(file, &eof));
  uint64_t total = 0;
  for (const DatasetCheck& c : checks) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(c.numel), static_cast<uint64_t>(elem_bytes(c.elem)), &bytes) ||
        __builtin_add_overflow(total, bytes, &total) || total > eof)
      throw UserError(file_path + ": its datasets declare more data than the file's " + std::to_string(eof) +
                      " bytes hold (a truncated, crafted or edited file)");
  }
}

std::vector<std::string> list_links(hid_t file, const std::string& group) {
  std::vector<std::string> names;
  if (!link_exists(file, group)) return names;
  H5Id g(ST_H5_CHECK(H5Gopen2(file, group.c_str(), H5P_DEFAULT)), H5Gclose);
  ST_H5_CHECK(H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, nullptr,
                         [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
                           static_cast<std::vector<std::string>*>(out)->push_back(name);
                           return 0;
                         },
                         &names));
  return names;
}

void verify_checkpoint(const std::string& path, MPI_Comm world) {
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  H5Id file;
  std::vector<std::string> paths;
  std::vector<DatasetCheck> checks;
  runtime::run_agreed(world, [&] { file_errors_are_user_errors(path, [&] {
    runtime::BlockingRegion region(world, "verify.open");
    file = open_checkpoint(path, world);
    std::vector<std::string> params = list_links(file, kModelGroup);
    for (const auto& n : params) {
      paths.push_back(model_path(n));
      checks.push_back(check_dataset(file, path, paths.back(), Elem::F32, nullptr));
    }
    if (!link_exists(file, kOptimGroup)) throw UserError(path + ": group /optim is missing");
    for (const auto& state : list_links(file, kOptimGroup)) {
      for (const auto& n : list_links(file, std::string(kOptimGroup) + "/" + state)) {
        auto it = std::find(params.begin(), params.end(), n);
        if (it == params.end())
          throw UserError(path + ": dataset /" + optim_path(state, n) + " has no parameter /" + model_path(n));
        paths.push_back(optim_path(state, n));
        checks.push_back(check_dataset(file, path, paths.back(), Elem::F32, &checks[it - params.begin()].shape));
      }
    }
    for (auto [name, elem] : {std::pair<const char*, Elem>{"data_cursor", Elem::I64}, {"rng_state", Elem::U8}}) {
      paths.push_back(std::string(kTrainGroup) + "/" + name);
      checks.push_back(check_dataset(file, path, paths.back(), elem, nullptr));
    }
    check_total_size(file, path, checks);
  }); });

  // Rank r digests elements [r*n/D, (r+1)*n/D) of each dataset, in rounds of at most 8M.
  constexpr int64_t kRound = int64_t{8} << 20;
  // Per dataset: digest sum, digest weighted sum, non-finite float32 values.
  std::vector<uint64_t> local(3 * paths.size(), 0), total(local.size(), 0);
  std::vector<unsigned char> buf;
  runtime::run_agreed(world, [&] { file_errors_are_user_errors(path, [&] {
    H5Id dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    ST_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    for (size_t i = 0; i < paths.size(); ++i) {
      const DatasetCheck& c = checks[i];
      runtime::BlockingRegion region(world, "verify.read");  // collective reads of at most 8M elements
      H5Id d(ST_H5_CHECK(H5Dopen2(file, paths[i].c_str(), H5P_DEFAULT)), H5Dclose);
      H5Id fs(ST_H5_CHECK(H5Dget_space(d)), H5Sclose);
      const int64_t lo = c.numel * rank / size, hi = c.numel * (rank + 1) / size;
      const int64_t most = (c.numel + size - 1) / size, rounds = (most + kRound - 1) / kRound;
      Digest dg;
      for (int64_t r = 0; r < rounds; ++r) {
        Piece p{std::min(hi, lo + r * kRound), std::min(hi, lo + (r + 1) * kRound), 0};
        buf.resize(static_cast<size_t>(std::max<int64_t>(p.numel(), 1) * elem_bytes(c.elem)));
        select_piece(fs, c.shape, p);
        H5Id ms(piece_mem_space(p), H5Sclose);
        ST_H5_CHECK(H5Dread(d, elem_mem_type(c.elem), ms, fs, dxpl, buf.data()));
        dg.add(buf.data(), p.numel(), elem_bytes(c.elem), p.lo);
        if (c.elem == Elem::F32) local[3 * i + 2] += count_nonfinite_f32(buf.data(), p.numel());
      }
      local[3 * i] = dg.sum;
      local[3 * i + 1] = dg.weighted;
    }
  }); });
  {
    total = local;
    runtime::sum(world, total, "verify.digests");
    runtime::BlockingRegion region(world, "verify.close");
    file.reset();  // H5Fclose: collective
  }
  runtime::run_agreed(world, [&] {
    for (size_t i = 0; i < paths.size(); ++i)
      if (total[3 * i] != checks[i].stored.sum || total[3 * i + 1] != checks[i].stored.weighted)
        throw UserError(path + ": dataset /" + paths[i] + ": checksum mismatch (the data is corrupt)");
    // Intact but useless: weights or optimizer state of a run that had diverged.
    for (size_t i = 0; i < paths.size(); ++i)
      if (total[3 * i + 2] != 0)
        throw UserError(path + ": dataset /" + paths[i] + " holds " + std::to_string(total[3 * i + 2]) +
                        " non-finite values (NaN or Inf): the state of a diverged run");
  });
}

}  // namespace shardtrain::ckpt
