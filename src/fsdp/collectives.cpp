// The engine's collectives over flat buffers (see collectives.h).
#include "collectives.h"

#include <algorithm>

#include "shardtrain/fsdp/limits.h"
#include "shardtrain/fsdp/nf4_shard.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {
namespace {

// A wire buffer for S packed vectors of P bytes each (P a multiple of 4), as float16: the comm
// layer moves floating dtypes.
at::Tensor wire_buffer(int S, int64_t P, const at::TensorOptions& o) {
  return at::empty({S * P / 2}, o.dtype(at::kHalf));
}

// The quantized all-gather of one flat in flight: wait() waits for the wire, dequantizes every
// rank's slice into the flat's unsharded buffer and, with the exact gather beside it, hands the
// relative error to `judge` (true: the exact values replace the dequantized ones).
class QuantizedGatherWork final : public comm::Work {
 public:
  QuantizedGatherWork(FlatParam& fp, int64_t block, comm::WorkPtr wire_work, at::Tensor wire, comm::WorkPtr exact_work,
                      at::Tensor exact, std::function<bool(double)> judge)
      : Work(wire_work->seq()), fp_(fp), block_(block), wire_work_(std::move(wire_work)), wire_(std::move(wire)),
        exact_work_(std::move(exact_work)), exact_(std::move(exact)), judge_(std::move(judge)) {}

  void wait() override {
    if (done_) return;
    wire_work_->wait();
    if (exact_work_) exact_work_->wait();
    done_ = true;
    const int S = fp_.shard_size();
    const int64_t L = fp_.shard_numel(), P = quantized_bytes(L, block_);
    at::Tensor full = storage_alias(fp_.full(), 0, {fp_.padded()});
    for (int r = 0; r < S; ++r) dequantize_into(as_bytes(wire_, r * P, P), L, block_, full.narrow(0, r * L, L));
    wire_ = at::Tensor();
    if (!exact_.defined()) return;
    auto [err, ref] = squared_error_and_reference(full, exact_);
    if (judge_(relative_error(err, ref))) full.copy_(exact_);
    exact_ = at::Tensor();
  }
  bool is_completed() override {
    return done_ || (wire_work_->is_completed() && (!exact_work_ || exact_work_->is_completed()));
  }

 private:
  FlatParam& fp_;
  int64_t block_;
  comm::WorkPtr wire_work_;
  at::Tensor wire_;
  comm::WorkPtr exact_work_;
  at::Tensor exact_;
  std::function<bool(double)> judge_;
  bool done_ = false;
};

// The NF4 all-gather of one flat in flight: wait() waits for the wire and dequantizes every rank's
// packed shard into the flat's unsharded buffer.
class Nf4GatherWork final : public comm::Work {
 public:
  Nf4GatherWork(FlatParam& fp, comm::WorkPtr wire_work, at::Tensor wire)
      : Work(wire_work->seq()), fp_(fp), wire_work_(std::move(wire_work)), wire_(std::move(wire)) {}
  void wait() override {
    if (done_) return;
    wire_work_->wait();
    done_ = true;
    const int64_t L = fp_.shard_numel(), P = fp_.nf4_format().shard_bytes(L);
    at::Tensor full = storage_alias(fp_.full(), 0, {fp_.padded()});
    for (int r = 0; r < fp_.shard_size(); ++r)
      nf4::dequantize_shard(as_bytes(wire_, r * P, P), L, fp_.nf4_format(), full.narrow(0, r * L, L));
    wire_ = at::Tensor();
  }
  bool is_completed() override { return done_ || wire_work_->is_completed(); }

 private:
  FlatParam& fp_;
  comm::WorkPtr wire_work_;
  at::Tensor wire_;
  bool done_ = false;
};

}  // namespace

comm::WorkPtr nf4_all_gather_flat(comm::Comm& shard, FlatParam& fp) {
  const int S = fp.shard_size(), r = fp.shard_rank();
  const int64_t P = fp.nf4_format().shard_bytes(fp.shard_numel());
  at::Tensor wire = wire_buffer(S, P, fp.full().options());
  as_bytes(wire, r * P, P).copy_(fp.packed());
  comm::WorkPtr w = shard.all_gather(wire, wire.narrow(0, r * P / 2, P / 2));
  return std::make_shared<Nf4GatherWork>(fp, std::move(w), std::move(wire));
}

comm::WorkPtr all_gather_flat(comm::Comm& shard, const FlatParam& fp, const at::Tensor& mine) {
  return shard.all_gather(storage_alias(fp.full(), 0, {fp.padded()}), mine);
}

comm::WorkPtr all_gather_from_secondary(comm::Comm& node, const FlatParam& fp, const at::Tensor& secondary) {
  const int G = node.size(), l = node.rank();
  const int64_t chunk = fp.padded() / G;
  at::Tensor full = storage_alias(fp.full(), 0, {fp.padded()});
  at::Tensor own = full.narrow(0, l * chunk, chunk);
  own.copy_(secondary);
  return node.all_gather(full, own);
}

comm::WorkPtr quantized_all_gather_flat(comm::Comm& shard, FlatParam& fp, const at::Tensor& packed, int64_t block,
                                        bool exact, std::function<bool(double rel_error)> judge) {
  const int S = fp.shard_size(), r = fp.shard_rank();
  const int64_t L = fp.shard_numel(), P = quantized_bytes(L, block);
  at::Tensor wire = wire_buffer(S, P, fp.full().options());
  as_bytes(wire, r * P, P).copy_(packed);
  comm::WorkPtr w = shard.all_gather(wire, wire.narrow(0, r * P / 2, P / 2));
  comm::WorkPtr exact_work;
  at::Tensor exact_full;
  if (exact) {
    exact_full = at::empty({fp.padded()}, fp.full().options());
    exact_full.narrow(0, r * L, L).copy_(fp.master());
    exact_work = shard.all_gather(exact_full, exact_full.narrow(0, r * L, L));
  }
  return std::make_shared<QuantizedGatherWork>(fp, block, std::move(w), std::move(wire), std::move(exact_work),
                                               std::move(exact_full), std::move(judge));
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

comm::WorkPtr sum_whole_grad_tree(comm::Comm& shard, const at::Tensor& grad) { return shard.all_reduce_tree(grad); }

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

Int8Average int8_replica_average(comm::Comm& replicate, const at::Tensor& x, at::Tensor& residual, int64_t block,
                                 bool exact) {
  Int8Average a;
  a.replicas = replicate.size();
  a.numel = x.numel();
  a.block = block;
  const int k = replicate.rank();
  const int64_t P = quantized_bytes(a.numel, block);
  a.wire = wire_buffer(a.replicas, P, x.options());
  at::Tensor own = as_bytes(a.wire, k * P, P);
  quantize_into(x, own, block);
  // The new residual: x minus what the others will receive from this rank.
  at::sub_out(residual, x, dequantize(own, a.numel, block));
  a.work = replicate.all_gather(a.wire, a.wire.narrow(0, k * P / 2, P / 2));
  if (exact) {
    a.exact = x;
    a.exact_work = replicate.all_reduce(a.exact, comm::ReduceOp::Avg);
  }
  return a;
}

at::Tensor Int8Average::average() const {
  const int64_t P = quantized_bytes(numel, block);
  at::Tensor sum = at::zeros({numel}, wire.options().dtype(at::kFloat));
  for (int r = 0; r < replicas; ++r) sum.add_(dequantize(as_bytes(wire, r * P, P), numel, block));
  sum.div_(static_cast<double>(replicas));
  return sum;
}

WireAverage wire_average(comm::Comm& group, const at::Tensor& x, WireFormat format, int64_t block, bool exact,
                         bool tree) {
  ST_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "wire_average: x must be contiguous fp32");
  WireAverage a;
  a.format = format;
  a.ranks = group.size();
  a.numel = x.numel();
  a.block = block;
  a.tree = tree;
  const at::Tensor flat = x.view({a.numel});
  auto reduce = [&](const at::Tensor& t) {
    return tree ? group.all_reduce_tree(t) : group.all_reduce(t, comm::ReduceOp::Avg);
  };
  if (format == WireFormat::Fp32 || format == WireFormat::Bf16) {
    a.wire = format == WireFormat::Fp32 ? flat.clone() : flat.to(at::kBFloat16);
    a.work = reduce(a.wire);
  } else {
    const int k = group.rank();
    const QuantBits bits = quant_bits(format);
    const int64_t P = quantized_bytes(a.numel, block, bits);
    a.wire = wire_buffer(a.ranks, P, x.options());
    quantize_into(flat, as_bytes(a.wire, k * P, P), block, bits);
    a.work = group.all_gather(a.wire, a.wire.narrow(0, k * P / 2, P / 2));
  }
  if (exact && format != WireFormat::Fp32) {
    a.exact = flat.clone();
    a.exact_work = reduce(a.exact);
  }
  return a;
}

at::Tensor WireAverage::average() const {
  if (format == WireFormat::Fp32) return tree ? wire / static_cast<double>(ranks) : wire;
  if (format == WireFormat::Bf16) {
    at::Tensor r = wire.to(at::kFloat);
    return tree ? r.div_(static_cast<double>(ranks)) : r;
  }
  // Every rank's dequantized vector summed in fp32 in rank order: the same bits everywhere.
  const QuantBits bits = quant_bits(format);
  const int64_t P = quantized_bytes(numel, block, bits);
  at::Tensor sum = at::zeros({numel}, wire.options().dtype(at::kFloat));
  for (int r = 0; r < ranks; ++r) sum.add_(dequantize(as_bytes(wire, r * P, P), numel, block, bits));
  return sum.div_(static_cast<double>(ranks));
}

at::Tensor WireAverage::exact_average() const {
  if (format == WireFormat::Fp32) return average();
  ST_CHECK(exact.defined(), "WireAverage::exact_average: the average was issued without `exact`");
  return tree ? exact / static_cast<double>(ranks) : exact;
}

void WireAverage::wait() const {
  if (work) work->wait();
  if (exact_work) exact_work->wait();
}

comm::WorkPtr sum_across(comm::Comm& group, const at::Tensor& t) { return group.all_reduce(t, comm::ReduceOp::Sum); }

ReplicaGather gather_across_replicas(comm::Comm& replicate, const at::Tensor& mine) {
  const int R = replicate.size(), k = replicate.rank();
  const int64_t L = mine.numel();
  ReplicaGather g;
  g.all = at::empty({R * L}, mine.options());
  g.all.narrow(0, k * L, L).copy_(mine);
  g.work = replicate.all_gather(g.all, g.all.narrow(0, k * L, L));
  return g;
}

ReplicaGather gather_host_ids(comm::Comm& group, int host_id, const c10::Device& device) {
  return gather_across_replicas(group, at::full({1}, static_cast<double>(host_id),
                                                at::TensorOptions().dtype(at::kDouble).device(device)));
}

double sum_of_squares(const at::Tensor& g) {
  at::Tensor acc = at::zeros({}, g.options().dtype(at::kDouble));
  for (int64_t b = 0; b < g.numel(); b += kNormChunkElems)
    acc.add_(g.narrow(0, b, std::min(kNormChunkElems, g.numel() - b)).to(at::kDouble).pow_(2).sum());
  return acc.item<double>();
}

}  // namespace shardtrain::fsdp
