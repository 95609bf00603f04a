// dtype -> MPI_Datatype, ReduceOp -> MPI_Op, and the user-defined half-precision ops.
#include "mpi_types.h"

#include <algorithm>
#include <mutex>

#include "half.h"
#include "internal.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::comm::detail {

MPI_Datatype mpi_datatype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    default: ST_CHECK(false, "no MPI datatype for ", dtype_long_name(t));
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

namespace {
template <typename T, bool kMax>
void half_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = load_as<T, float>(a[i]), y = load_as<T, float>(b[i]);
    b[i] = store_as<T, float>(kMax ? std::max(x, y) : x + y);
  }
}
}  // namespace

MPI_Op half_mpi_op(at::ScalarType t, ReduceOp op) {
  static std::once_flag once;
  static MPI_Op ops[2][2];  // [bf16, fp16][sum, max]
  std::call_once(once, [] {
    ST_MPI_CHECK(MPI_Op_create(&half_combine<c10::BFloat16, false>, 1, &ops[0][0]));
    ST_MPI_CHECK(MPI_Op_create(&half_combine<c10::BFloat16, true>, 1, &ops[0][1]));
    ST_MPI_CHECK(MPI_Op_create(&half_combine<c10::Half, false>, 1, &ops[1][0]));
    ST_MPI_CHECK(MPI_Op_create(&half_combine<c10::Half, true>, 1, &ops[1][1]));
  });
  ST_CHECK(t == at::kBFloat16 || t == at::kHalf, "half_mpi_op needs bf16 or fp16");
  return ops[t == at::kHalf ? 1 : 0][op == ReduceOp::Max ? 1 : 0];
}

}  // namespace shardtrain::comm::detail
