// The ring model of a collective's traffic: what one rank sends, and in how many steps. The one
// statement of the formula: the engine's byte counters (fsdp counting_comm.cpp), the memory
// planner's traffic model and its step-time estimate all take it from here.
#pragma once
#include <cstdint>

namespace shardtrain::comm {

enum class RingOp { AllGather, ReduceScatter, AllReduce };

// Bytes one rank sends in `op` over `ranks` ranks, for a buffer of `buffer_bytes` (the gathered
// output, the scattered input, the reduced tensor): an all-gather or reduce-scatter sends
// ranks-1 pieces of buffer_bytes / ranks; an all-reduce (reduce-scatter + all-gather) sends
// 2 (ranks-1) / ranks of the buffer. 0 for one rank.
double ring_bytes_sent(RingOp op, int ranks, double buffer_bytes);

// Sequential steps of the ring: ranks-1, twice that for an all-reduce.
int ring_steps(RingOp op, int ranks);

}  // namespace shardtrain::comm
