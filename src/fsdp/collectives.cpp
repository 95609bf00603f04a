// The engine's collectives over flat buffers (see collectives.h).
#include "collectives.h"

#include <algorithm>

#include "shardtrain/fsdp/engine.h"

namespace shardtrain::fsdp {

comm::WorkPtr all_gather_flat(comm::Comm& shard, const FlatParam& fp, const at::Tensor& mine) {
  return shard.all_gather(storage_alias(fp.full(), 0, {fp.padded()}), mine);
}

ReduceScatter reduce_scatter_grad(comm::Comm& shard, at::Tensor full_grad, at::ScalarType reduce_dtype,
                                  int64_t shard_numel, bool tree) {
  ReduceScatter r;
  r.in = full_grad.scalar_type() == reduce_dtype ? full_grad : full_grad.to(reduce_dtype);
  full_grad = at::Tensor();  // the compute-dtype buffer goes as soon as it was cast
  r.out = at::empty({shard_numel}, r.in.options());
  r.work = tree ? shard.reduce_scatter_tree(r.out, r.in) : shard.reduce_scatter(r.out, r.in, comm::ReduceOp::Avg);
  return r;
}

ReplicaAverage average_across_replicas(const std::vector<std::pair<comm::Comm*, FlatParam*>>& shards,
                                       const std::function<at::Tensor(const FlatParam&)>& on_comm_device,
                                       bool tree) {
  ReplicaAverage a;
  std::vector<comm::Comm*> comms;
  for (const auto& [c, fp] : shards) {
    if (!c || c->size() == 1) continue;
    size_t k = std::find(comms.begin(), comms.end(), c) - comms.begin();
    if (k == comms.size()) {
      comms.push_back(c);
      a.tensors.emplace_back();
      a.owners.emplace_back();
    }
    a.owners[k].push_back(fp);
    a.tensors[k].push_back(on_comm_device(*fp));
  }
  for (size_t k = 0; k < comms.size(); ++k) {
    if (!tree) {
      a.works.push_back(comms[k]->all_reduce_coalesced(a.tensors[k], comm::ReduceOp::Avg));
      continue;
    }
    for (const at::Tensor& t : a.tensors[k]) a.works.push_back(comms[k]->all_reduce_tree(t));
  }
  return a;
}

void ReplicaAverage::finish() {
  for (size_t k = 0; k < owners.size(); ++k)
    for (size_t i = 0; i < owners[k].size(); ++i)
      if (!tensors[k][i].is_same(owners[k][i]->grad_shard())) owners[k][i]->grad_shard().copy_(tensors[k][i]);
}

double sum_of_squares(const at::Tensor& g) {
  at::Tensor acc = at::zeros({}, g.options().dtype(at::kDouble));
  for (int64_t b = 0; b < g.numel(); b += kNormChunkElems)
    acc.add_(g.narrow(0, b, std::min(kNormChunkElems, g.numel() - b)).to(at::kDouble).pow_(2).sum());
  return acc.item<double>();
}

}  // namespace shardtrain::fsdp
