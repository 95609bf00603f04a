// DeviceRuntime: torch's CUDA streams, events and caching-allocator statistics for the engine
// (c10::cuda, so only with a CUDA libtorch: SHARDTRAIN_TORCH_CUDA), and the CPU no-ops.
// The c10::cuda calls used here have the same names and signatures in libtorch 1.13 and 2.x;
// CMake compiles this file against 1.13's c10/cuda headers in every CUDA build
// (shardtrain_fsdp_device_cuda_check) even when it cannot link it.
#include "shardtrain/fsdp/device.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <chrono>
#include <thread>
#include <vector>

#include "shardtrain/util/error.h"

#ifndef SHARDTRAIN_TORCH_CUDA
#define SHARDTRAIN_TORCH_CUDA 0
#endif
#if SHARDTRAIN_TORCH_CUDA
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace shardtrain::fsdp {

bool torch_built_with_cuda() { return SHARDTRAIN_TORCH_CUDA != 0; }

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

namespace {
// Events on a CPU device: everything is already done.
class DoneEvent final : public DeviceEvent {
 public:
  bool query() override { return true; }
  void synchronize() override {}
};
}  // namespace

#if SHARDTRAIN_TORCH_CUDA

namespace {
class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent() : ev_(c10::DeviceType::CUDA, c10::EventFlag::PYTORCH_DEFAULT) {}
  c10::Event& get() { return ev_; }
  bool query() override { return ev_.query(); }
  void synchronize() override {
    // c10::Event has no host wait in 1.13; the copies it guards take microseconds to ms.
    while (!ev_.query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 private:
  c10::Event ev_;
};

c10::cuda::CUDAStream current(const c10::Device& d) { return c10::cuda::getCurrentCUDAStream(d.index()); }
}  // namespace

struct DeviceRuntime::Impl {
  c10::cuda::CUDAStream side;
  explicit Impl(const c10::Device& d) : side(c10::cuda::getStreamFromPool(false, d.index())) {}
  std::vector<c10::cuda::CUDAStream> saved;  // SideScope nesting
};

DeviceMemory device_memory(const c10::Device& d) {
  if (!d.is_cuda()) return {};
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const auto stats = alloc::getDeviceStats(d.index());
  DeviceMemory m;
  // Index 0 is the aggregate over small and large pools in 1.13 and 2.x (StatType::AGGREGATE).
  m.allocated = stats.allocated_bytes[0].current;
  m.peak_allocated = stats.allocated_bytes[0].peak;
  m.reserved = stats.reserved_bytes[0].current;
  return m;
}

void reset_device_peak(const c10::Device& d) {
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
}

void synchronize_device(const c10::Device& d) {
  if (!d.is_cuda()) return;
  c10::cuda::CUDAGuard g(d.index());
  c10::cuda::device_synchronize();
}

void* current_cuda_stream(const c10::Device& d) {
  return d.is_cuda() ? static_cast<void*>(current(d).stream()) : nullptr;
}

DeviceRuntime::DeviceRuntime(c10::Device device) : device_(device) {
  if (device_.is_cuda()) {
    if (!device_.has_index()) device_ = c10::Device(c10::kCUDA, 0);
    ST_USER_CHECK(device_.index() < cuda_device_count(), "CUDA device ", static_cast<int>(device_.index()),
                  " is not visible (", cuda_device_count(), " device(s))");
    c10::cuda::CUDAGuard g(device_.index());
    impl_ = std::make_unique<Impl>(device_);
  } else {
    ST_USER_CHECK(device_.is_cpu(), "the FSDP engine runs on cpu or cuda devices, not ", device_.str());
  }
}

DeviceRuntime::~DeviceRuntime() = default;

void* DeviceRuntime::compute_stream() const {
  return impl_ ? static_cast<void*>(current(device_).stream()) : nullptr;
}
void* DeviceRuntime::side_stream() const { return impl_ ? static_cast<void*>(impl_->side.stream()) : nullptr; }

DeviceEventPtr DeviceRuntime::record_on_compute() {
  if (!impl_) return std::make_shared<DoneEvent>();
  auto e = std::make_shared<CudaEvent>();
  e->get().record(current(device_).unwrap());
  return e;
}

DeviceEventPtr DeviceRuntime::record_on_side() {
  if (!impl_) return std::make_shared<DoneEvent>();
  auto e = std::make_shared<CudaEvent>();
  e->get().record(impl_->side.unwrap());
  return e;
}

void DeviceRuntime::compute_waits(const DeviceEventPtr& e) {
  if (!impl_ || !e) return;
  if (auto* c = dynamic_cast<CudaEvent*>(e.get())) c->get().block(current(device_).unwrap());
}

void DeviceRuntime::side_waits(const DeviceEventPtr& e) {
  if (!impl_ || !e) return;
  if (auto* c = dynamic_cast<CudaEvent*>(e.get())) c->get().block(impl_->side.unwrap());
}

DeviceRuntime::SideScope::SideScope(DeviceRuntime& rt) : rt_(rt) {
  if (!rt_.impl_) return;
  rt_.impl_->saved.push_back(current(rt_.device_));
  c10::cuda::setCurrentCUDAStream(rt_.impl_->side);
  active_ = true;
}

DeviceRuntime::SideScope::~SideScope() {
  if (!active_) return;
  c10::cuda::setCurrentCUDAStream(rt_.impl_->saved.back());
  rt_.impl_->saved.pop_back();
}

#else  // a libtorch without CUDA: CPU devices only

struct DeviceRuntime::Impl {};

DeviceMemory device_memory(const c10::Device&) { return {}; }
void reset_device_peak(const c10::Device&) {}
void synchronize_device(const c10::Device&) {}
void* current_cuda_stream(const c10::Device&) { return nullptr; }

DeviceRuntime::DeviceRuntime(c10::Device device) : device_(device) {
  ST_USER_CHECK(!device_.is_cuda(), "device ", device_.str(), ": this shardtrain was built against a libtorch "
                "without CUDA (", TORCH_VERSION, "); build with -DTorch_DIR pointing at a CUDA libtorch");
  ST_USER_CHECK(device_.is_cpu(), "the FSDP engine runs on cpu or cuda devices, not ", device_.str());
}
DeviceRuntime::~DeviceRuntime() = default;
void* DeviceRuntime::compute_stream() const { return nullptr; }
void* DeviceRuntime::side_stream() const { return nullptr; }
DeviceEventPtr DeviceRuntime::record_on_compute() { return std::make_shared<DoneEvent>(); }
DeviceEventPtr DeviceRuntime::record_on_side() { return std::make_shared<DoneEvent>(); }
void DeviceRuntime::compute_waits(const DeviceEventPtr&) {}
void DeviceRuntime::side_waits(const DeviceEventPtr&) {}
DeviceRuntime::SideScope::SideScope(DeviceRuntime& rt) : rt_(rt) {}
DeviceRuntime::SideScope::~SideScope() = default;

#endif

}  // namespace shardtrain::fsdp
