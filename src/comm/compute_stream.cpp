// The per-thread compute stream (see compute_stream.h); no CUDA dependency.
#include "shardtrain/comm/compute_stream.h"

namespace shardtrain::comm {
namespace {
thread_local void* t_stream = nullptr;
}
void set_compute_stream(void* cuda_stream) { t_stream = cuda_stream; }
void* compute_stream() { return t_stream; }
}  // namespace shardtrain::comm
