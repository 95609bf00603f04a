// HDF5 error reporting, H5Id closing and the attribute helpers.
#include "shardtrain/ckpt/h5.h"

#include <mutex>

namespace shardtrain::ckpt {
namespace detail {
namespace {
// The innermost (first) message of HDF5's error stack: the most specific reason.
herr_t take_first(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n == 0 && e->desc) *s = e->desc;
  if (n == 0 && e->func_name) *s += std::string(" (in ") + e->func_name + ")";
  return 0;
}
}  // namespace

void throw_h5_error(const char* call, const char* file, int line) {
  std::string why;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, take_first, &why);
  H5Eclear2(H5E_DEFAULT);
  ::shardtrain::detail::throw_internal(file, line,
      std::string(call) + " failed" + (why.empty() ? "" : ": " + why));
}

std::string h5_innermost_message() {
  std::string why;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD,
           [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
             if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
             return 0;
           },
           &why);
  H5Eclear2(H5E_DEFAULT);
  return why;
}

void quiet_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    // Defense in depth behind open_checkpoint's link check: with the external link class
    // unregistered, this process cannot traverse an external link at all (it never writes one).
    (void)H5Lunregister(H5L_TYPE_EXTERNAL);
  });
}
}  // namespace detail

void H5Id::close() {
  if (id_ < 0) return;
  hid_t id = std::exchange(id_, -1);
  ST_H5_CHECK(close_(id));
}

namespace {
H5Id scalar_space() { return H5Id(ST_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose); }
H5Id open_attr(hid_t obj, const std::string& name, const std::string& what) {
  detail::quiet_hdf5();
  htri_t e = H5Aexists(obj, name.c_str());
  if (e <= 0) throw UserError(what + ": attribute '" + name + "' is missing");
  return H5Id(ST_H5_CHECK(H5Aopen(obj, name.c_str(), H5P_DEFAULT)), H5Aclose);
}
// Number of elements of an attribute's dataspace (UserError beyond `max`).
hssize_t attr_points(hid_t a, const std::string& name, const std::string& what, hssize_t max) {
  H5Id sp(ST_H5_CHECK(H5Aget_space(a)), H5Sclose);
  hssize_t n = ST_H5_CHECK(H5Sget_simple_extent_npoints(sp));
  if (n < 1 || n > max) throw UserError(what + ": attribute '" + name + "' has " + std::to_string(n) + " elements");
  return n;
}
}  // namespace

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  H5Id type(ST_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  ST_H5_CHECK(H5Tset_size(type, value.size() + 1));
  ST_H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLTERM));
  ST_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  H5Id space = scalar_space();
  H5Id a(ST_H5_CHECK(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  ST_H5_CHECK(H5Awrite(a, type, value.c_str()));
  a.close();
}

void write_attr_int64(hid_t obj, const std::string& name, int64_t value) {
  H5Id space = scalar_space();
  H5Id a(ST_H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  ST_H5_CHECK(H5Awrite(a, H5T_NATIVE_INT64, &value));
  a.close();
}

void write_attr_uint64s(hid_t obj, const std::string& name, const std::vector<uint64_t>& values) {
  hsize_t n = values.size();
  H5Id space(ST_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  H5Id a(ST_H5_CHECK(H5Acreate2(obj, name.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  ST_H5_CHECK(H5Awrite(a, H5T_NATIVE_UINT64, values.data()));
  a.close();
}

bool has_attr(hid_t obj, const std::string& name) {
  detail::quiet_hdf5();
  return H5Aexists(obj, name.c_str()) > 0;
}

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& what) {
  H5Id a = open_attr(obj, name, what);
  H5Id type(ST_H5_CHECK(H5Aget_type(a)), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) throw UserError(what + ": attribute '" + name + "' is not a string");
  attr_points(a, name, what, 1);
  if (H5Tis_variable_str(type) > 0) {
    H5Id mem(ST_H5_CHECK(H5Tcopy(type)), H5Tclose);
    char* p = nullptr;
    ST_H5_CHECK(H5Aread(a, mem, &p));
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(type);
  if (size == 0 || size > (size_t{1} << 30)) throw UserError(what + ": attribute '" + name + "' has an absurd size");
  // Same character set as the file (HDF5 does not convert ASCII <-> UTF-8), one byte longer.
  H5Id mem(ST_H5_CHECK(H5Tcopy(type)), H5Tclose);
  ST_H5_CHECK(H5Tset_size(mem, size + 1));
  ST_H5_CHECK(H5Tset_strpad(mem, H5T_STR_NULLTERM));
  std::string buf(size + 1, '\0');
  ST_H5_CHECK(H5Aread(a, mem, buf.data()));
  buf.resize(std::char_traits<char>::length(buf.c_str()));
  return buf;
}

int64_t read_attr_int64(hid_t obj, const std::string& name, const std::string& what) {
  H5Id a = open_attr(obj, name, what);
  H5Id type(ST_H5_CHECK(H5Aget_type(a)), H5Tclose);
  if (H5Tget_class(type) != H5T_INTEGER) throw UserError(what + ": attribute '" + name + "' is not an integer");
  attr_points(a, name, what, 1);
  int64_t v = 0;
  ST_H5_CHECK(H5Aread(a, H5T_NATIVE_INT64, &v));
  return v;
}

std::vector<uint64_t> read_attr_uint64s(hid_t obj, const std::string& name, const std::string& what) {
  H5Id a = open_attr(obj, name, what);
  H5Id type(ST_H5_CHECK(H5Aget_type(a)), H5Tclose);
  if (H5Tget_class(type) != H5T_INTEGER) throw UserError(what + ": attribute '" + name + "' is not an integer array");
  hssize_t n = attr_points(a, name, what, 1024);
  std::vector<uint64_t> v(static_cast<size_t>(n));
  ST_H5_CHECK(H5Aread(a, H5T_NATIVE_UINT64, v.data()));
  return v;
}

bool link_exists(hid_t loc, const std::string& path) {
  detail::quiet_hdf5();
  // H5Lexists needs each intermediate link to exist; check prefix by prefix.
  size_t pos = 0;
  while (true) {
    size_t slash = path.find('/', pos);
    std::string prefix = path.substr(0, slash);
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

}  // namespace shardtrain::ckpt
