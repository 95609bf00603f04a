// Unit: one FSDP unit (a hookable module and the flat parameters it claims) and its training
// state, with the legal transitions named; the engine (engine_impl.h) drives them.
#pragma once
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/flat_param.h"
#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/fsdp/wrap.h"

namespace shardtrain::fsdp {

// Where a unit is in one forward + backward (as PyTorch FSDP2's TrainingState):
//   Idle --pre_forward--> Forward --post_forward--> Idle
//   Idle --pre_backward--> PreBackward   (unsharded; gradient buffers out; counting the
//                                          parameters whose gradients have landed)
//   PreBackward --post_backward--> PostBackward  (the last gradient landed, or end of backward
//                                                 for parameters that got none: reductions
//                                                 queued; idempotent)
//   any --end_backward--> Idle
// pre_backward may fire more than once (once per output the unit's gradient flows through);
// only the first prepares the buffers.
enum class UnitState { Idle, Forward, PreBackward, PostBackward };
const char* to_string(UnitState s);

// 1-2 FlatParams per unit: the compute dtype, and fp32 for keep_fp32 parameters under mixed
// precision. The ignored group (parameters no unit claims) is a unit without a module, kept
// whole and averaged like DDP.
struct Unit {
  std::string name;
  torch::nn::Module* module = nullptr;
  Hookable* hookable = nullptr;
  UnitKind kind = UnitKind::Block;
  bool reshard_after_forward = false, reshard_after_backward = true;
  comm::Comm* shard = nullptr;      // all-gathers
  comm::Comm* shard_rs = nullptr;   // reduce-scatters
  comm::Comm* replicate = nullptr;  // cross-replica gradient average
  std::vector<std::unique_ptr<FlatParam>> flats;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep alive (weakly held)
  int num_params = 0;    // trainable parameters: post_backward when all their gradients landed
  // A unit with frozen parameters: frozen weights are still read in backward by the nodes that
  // carry the gradient to the unit's input, after its last trainable gradient may have landed.
  // When its input needs a gradient, post_backward also waits for that gradient (the input's
  // hook), which autograd computes only once every node of the unit between output and input ran.
  bool has_frozen = false;
  bool awaits_input = false;  // this backward: the input's gradient is still to come
  int order_index = -1;  // position in the recorded forward order

  UnitState state = UnitState::Idle;
  int grads_landed = 0;                // PreBackward: parameters whose gradient has landed
  std::vector<at::Tensor> full_grads;  // per flat; undefined when gradients land in grad_shard
};

// A finished unit's reduce-scatter in flight: input (the unit's unsharded gradient buffer, in
// the reduce dtype) and output (this rank's shard of the reduced gradient) stay referenced until
// it is retired.
struct PendingReduce {
  FlatParam* fp = nullptr;
  comm::WorkPtr work;
  at::Tensor out, in;
};

// A reduced gradient on its way into an offloaded (host) gradient shard. On CUDA: `source` is
// the device tensor, `staging` its pinned host copy made on the side stream, `done` that copy's
// event; the source stays referenced until `done` completes (no recordStream). On a CPU device
// `staging` is the reduced tensor itself and `done` is complete at once.
struct PendingD2H {
  FlatParam* fp = nullptr;
  at::Tensor source, staging;
  DeviceEventPtr done;
};

}  // namespace shardtrain::fsdp
