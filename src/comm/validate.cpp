// Argument validation for collectives: numel relations, contiguity, dtypes, devices, aliasing.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "internal.h"
#include "shardtrain/util/error.h"

namespace shardtrain::comm::detail {
namespace {

// The floating dtypes of the table (dtype.h), read once: this runs on every collective.
bool is_float_dtype(at::ScalarType t) {
  static const std::vector<at::ScalarType> floats = float_dtypes();
  return std::find(floats.begin(), floats.end(), t) != floats.end();
}

void check_tensor(const std::string& g, const char* op, const char* what, const at::Tensor& t,
                  DeviceRule dev) {
  if (!t.defined()) throw_comm_error(g, op, std::string(what) + " is an undefined tensor");
  if (!t.is_contiguous())
    throw_comm_error(g, op, std::string(what) + " must be contiguous (call .contiguous())");
  if (dev.cuda) {
    if (!t.is_cuda() || t.get_device() != dev.cuda_index)
      throw_comm_error(g, op, concat(what, " must live on cuda:", dev.cuda_index,
                                             " for the nccl backend; it is on ", t.device().str()));
  } else if (!t.is_cpu()) {
    throw_comm_error(g, op, concat(what, " must be a CPU tensor for the mpi backend; it "
                                           "is on ", t.device().str(), " (use backend nccl)"));
  }
}

void check_dtype(const std::string& g, const char* op, const at::Tensor& t, bool allow_int64) {
  at::ScalarType s = t.scalar_type();
  if (is_float_dtype(s) || (allow_int64 && s == at::kLong)) return;
  std::string supported;
  for (const std::string& n : float_dtype_long_names()) supported += (supported.empty() ? "" : ", ") + n;
  if (allow_int64) supported += ", " + dtype_long_name(at::kLong);
  throw_comm_error(g, op, "unsupported dtype " + dtype_long_name(s) + "; supported: " + supported);
}

// The MPI backend passes counts as int; refuse what would overflow rather than truncate.
void check_count(const std::string& g, const char* op, const at::Tensor& t) {
  if (t.numel() > INT_MAX)
    throw_comm_error(g, op, concat("tensor of ", t.numel(), " elements exceeds the "
                                           "per-collective limit of ", INT_MAX, " elements"));
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a.data_ptr());
  auto pb = reinterpret_cast<uintptr_t>(b.data_ptr());
  uintptr_t ea = pa + a.numel() * a.element_size(), eb = pb + b.numel() * b.element_size();
  return pa < eb && pb < ea;
}

}  // namespace

void throw_comm_error(const std::string& group, const std::string& op, const std::string& msg) {
  throw Error(concat("[rank ", error_rank(), "] comm '", group, "' ", op, ": ", msg));
}

std::string op_label(const char* op, ReduceOp r) { return concat(op, "(", to_string(r), ")"); }

bool is_exact_slice(const at::Tensor& part, const at::Tensor& whole, int64_t offset) {
  if (part.scalar_type() != whole.scalar_type()) return false;
  auto pp = static_cast<const char*>(part.data_ptr());
  auto pw = static_cast<const char*>(whole.data_ptr());
  return pp == pw + offset * whole.element_size();
}

void validate_all_gather(const std::string& g, int size, const at::Tensor& out,
                         const at::Tensor& in, DeviceRule dev) {
  const char* op = "all_gather";
  check_tensor(g, op, "out", out, dev);
  check_tensor(g, op, "in", in, dev);
  check_dtype(g, op, out, /*allow_int64=*/true);
  if (out.scalar_type() != in.scalar_type())
    throw_comm_error(g, op, "out and in must have the same dtype (out " +
                                dtype_long_name(out.scalar_type()) + ", in " +
                                dtype_long_name(in.scalar_type()) + ")");
  if (out.numel() != size * in.numel())
    throw_comm_error(g, op, concat("out.numel() (", out.numel(), ") must equal group size (",
                                   size, ") * in.numel() (", in.numel(), ")"));
  if (!dev.cuda) check_count(g, op, out);
  // In place means `in` is exactly this rank's slice of `out`; any other overlap is a bug.
  if (overlaps(out, in)) {
    int rank = -1;
    for (int r = 0; r < size; ++r)
      if (is_exact_slice(in, out, r * in.numel())) rank = r;
    if (rank < 0)
      throw_comm_error(g, op, "in overlaps out but is not exactly one rank's slice of it");
  }
}

void validate_reduce_scatter(const std::string& g, int size, const at::Tensor& out,
                             const at::Tensor& in, ReduceOp r, DeviceRule dev) {
  const std::string op = op_label("reduce_scatter", r);
  check_tensor(g, op.c_str(), "out", out, dev);
  check_tensor(g, op.c_str(), "in", in, dev);
  check_dtype(g, op.c_str(), out, /*allow_int64=*/false);
  if (out.scalar_type() != in.scalar_type())
    throw_comm_error(g, op, "out and in must have the same dtype (out " +
                                dtype_long_name(out.scalar_type()) + ", in " +
                                dtype_long_name(in.scalar_type()) + ")");
  if (in.numel() != size * out.numel())
    throw_comm_error(g, op, concat("in.numel() (", in.numel(), ") must equal group size (",
                                   size, ") * out.numel() (", out.numel(), ")"));
  if (!dev.cuda) check_count(g, op.c_str(), in);
  if (overlaps(out, in)) {
    bool ok = false;
    for (int q = 0; q < size; ++q) ok = ok || is_exact_slice(out, in, q * out.numel());
    if (!ok) throw_comm_error(g, op, "out overlaps in but is not exactly one rank's slice of it");
  }
}

void validate_all_reduce(const std::string& g, const at::Tensor& t, ReduceOp r, DeviceRule dev) {
  const std::string op = op_label("all_reduce", r);
  check_tensor(g, op.c_str(), "tensor", t, dev);
  check_dtype(g, op.c_str(), t, /*allow_int64=*/true);
  if (r == ReduceOp::Avg && t.scalar_type() == at::kLong)
    throw_comm_error(g, op, "avg of int64 would truncate; use sum and divide yourself");
  if (!dev.cuda) check_count(g, op.c_str(), t);
}

void validate_broadcast(const std::string& g, int size, const at::Tensor& t, int root,
                        DeviceRule dev) {
  check_tensor(g, "broadcast", "tensor", t, dev);
  check_dtype(g, "broadcast", t, /*allow_int64=*/true);
  if (root < 0 || root >= size)
    throw_comm_error(g, "broadcast", concat("root ", root, " is not a rank of this group of ",
                                            size));
  if (!dev.cuda) check_count(g, "broadcast", t);
}

}  // namespace shardtrain::comm::detail
