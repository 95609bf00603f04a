// FlatParam: sharded initialisation from a FlatPlan, the unsharded buffer's state transitions,
// storage resizing and version-independent aliases.
#include "shardtrain/fsdp/flat_param.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::fsdp {
namespace {

// Module::parameters_ is protected; the flat must swap meta parameters for real ones in place
// (same dict entry) so the model keeps working unchanged.
struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& params(torch::nn::Module& m) {
    return m.*(&ModuleAccess::parameters_);
  }
};

const char* state_name(FlatParam::State s) {
  switch (s) {
    case FlatParam::State::Sharded: return "sharded";
    case FlatParam::State::Gathering: return "gathering";
    case FlatParam::State::Unsharded: return "unsharded";
  }
  return "?";
}

}  // namespace

FlatParam::FlatParam(const FlatPlan& plan, const ModuleTree& tree, int shard_rank, const InitParam& init,
                     const c10::Device& device, bool offload)
    : dtype_(plan.dtype),
      numel_(plan.numel),
      padded_(plan.padded),
      shard_numel_(plan.shard_numel),
      shard_rank_(plan.shard_size > 1 ? shard_rank : 0),
      shard_size_(plan.shard_size),
      offloaded_(offload),
      frozen_(plan.frozen),
      nf4_(plan.nf4),
      nf4_format_(plan.nf4_format) {
  ST_CHECK(!nf4_ || frozen_, "an NF4 flat must be frozen");
  for (const ParamPlan& p : plan.params) {
    ParamSlot s;
    s.name = p.name;
    s.shape = p.shape;
    s.numel = p.numel;
    s.offset = p.offset;
    s.owners = tree.params[p.index].owners;
    slots_.push_back(std::move(s));
    nf4_spans_.push_back({p.offset, p.numel});
  }
  // The whole flat parameter in fp32, filled parameter by parameter from the init rule,
  // so the values do not depend on the world size; only this rank's slice is kept.
  at::Tensor whole = at::zeros({padded_}, at::kFloat);
  {
    torch::autograd::AutoGradMode no_grad(false);
    for (auto& s : slots_) {
      at::Tensor view = whole.narrow(0, s.offset, s.numel).view(s.shape);
      init(s.name, view);
    }
  }
  // Offloaded state on a CUDA device goes to pinned host memory (asynchronous copies).
  const at::ScalarType master_dtype = frozen_ ? dtype_ : at::kFloat;
  const at::TensorOptions host_state =
      at::TensorOptions().dtype(master_dtype).pinned_memory(offload && device.is_cuda());
  const at::TensorOptions state = offload ? host_state : at::TensorOptions().dtype(master_dtype).device(device);
  if (nf4_) {
    // The codes of this rank's slice, quantized as the whole tensors would be (the whole flat is
    // here, so are the tensors' statistics).
    const at::Tensor whole_absmax =
        nf4_format_.double_quant ? nf4::flat_absmax(whole, 0, nf4_spans_, nf4_format_) : at::Tensor();
    const at::Tensor q = nf4::quantize_shard(whole.narrow(0, shard_rank_ * shard_numel_, shard_numel_),
                                             shard_rank_ * shard_numel_, nf4_spans_, nf4_format_, whole_absmax);
    packed_ = offload ? at::empty({q.numel()}, host_state.dtype(at::kByte)).copy_(q) : q.to(device);
    full_ = at::empty({padded_}, at::TensorOptions().dtype(dtype_).device(device));
  } else if (aliases_master()) {
    master_ = whole.to(device, master_dtype);  // the same tensor for fp32 on a CPU device
    full_ = master_;
  } else {
    at::Tensor mine = whole.narrow(0, shard_rank_ * shard_numel_, shard_numel_);
    if (offload) {
      master_ = at::empty({shard_numel_}, host_state);
      master_.copy_(mine);
    } else {
      master_ = device.is_cpu() && master_dtype == at::kFloat ? mine.clone() : mine.to(device, master_dtype);
    }
    full_ = at::empty({padded_}, at::TensorOptions().dtype(dtype_).device(device));
  }
  whole = at::Tensor();
  if (!frozen_) grad_shard_ = at::zeros({shard_numel_}, state);
  for (auto& s : slots_) {
    s.param = storage_alias(full_, s.offset, s.shape);
    s.param.requires_grad_(!frozen_);
    for (auto& [module, local] : s.owners) ModuleAccess::params(*module)[local] = s.param;
  }
  if (aliases_master()) {
    state_ = State::Unsharded;
  } else {
    resize_storage(full_, 0);
    state_ = State::Sharded;
  }
  stale_ = true;
}

bool FlatParam::aliases_master() const { return fsdp::aliases_master(shard_size_, dtype_, offloaded_, frozen_, nf4_); }

int64_t FlatParam::shard_bytes() const {
  if (nf4_) return packed_.numel();
  return master_.numel() * static_cast<int64_t>(master_.element_size());
}

at::Tensor FlatParam::shard_values() const {
  if (!nf4_) return master_;
  ST_CHECK(!awaits_absmax(), "flat param: NF4 values read before their statistics were double-quantized");
  at::Tensor out = at::empty({shard_numel_}, packed_.options().dtype(dtype_));
  nf4::dequantize_shard(packed_, shard_numel_, nf4_format_, out);
  return out;
}

void FlatParam::write_values(const at::Tensor& values, const at::Tensor& whole_absmax) {
  ST_CHECK(values.numel() == shard_numel_, "flat param: ", values.numel(), " values for a shard of ", shard_numel_);
  if (!nf4_) {
    write_master().copy_(values.view({shard_numel_}));
    return;
  }
  stale_ = true;
  const int64_t begin = shard_rank_ * shard_numel_;
  const at::Tensor v = values.reshape({shard_numel_}).to(at::kFloat);
  if (nf4_format_.double_quant && !whole_absmax.defined()) {
    nf4::Format plain = nf4_format_;
    plain.double_quant = false;
    pending_ = nf4::quantize_shard(v, begin, nf4_spans_, plain, at::Tensor());
    return;
  }
  pending_ = at::Tensor();
  packed_.copy_(nf4::quantize_shard(v, begin, nf4_spans_, nf4_format_, whole_absmax));
}

at::Tensor FlatParam::local_absmax() const {
  ST_CHECK(awaits_absmax(), "flat param: no absmax awaits double quantization");
  return nf4::plain_absmax(pending_, shard_numel_, nf4_format_);
}

void FlatParam::finish_absmax(const at::Tensor& whole_absmax) {
  ST_CHECK(awaits_absmax(), "flat param: no absmax awaits double quantization");
  packed_.copy_(nf4::double_quantize(pending_, shard_numel_, shard_rank_ * shard_numel_, nf4_spans_, nf4_format_,
                                     whole_absmax.to(pending_.device())));
  pending_ = at::Tensor();
  stale_ = true;
}

int64_t FlatParam::live_full_bytes() const {
  if (!full_.defined()) return 0;
  return static_cast<int64_t>(full_.storage().nbytes());
}

at::Tensor FlatParam::begin_fill() {
  ST_CHECK(needs_gather() && !gather_work_, "flat param: fill while ", state_name(state_),
           stale_ ? " (stale)" : "");
  ST_CHECK(!awaits_absmax(), "flat param: an NF4 flat gathered before its statistics were double-quantized");
  stale_ = false;
  if (aliases_master()) {
    state_ = State::Unsharded;
    return at::Tensor();
  }
  resize_storage(full_, full_bytes());  // on the compute stream
  return storage_alias(full_, shard_rank_ * shard_numel_, {shard_numel_});
}

void FlatParam::gathering(comm::WorkPtr work) {
  ST_CHECK(work && !gather_work_ && live_full_bytes() == full_bytes(), "flat param: gathering while ",
           state_name(state_));
  gather_work_ = std::move(work);
  state_ = State::Gathering;
}

void FlatParam::filled() {
  ST_CHECK(!gather_work_, "flat param: filled while a gather is in flight");
  state_ = State::Unsharded;
}

comm::WorkPtr FlatParam::take_gather_work() {
  if (state_ != State::Gathering) return nullptr;
  state_ = State::Unsharded;
  return std::move(gather_work_);
}

void FlatParam::release() {
  ST_CHECK(state_ != State::Gathering, "flat param: freeing memory a collective is writing");
  if (aliases_master()) return;
  resize_storage(full_, 0);
  state_ = State::Sharded;
}

void resize_storage(const at::Tensor& t, int64_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(s->nbytes()) == nbytes) return;
  // Allocate through the storage's own allocator (CPU, or the CUDA caching allocator on the
  // current stream), the same on libtorch 1.13 and 2.x (see torch_compat.h).
  torch_compat::reallocate_storage(s, static_cast<size_t>(nbytes));
}

at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, base.options());
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  t.set_(base.storage(), base.storage_offset() + offset, shape, strides);
  return t;
}

}  // namespace shardtrain::fsdp
