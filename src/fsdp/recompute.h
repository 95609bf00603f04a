// Activation recomputation for one unit: forward without saving, recompute in backward.
#pragma once
#include "shardtrain/fsdp/forward_hook.h"

namespace shardtrain::fsdp {

// Runs body(input) without recording a graph and returns an output whose backward
// re-runs body with grad enabled and back-propagates through it (reentrant), so
// parameter gradients accumulate as usual. body may capture only objects that outlive
// the backward pass (the module), not locals of the caller.
at::Tensor run_with_recompute(const at::Tensor& input, const UnitBody& body);

}  // namespace shardtrain::fsdp
