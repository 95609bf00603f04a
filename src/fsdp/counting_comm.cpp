// CountingComm (see counting_comm.h).
#include "counting_comm.h"

#include <ATen/ATen.h>

#include "collectives.h"
#include "shardtrain/comm/ring_model.h"

namespace shardtrain::fsdp {
namespace {
int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
}  // namespace

CountingComm::CountingComm(comm::Comm& inner, int host_id, const c10::Device& device, ByteCounters& counters)
    : comm::Comm(inner.name()), inner_(inner), counters_(counters) {
  const int S = inner_.size();
  successor_ = (inner_.rank() + 1) % S;
  if (S == 1) return;
  const ReplicaGather hosts = gather_host_ids(inner_, host_id, device);
  hosts.work->wait();
  const at::Tensor h = hosts.all.cpu();
  const double* p = h.data_ptr<double>();
  remote_ = host_id >= 0 && p[successor_] >= 0 && p[successor_] != p[inner_.rank()];
}

void CountingComm::count(double bytes) {
  (remote_ ? counters_.inter : counters_.intra) += static_cast<int64_t>(bytes);
}

comm::WorkPtr CountingComm::all_gather(const at::Tensor& out, const at::Tensor& in) {
  count(comm::ring_bytes_sent(comm::RingOp::AllGather, size(), static_cast<double>(size()) * nbytes(in)));
  return inner_.all_gather(out, in);
}

comm::WorkPtr CountingComm::reduce_scatter(const at::Tensor& out, const at::Tensor& in, comm::ReduceOp op) {
  count(comm::ring_bytes_sent(comm::RingOp::ReduceScatter, size(), static_cast<double>(size()) * nbytes(out)));
  return inner_.reduce_scatter(out, in, op);
}

comm::WorkPtr CountingComm::reduce_scatter_tree(const at::Tensor& out, const at::Tensor& in) {
  count(comm::ring_bytes_sent(comm::RingOp::ReduceScatter, size(), static_cast<double>(size()) * nbytes(out)));
  return inner_.reduce_scatter_tree(out, in);
}

comm::WorkPtr CountingComm::all_reduce_tree(const at::Tensor& tensor) {
  count(comm::ring_bytes_sent(comm::RingOp::AllReduce, size(), nbytes(tensor)));
  return inner_.all_reduce_tree(tensor);
}

comm::WorkPtr CountingComm::all_reduce(const at::Tensor& tensor, comm::ReduceOp op) {
  count(comm::ring_bytes_sent(comm::RingOp::AllReduce, size(), nbytes(tensor)));
  return inner_.all_reduce(tensor, op);
}

comm::WorkPtr CountingComm::all_reduce_coalesced(const std::vector<at::Tensor>& tensors, comm::ReduceOp op) {
  for (const auto& t : tensors) count(comm::ring_bytes_sent(comm::RingOp::AllReduce, size(), nbytes(t)));
  return inner_.all_reduce_coalesced(tensors, op);
}

comm::WorkPtr CountingComm::broadcast(const at::Tensor& tensor, int root) {
  // A chain from the root: every rank but the root's predecessor forwards the buffer once.
  if (size() > 1 && successor_ != root) count(static_cast<double>(nbytes(tensor)));
  return inner_.broadcast(tensor, root);
}

}  // namespace shardtrain::fsdp
