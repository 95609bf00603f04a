// FlatParam helpers: storage resizing and version-independent aliases.
#include "shardtrain/fsdp/flat_param.h"

#include <c10/core/StorageImpl.h>

#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::fsdp {

bool FlatParam::aliases_master() const { return fsdp::aliases_master(shard_size, dtype, offloaded); }

int64_t FlatParam::live_full_bytes() const {
  if (!full.defined()) return 0;
  return static_cast<int64_t>(full.storage().nbytes());
}

void resize_storage(const at::Tensor& t, int64_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(s->nbytes()) == nbytes) return;
  // Allocate through the storage's own allocator (CPU, or the CUDA caching allocator on the
  // current stream), the same on libtorch 1.13 and 2.x (see torch_compat.h).
  torch_compat::reallocate_storage(s, static_cast<size_t>(nbytes));
}

at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape) {
  at::Tensor t = at::empty({0}, base.options());
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  t.set_(base.storage(), base.storage_offset() + offset, shape, strides);
  return t;
}

}  // namespace shardtrain::fsdp
