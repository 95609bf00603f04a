// MPI datatypes and ops for tensor dtypes, and bf16/fp16 MPI_Ops for raw-MPI baselines.
#pragma once
#include <c10/core/ScalarType.h>
#include <mpi.h>

#include "shardtrain/comm/comm.h"

namespace shardtrain::comm::detail {

// The MPI type that moves one element unchanged (bf16 and fp16 travel as MPI_UINT16_T).
MPI_Datatype mpi_datatype(at::ScalarType t);
// MPI_SUM for Sum and Avg (Avg divides afterwards), MPI_MAX for Max.
MPI_Op mpi_op(ReduceOp op);
// User-defined MPI_Ops over MPI_UINT16_T holding bf16 or fp16 (each combine rounds back to
// the half type). Created once, never freed (they live until MPI_Finalize).
MPI_Op half_mpi_op(at::ScalarType t, ReduceOp op);

}  // namespace shardtrain::comm::detail
