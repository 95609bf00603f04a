// ST_CUDA_CHECK / ST_NCCL_CHECK: every CUDA and NCCL call names itself, file:line and rank.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "shardtrain/util/error.h"

#define ST_CUDA_CHECK(call)                                                                \
  do {                                                                                     \
    cudaError_t st_cuda_rc_ = (call);                                                      \
    if (st_cuda_rc_ != cudaSuccess)                                                        \
      ::shardtrain::detail::throw_internal(__FILE__, __LINE__,                             \
          ::shardtrain::detail::concat(#call " failed: ", cudaGetErrorName(st_cuda_rc_),   \
                                       ": ", cudaGetErrorString(st_cuda_rc_)));            \
  } while (0)

#define ST_NCCL_CHECK(call)                                                                \
  do {                                                                                     \
    ncclResult_t st_nccl_rc_ = (call);                                                     \
    if (st_nccl_rc_ != ncclSuccess)                                                        \
      ::shardtrain::detail::throw_internal(__FILE__, __LINE__,                             \
          ::shardtrain::detail::concat(#call " failed: ", ncclGetErrorString(st_nccl_rc_), \
                                       " (", ncclGetLastError(nullptr), ")"));             \
  } while (0)
