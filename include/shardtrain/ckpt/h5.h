// ST_H5_CHECK, the H5Id handle and small attribute helpers shared by the checkpoint code.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt::detail {
// Throws an internal Error naming the call, file:line, rank and HDF5's innermost message.
[[noreturn]] void throw_h5_error(const char* call, const char* file, int line);
// Turns off HDF5's automatic error-stack printing (we report errors ourselves). Idempotent.
void quiet_hdf5();
// The innermost message of HDF5's current error stack ("" if none), which it then clears.
std::string h5_innermost_message();
}  // namespace shardtrain::ckpt::detail

// ST_H5_CHECK(call): evaluates an HDF5 call returning hid_t/herr_t/htri_t/ssize_t and
// throws if it is negative; yields the value otherwise.
#define ST_H5_CHECK(call)                                                                   \
  ([&]() {                                                                                  \
    auto st_h5_rc_ = (call);                                                                \
    if (st_h5_rc_ < 0) ::shardtrain::ckpt::detail::throw_h5_error(#call, __FILE__, __LINE__); \
    return st_h5_rc_;                                                                       \
  }())

namespace shardtrain::ckpt {

// Owns one HDF5 identifier and closes it with the matching H5?close. Closing a file
// opened with MPI-IO is collective: keep the handle alive until every rank reaches the
// same point (errors are agreed first, see runtime::run_agreed).
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) { reset(); id_ = std::exchange(o.id_, -1); close_ = o.close_; }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now (errors reported); the destructor closes silently.
  void close();
  // Gives up ownership without closing (the caller closes, or must not: see save.cpp).
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Attributes on any object. Strings are fixed-length, NUL-terminated ASCII/UTF-8.
void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_int64(hid_t obj, const std::string& name, int64_t value);
void write_attr_uint64s(hid_t obj, const std::string& name, const std::vector<uint64_t>& values);
bool has_attr(hid_t obj, const std::string& name);
// Read helpers throw UserError (naming `what`) when the attribute is missing or of the wrong kind.
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& what);
int64_t read_attr_int64(hid_t obj, const std::string& name, const std::string& what);
std::vector<uint64_t> read_attr_uint64s(hid_t obj, const std::string& name, const std::string& what);

// Whether a link exists at `path` (every intermediate group too).
bool link_exists(hid_t loc, const std::string& path);

}  // namespace shardtrain::ckpt
