// FlatParam: one unit's parameters of one dtype, flattened, padded and sharded, and the state of
// its unsharded buffer (sharded -> gathering -> unsharded -> sharded).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/nf4_shard.h"

namespace shardtrain::fsdp {

struct FlatPlan;
struct ModuleTree;

// Where one parameter lives inside its FlatParam.
struct ParamSlot {
  std::string name;                 // qualified name, as in root.named_parameters()
  std::vector<int64_t> shape;
  int64_t offset = 0;               // element offset in the unsharded flat buffer
  int64_t numel = 0;
  at::Tensor param;                 // the module's parameter: a leaf over `full`'s storage
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, local name)
};

// The flat layout: all parameters concatenated in a fixed order, padded to a multiple of
// the shard-group size S. Rank r of the shard group owns elements [r*L, (r+1)*L),
// L = padded/S, in fp32 (master weights, gradient shard, optimizer state). The
// unsharded buffer `full` is in the compute dtype; its storage is allocated and
// all-gathered on unshard and released to 0 bytes on reshard. When S == 1 and the
// compute dtype is fp32, `full` and `master` share one storage and nothing is freed (not under
// cpu_offload, where the master stays in host memory).
//
// A frozen flat (FlatPlan::frozen: parameters that do not train) keeps its shard in the compute
// dtype instead of fp32, has no gradient shard and its parameters do not require gradients; with
// S == 1 (not offloaded) it is its own unsharded buffer in any dtype. An NF4 flat (FlatPlan::nf4,
// QLoRA's base) is frozen and keeps its shard as NF4 codes and statistics (packed(), nf4_shard.h)
// instead of a master: its unsharded buffer is always dequantized from them, and freed after use.
//
// The layout is fixed at construction. The master shard is read through master() and written
// only through write_master(), which marks the unsharded copy stale: whoever changes the weights
// (the optimizer, a checkpoint load, an import) cannot forget that the next forward must
// gather them again.
class FlatParam {
 public:
  enum class State { Sharded, Gathering, Unsharded };

  // Builds the flat from its plan (fsdp::plan_units) on `device`: sharded initialisation,
  // the whole flat in fp32 filled parameter by parameter by `init` (so the values do not depend
  // on the world size; always on the CPU, so not on the device either), of which this rank
  // (shard_rank of the plan's shard_size) keeps its slice. The tree's modules get the flat's
  // parameters in place of theirs. offload: master and gradient shard in host memory.
  using InitParam = std::function<void(const std::string& name, at::Tensor& full_fp32)>;
  FlatParam(const FlatPlan& plan, const ModuleTree& tree, int shard_rank, const InitParam& init,
            const c10::Device& device, bool offload);
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;

  // ---- layout -------------------------------------------------------------------------
  at::ScalarType dtype() const { return dtype_; }  // compute dtype of `full`
  const std::vector<ParamSlot>& slots() const { return slots_; }
  int64_t numel() const { return numel_; }
  int64_t padded() const { return padded_; }
  int64_t shard_numel() const { return shard_numel_; }
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  // Master and gradient shard kept apart from `full` in host memory (cpu_offload).
  bool offloaded() const { return offloaded_; }
  bool aliases_master() const;  // fsdp::aliases_master (wrap.h) of this flat
  // Does not train: master in dtype(), no gradient shard (grad_shard() undefined).
  bool frozen() const { return frozen_; }
  // Stored as NF4 (then frozen): packed() holds the shard, master() is undefined.
  bool nf4() const { return nf4_; }
  const nf4::Format& nf4_format() const { return nf4_format_; }
  // The shard's bytes at rest (master, or packed codes and statistics).
  int64_t shard_bytes() const;
  int64_t full_bytes() const { return padded_ * static_cast<int64_t>(c10::elementSize(dtype_)); }

  // ---- data ---------------------------------------------------------------------------
  // fp32 [L] (host, pinned on CUDA, when offloaded); a frozen flat's in dtype(). Undefined for an
  // NF4 flat.
  const at::Tensor& master() const { return master_; }
  // This rank's shard of the values the model computes with, in dtype() (a copy): the master, or
  // an NF4 flat's codes dequantized.
  at::Tensor shard_values() const;
  // Writes this rank's shard from fp32 values [L] (any device): into the master, or quantized into
  // an NF4 flat's codes. With double quantization the statistics need every tensor's whole absmax,
  // which a rank holding a slice does not have: whole_absmax (nf4::flat_absmax of the whole flat)
  // gives it; undefined, the flat keeps its codes and its slice's fp32 absmax and awaits_absmax()
  // until finish_absmax(whole) (Engine::finish_nf4 gathers it over the shard group).
  void write_values(const at::Tensor& values, const at::Tensor& whole_absmax = at::Tensor());
  bool awaits_absmax() const { return pending_.defined(); }
  // This rank's part of nf4::flat_absmax while awaits_absmax(); finish_absmax quantizes with the
  // whole flat's.
  at::Tensor local_absmax() const;
  void finish_absmax(const at::Tensor& whole_absmax);
  // NF4: uint8 [nf4_format().shard_bytes(L)] (host when offloaded).
  const at::Tensor& packed() const { return packed_; }
  // The master for writing; marks the unsharded copy stale (see the class comment).
  at::Tensor& write_master() {
    stale_ = true;
    return master_;
  }
  // fp32 [L], accumulates over micro-batches (host when offloaded). Undefined when frozen.
  at::Tensor& grad_shard() { return grad_shard_; }
  const at::Tensor& grad_shard() const { return grad_shard_; }
  // dtype [padded] on the engine's device; storage 0 bytes while sharded.
  const at::Tensor& full() const { return full_; }
  // Bytes the unsharded storage holds right now (0 while sharded).
  int64_t live_full_bytes() const;

  // ---- the unsharded buffer's states (driven by the engine) ----------------------------
  State state() const { return state_; }
  // Whether unshard must (re)fill `full`: sharded, or unsharded from masters since changed.
  bool needs_gather() const { return state_ == State::Sharded || (state_ == State::Unsharded && stale_); }
  // Sharded/stale -> filling: allocates `full` (unless it aliases the master) and returns this
  // rank's slice of it, which the caller fills from the master before gathering.
  at::Tensor begin_fill();
  // -> Gathering: `work` fills the rest of `full` (an all-gather, or a host->device copy).
  void gathering(comm::WorkPtr work);
  // -> Unsharded with nothing in flight (a one-rank flat filled synchronously).
  void filled();
  // Gathering -> Unsharded: the work to wait for first (nullptr if none was in flight).
  comm::WorkPtr take_gather_work();
  // -> Sharded: frees `full`'s storage. Only with no gather in flight.
  void release();
  // The collective filling `full`, if one is in flight (the engine's destructor waits for it).
  const comm::WorkPtr& gather_work() const { return gather_work_; }

 private:
  at::ScalarType dtype_ = at::kFloat;
  std::vector<ParamSlot> slots_;
  int64_t numel_ = 0, padded_ = 0, shard_numel_ = 0;
  int shard_rank_ = 0, shard_size_ = 1;
  bool offloaded_ = false;
  bool frozen_ = false;
  bool nf4_ = false;
  nf4::Format nf4_format_;
  std::vector<nf4::Span> nf4_spans_;  // the parameters' places, for quantizing
  at::Tensor packed_, pending_;  // pending_: codes + plain absmax awaiting double quantization
  at::Tensor master_, grad_shard_, full_;
  State state_ = State::Sharded;
  bool stale_ = true;  // master changed since `full` was filled
  comm::WorkPtr gather_work_;
};

// Resizes a tensor's storage in place (0 frees it). Tensors that share the storage,
// including ones autograd saved, see the new memory: that is what makes resharding
// after forward and re-gathering before backward safe.
void resize_storage(const at::Tensor& t, int64_t nbytes);
// A tensor over `base`'s storage with its own version counter and no autograd history:
// writes through it (all-gathers, casts) do not invalidate what autograd saved.
at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape);

}  // namespace shardtrain::fsdp
