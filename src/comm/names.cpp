// Printable names of the comm layer's enums and of tensor dtypes (used in errors and records).
#include "shardtrain/comm/comm.h"
#include "internal.h"

#include <c10/core/ScalarType.h>

namespace shardtrain::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::Mpi: return "mpi";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

namespace detail {
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    default: return c10::toString(t);
  }
}
}  // namespace detail
}  // namespace shardtrain::comm
