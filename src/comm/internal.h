// Helpers shared by the comm backends: argument validation, error messages (dtype names: dtype.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "shardtrain/comm/comm.h"
#include "shardtrain/comm/dtype.h"
#include "shardtrain/util/error.h"

namespace shardtrain::comm::detail {

using ::shardtrain::detail::concat;

// Throws shardtrain::Error "[rank R] comm 'group' op: msg" (the message the caller of
// wait() or of the collective sees).
[[noreturn]] void throw_comm_error(const std::string& group, const std::string& op,
                                   const std::string& msg);

// Where a backend needs its tensors: CPU memory, or a given CUDA device.
struct DeviceRule {
  bool cuda = false;
  int cuda_index = -1;
};

// Argument checks of the Comm contract (comm.h); each throws throw_comm_error on failure.
void validate_all_gather(const std::string& group, int size, const at::Tensor& out,
                         const at::Tensor& in, DeviceRule dev);
void validate_reduce_scatter(const std::string& group, int size, const at::Tensor& out,
                             const at::Tensor& in, ReduceOp op, DeviceRule dev);
void validate_all_reduce(const std::string& group, const at::Tensor& t, ReduceOp op,
                         DeviceRule dev);
void validate_broadcast(const std::string& group, int size, const at::Tensor& t, int root,
                        DeviceRule dev);

// True when `part` occupies exactly elements [offset, offset + part.numel()) of `whole`.
bool is_exact_slice(const at::Tensor& part, const at::Tensor& whole, int64_t offset);

// "all_reduce(sum)"-style label used in flight records and watchdog reports.
std::string op_label(const char* op, ReduceOp r);

}  // namespace shardtrain::comm::detail
