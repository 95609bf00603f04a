// Opening checkpoint files and validating their datasets before any data is used.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/h5.h"

namespace shardtrain::ckpt {

enum class Elem { F32, I64, U8 };
int elem_bytes(Elem e);
hid_t elem_mem_type(Elem e);
const char* elem_name(Elem e);

// Opens read-only; with a communicator through MPI-IO (collective), with MPI_COMM_NULL
// through the default (POSIX) driver. UserError naming the file if it cannot be opened
// (missing, truncated, not HDF5), and if it is not a shardtrain checkpoint of a known version.
H5Id open_checkpoint(const std::string& path, MPI_Comm comm);

struct DatasetCheck {
  std::vector<int64_t> shape;
  int64_t numel = 0;
  Elem elem = Elem::F32;
  Digest stored;
};

// Checks that `dpath` is a dataset of element type `elem` (exact shape when `want_shape`
// is given; any sane shape otherwise), that its data lies inside the file, and that it
// carries a digest. UserError "<file>: dataset /<dpath>: ..." otherwise.
DatasetCheck check_dataset(hid_t file, const std::string& file_path, const std::string& dpath, Elem elem,
                           const std::vector<int64_t>* want_shape);

// The datasets' bytes together must fit in the file (datasets do not share storage):
// UserError naming the file otherwise.
void check_total_size(hid_t file, const std::string& file_path, const std::vector<DatasetCheck>& checks);

// Names of the links in group `group` (name order); empty if the group is missing.
std::vector<std::string> list_links(hid_t file, const std::string& group);

std::string shape_str(const std::vector<int64_t>& s);

// Float32 values among n (as stored, little-endian) that are NaN or +-Inf.
uint64_t count_nonfinite_f32(const void* data, int64_t n);

}  // namespace shardtrain::ckpt

namespace shardtrain::ckpt {
// Runs fn; an internal error (a failed HDF5 call on a damaged file) becomes a UserError
// naming the file, since at this point the file is the likely cause.
template <typename F>
void file_errors_are_user_errors(const std::string& path, F&& fn) {
  try {
    fn();
  } catch (const UserError&) {
    throw;
  } catch (const IoError&) {
    throw;  // an output the storage refused (exit 5): not the checkpoint's fault
  } catch (const Error& e) {
    throw UserError("checkpoint " + path + ": unreadable (" + e.what() + ")");
  }
}
}  // namespace shardtrain::ckpt
