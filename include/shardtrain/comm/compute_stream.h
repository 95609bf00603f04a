// The calling thread's "compute stream": the CUDA stream NCCL collectives are ordered after.
#pragma once

namespace shardtrain::comm {

// Debian's CPU libtorch ships no c10::cuda, so the comm layer cannot ask torch for the
// current stream. Instead each thread has a settable compute stream (a raw cudaStream_t
// passed as void*; nullptr = the legacy default stream, the initial value). The FSDP
// engine sets it on the thread that runs forward/backward. A NCCL collective waits for
// the work already queued on this stream; Work::wait() makes this stream wait for the
// collective. The MPI backend ignores it.
void set_compute_stream(void* cuda_stream);
void* compute_stream();

// Sets the compute stream for a scope and restores the previous one.
class ComputeStreamGuard {
 public:
  explicit ComputeStreamGuard(void* cuda_stream) : prev_(compute_stream()) {
    set_compute_stream(cuda_stream);
  }
  ~ComputeStreamGuard() { set_compute_stream(prev_); }
  ComputeStreamGuard(const ComputeStreamGuard&) = delete;
  ComputeStreamGuard& operator=(const ComputeStreamGuard&) = delete;

 private:
  void* prev_;
};

}  // namespace shardtrain::comm
