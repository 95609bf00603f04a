// Printable names of the comm layer's enums (used in errors and records; dtypes: dtype.h).
#include "shardtrain/comm/comm.h"

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

}  // namespace shardtrain::comm
