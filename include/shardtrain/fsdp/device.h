// The engine's view of its device: torch's current CUDA stream, side streams for offload copies,
// events, and the CUDA caching allocator's statistics. On a CPU device everything here is a
// no-op (streams are nullptr, events are complete at once), so the engine runs one code path
// for both. The CUDA implementation (src/fsdp/device.cpp) needs a libtorch built with CUDA
// (SHARDTRAIN_TORCH_CUDA); other builds reject CUDA devices with a clear error.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace shardtrain::fsdp {

// True when this build's libtorch has CUDA (compiled against a CUDA libtorch).
bool torch_built_with_cuda();
// Number of CUDA devices torch can use (0 for a CPU libtorch or no GPU).
int cuda_device_count();

// Allocation statistics of a device's CUDA caching allocator (bytes); all -1 on CPU.
struct DeviceMemory {
  int64_t allocated = -1;       // currently allocated by tensors (memory_allocated)
  int64_t peak_allocated = -1;  // max_memory_allocated since the last reset
  int64_t reserved = -1;        // held by the allocator (memory_reserved)
};
DeviceMemory device_memory(const c10::Device& d);
void reset_device_peak(const c10::Device& d);
// Waits for all work queued on the device (no-op on CPU).
void synchronize_device(const c10::Device& d);
// Raw cudaStream_t of torch's current stream on d for the calling thread (nullptr on CPU).
void* current_cuda_stream(const c10::Device& d);

// A recorded point in a stream. Null (or any event on CPU) counts as complete.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual bool query() = 0;        // completed?
  virtual void synchronize() = 0;  // blocks the host until completed
};
using DeviceEventPtr = std::shared_ptr<DeviceEvent>;

// One engine's device. Streams are torch's: `compute` is torch's current stream of the device on
// the calling thread (autograd's device thread in backward), `side` a pool stream the engine
// keeps for host<->device copies.
class DeviceRuntime {
 public:
  explicit DeviceRuntime(c10::Device device);
  ~DeviceRuntime();
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;

  const c10::Device& device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }

  // Raw cudaStream_t of torch's current stream (nullptr on CPU), for comm::ComputeStreamGuard.
  void* compute_stream() const;
  // Raw cudaStream_t of the side stream (nullptr on CPU).
  void* side_stream() const;

  DeviceEventPtr record_on_compute();
  DeviceEventPtr record_on_side();
  void compute_waits(const DeviceEventPtr& e);  // compute stream waits for e (no host block)
  void side_waits(const DeviceEventPtr& e);
  void side_waits_compute() { side_waits(record_on_compute()); }

  // Makes the side stream torch's current stream for a scope (copies issued inside run on it).
  class SideScope {
   public:
    explicit SideScope(DeviceRuntime& rt);
    ~SideScope();
    SideScope(const SideScope&) = delete;
    SideScope& operator=(const SideScope&) = delete;

   private:
    DeviceRuntime& rt_;
    bool active_ = false;
  };

  struct Impl;

 private:
  c10::Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::fsdp
