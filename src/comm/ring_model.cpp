// The ring model of a collective's traffic (see ring_model.h).
#include "shardtrain/comm/ring_model.h"

namespace shardtrain::comm {

double ring_bytes_sent(RingOp op, int ranks, double buffer_bytes) {
  if (ranks <= 1) return 0.0;
  // Divided before multiplied: a piece of an evenly split buffer is exact, and so is the result.
  if (op != RingOp::AllReduce) return static_cast<double>(ranks - 1) * (buffer_bytes / ranks);
  return 2.0 * (ranks - 1) / ranks * buffer_bytes;
}

int ring_steps(RingOp op, int ranks) {
  if (ranks <= 1) return 0;
  return op == RingOp::AllReduce ? 2 * (ranks - 1) : ranks - 1;
}

}  // namespace shardtrain::comm
