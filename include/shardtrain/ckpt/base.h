// The frozen base of a run, identified by its values: what an adapter (LoRA) checkpoint records
// instead of holding the base, and what a resume, eval or export compares before using it.
#pragma once
#include <mpi.h>

#include <map>
#include <string>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/fsdp/engine.h"

namespace shardtrain::ckpt {

struct BaseIdentity {
  std::string source;                      // where it came from ("checkpoint.init_from = DIR", "run.seed = 1234")
  std::string dtype;                       // the dtype the run holds it in (fsdp.param_dtype): digests are of those values
  std::map<std::string, Digest> digests;   // per frozen parameter: its values widened to fp32, row-major
  bool empty() const { return digests.empty(); }
  std::string json() const;
  // UserError naming `what` when the text is not such an object.
  static BaseIdentity parse(const std::string& text, const std::string& what);
  // "" when the same; else what differs, in words (source, dtype, the first tensors that differ).
  std::string differences(const BaseIdentity& now) const;
};

// BaseIdentity::dtype of a run that holds its base in `param_dtype` ("bf16"), with the blocks'
// linear weights as NF4 when nf4_block > 0 (lora.base_dtype = "nf4"): "bf16 with nf4 linear
// weights (block 64, double-quantized)". And back: the param_dtype such a text starts with.
std::string base_dtype_text(const std::string& param_dtype, int64_t nf4_block, bool nf4_double_quant);
std::string base_param_dtype(const std::string& dtype_text);

// The identity of the engine's frozen parameters as they are now (each element digested once
// over the world, replicas and the ignored group split as a checkpoint's writes are: the same at
// any world size and strategy). Collective over world.
BaseIdentity frozen_identity(fsdp::Engine& engine, MPI_Comm world, const std::string& source);

}  // namespace shardtrain::ckpt
