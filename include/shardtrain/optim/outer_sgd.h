// DiLoCo's outer optimizer: SGD with (Nesterov) momentum applied to the outer copy of a flat fp32
// shard from the outer gradient averaged across replicas (fsdp's replica sync calls it).
#pragma once
#include <cstdint>

namespace shardtrain::optim {

struct OuterSGDConfig {
  float lr = 0.7f;        // diloco.outer_lr
  float momentum = 0.9f;  // diloco.outer_momentum (0: none)
  bool nesterov = true;   // diloco.nesterov
};

// One outer step on n elements. g is the averaged outer gradient (outer copy at the last sync
// minus the replica's master now). Per element, in fp32 and in this order:
//   m     = momentum*m + g
//   u     = nesterov ? g + momentum*m : m
//   outer = outer + (-lr)*u
//   local = outer                        (every replica restarts from the outer copy)
// The momentum buffer starts at zeros (so the first step's m is g, as torch's SGD's clone).
// local may be null (only the outer copy advances). Kokkos must be running (KokkosScope).
void outer_sgd_step(float* outer, float* momentum_buffer, const float* g, float* local, int64_t n,
                    const OuterSGDConfig& cfg);

}  // namespace shardtrain::optim
