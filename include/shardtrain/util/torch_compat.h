// The one place where shardtrain depends on which libtorch it is built against: Debian's CPU
// libtorch 1.13 (the default) or any 2.x, CPU or CUDA (-DTorch_DIR=...). Every call whose name,
// signature or availability differs between those versions goes through here, guarded by
// TORCH_VERSION_MAJOR/MINOR; code elsewhere uses only APIs identical in 1.13 and 2.x.
// Header-only; include it only from layers that already use libtorch.
//
// Checked against the 2.x sources (pytorch/pytorch main and release branches):
// - c10::StorageImpl: allocator(), set_data_ptr_noswap(DataPtr&&), set_nbytes(size_t) exist in
//   1.13 and 2.x; Allocator::allocate is const in 1.13 and not in 2.3+ (called through a
//   non-const pointer here, which compiles with both).
// - torch::autograd::impl::grad_accumulator(Variable) -> shared_ptr<Node> (held weakly by the
//   variable), Node::add_post_hook(unique_ptr<FunctionPostHook>), FunctionPostHook::operator()
//   (outputs, inputs): same in 1.13 and 2.x (2.x adds compiled_args() with a default).
// - torch::autograd::Engine::get_default_engine().queue_callback(std::function<void()>): same.
// - Autocast: at::autocast::set_enabled(bool) (CUDA only) in 1.13 and 2.0-2.3;
//   set_autocast_enabled(DeviceType, bool) and set_autocast_dtype(DeviceType, ScalarType) from
//   2.4 (the old names are deprecated there).
// - at::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal): 2.0 and later only.
#pragma once
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <string>

#define SHARDTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace shardtrain::torch_compat {

// "1.13.0", "2.5.1": the libtorch the code was compiled against.
inline std::string version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Gives a storage a fresh block of nbytes from the storage's own allocator (the CPU allocator,
// or the CUDA caching allocator on the current stream of the current device); 0 frees it.
// The old contents are not copied (unlike at::native::resize_bytes_*, which also differ by
// version and device): callers always overwrite the whole storage.
inline void reallocate_storage(c10::StorageImpl* s, size_t nbytes) {
  at::Allocator* alloc = s->allocator();
  at::DataPtr fresh = alloc->allocate(nbytes);
  s->set_data_ptr_noswap(std::move(fresh));
  s->set_nbytes(nbytes);
}

// A leaf parameter's AccumulateGrad node; the variable holds it only weakly, so callers that
// hook it must keep the returned pointer alive.
inline std::shared_ptr<torch::autograd::Node> grad_accumulator(const at::Tensor& leaf) {
  return torch::autograd::impl::grad_accumulator(leaf);
}

inline void add_post_hook(torch::autograd::Node& node,
                          std::unique_ptr<torch::autograd::FunctionPostHook> hook) {
  node.add_post_hook(std::move(hook));
}

// Runs `fn` once the autograd engine has finished the current backward pass. Must be called
// from inside a backward (a hook).
inline void queue_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// Mixed-precision autocast on CUDA for a scope (the plain-libtorch baseline of the GPU bench).
class CudaAutocast {
 public:
  explicit CudaAutocast(at::ScalarType dtype) {
#if SHARDTRAIN_TORCH_AT_LEAST(2, 4)
    prev_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prev_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  }
  ~CudaAutocast() {
#if SHARDTRAIN_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(at::kCUDA, prev_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prev_dtype_);
#else
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
#endif
    at::autocast::clear_cache();
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// True when fused scaled-dot-product attention (flash / memory-efficient kernels) exists.
constexpr bool has_fused_attention() { return TORCH_VERSION_MAJOR >= 2; }

// Fused causal/non-causal attention over q [B,H,T,hd], k/v [B,H,S,hd] (T == S when causal);
// returns an undefined tensor when this libtorch has none (the caller then computes it by hand).
inline at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool causal, double dropout_p) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p, causal);
#else
  (void)q, (void)k, (void)v, (void)causal, (void)dropout_p;
  return at::Tensor();
#endif
}

// The fused attention with a boolean mask (true: the query may attend to the key), broadcast
// over [B, H, T, S]; undefined without libtorch >= 2.
inline at::Tensor fused_attention_masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& mask, double dropout_p) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, /*is_causal=*/false);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)dropout_p;
  return at::Tensor();
#endif
}

}  // namespace shardtrain::torch_compat
