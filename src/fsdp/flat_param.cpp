// FlatParam helpers: storage resizing and version-independent aliases.
#include "shardtrain/fsdp/flat_param.h"

#include <c10/core/StorageImpl.h>

namespace shardtrain::fsdp {

int64_t FlatParam::live_full_bytes() const {
  if (!full.defined()) return 0;
  return static_cast<int64_t>(full.storage().nbytes());
}

void resize_storage(const at::Tensor& t, int64_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(s->nbytes()) == nbytes) return;
  // Allocate through the storage's own allocator (CPU, or the CUDA caching allocator
  // in a CUDA build), so this works on libtorch 1.13 and 2.x alike.
  at::DataPtr fresh = s->allocator()->allocate(static_cast<size_t>(nbytes));
  s->set_data_ptr_noswap(std::move(fresh));
  s->set_nbytes(static_cast<size_t>(nbytes));
}

at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, base.options());
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  t.set_(base.storage(), base.storage_offset() + offset, shape, strides);
  return t;
}

}  // namespace shardtrain::fsdp
