// Whole-shard helpers for gradient clipping: the squared norm (in double) and in-place scaling.
#pragma once
#include <cstdint>

namespace shardtrain::optim {

// sum(x[i]^2) accumulated in double, so a shard of 1e9 elements loses no precision; the engine
// all-reduces these partial sums to get the global gradient norm.
double sum_of_squares(const float* x, int64_t n);

// x[i] *= factor (clip_grad_norm_ multiplies the gradient by max_norm / (norm + eps)).
void scale(float* x, int64_t n, float factor);

}  // namespace shardtrain::optim
