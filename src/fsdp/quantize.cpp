// Block-quantized int8 packing (see quantize.h).
#include "shardtrain/fsdp/quantize.h"

#include <cmath>
#include <limits>

#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {
namespace {

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }
int64_t codes_bytes(int64_t n) { return (n + 3) / 4 * 4; }

at::Tensor typed_view(const at::Tensor& bytes, int64_t byte_offset, int64_t count, at::ScalarType t) {
  ST_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous(), "packed buffer must be contiguous uint8");
  ST_CHECK(byte_offset + count * static_cast<int64_t>(c10::elementSize(t)) <= bytes.numel(),
           "packed buffer too small: ", bytes.numel(), " bytes");
  auto* p = static_cast<uint8_t*>(bytes.data_ptr()) + byte_offset;
  return at::from_blob(p, {count}, bytes.options().dtype(t));
}

}  // namespace

int64_t quantized_bytes(int64_t n, int64_t block) {
  ST_CHECK(block >= 1 && n >= 0, "quantized_bytes: n ", n, ", block ", block);
  return codes_bytes(n) + 4 * blocks_of(n, block);
}

at::Tensor as_bytes(const at::Tensor& t, int64_t byte_offset, int64_t nbytes) {
  ST_CHECK(t.is_contiguous(), "as_bytes: tensor must be contiguous");
  ST_CHECK(byte_offset >= 0 && byte_offset + nbytes <= t.numel() * static_cast<int64_t>(t.element_size()),
           "as_bytes: range past the tensor's bytes");
  auto* p = static_cast<uint8_t*>(t.data_ptr()) + byte_offset;
  return at::from_blob(p, {nbytes}, t.options().dtype(at::kByte));
}

at::Tensor packed_scales(const at::Tensor& packed, int64_t n, int64_t block) {
  return typed_view(packed, codes_bytes(n), blocks_of(n, block), at::kFloat);
}

void quantize_into(const at::Tensor& x, const at::Tensor& packed, int64_t block) {
  const int64_t n = x.numel(), nb = blocks_of(n, block);
  ST_CHECK(packed.numel() == quantized_bytes(n, block), "quantize_into: packed buffer of ", packed.numel(),
           " bytes for ", n, " values (", quantized_bytes(n, block), " needed)");
  if (n == 0) return;
  at::Tensor v = x.reshape({n}).to(at::kFloat);
  if (nb * block != n) v = at::constant_pad_nd(v, {0, nb * block - n}, 0);
  v = v.view({nb, block});
  at::Tensor amax = v.abs().amax({1}, /*keepdim=*/true);
  at::Tensor scale = amax / 127.0f;
  // inv = 127 / max|x| (0 for an all-zero block: its codes are 0 and its scale 0).
  at::Tensor inv = at::where(amax > 0, 127.0f / amax, at::zeros_like(amax));
  at::Tensor q = (v * inv).round_().clamp_(-127, 127).to(at::kChar).view({nb * block}).narrow(0, 0, n);
  typed_view(packed, 0, n, at::kChar).copy_(q);
  packed_scales(packed, n, block).copy_(scale.view({nb}));
}

void dequantize_into(const at::Tensor& packed, int64_t n, int64_t block, const at::Tensor& out) {
  ST_CHECK(out.numel() == n && out.is_contiguous(), "dequantize_into: output of ", out.numel(), " for ", n);
  if (n == 0) return;
  const int64_t nb = blocks_of(n, block);
  at::Tensor codes = typed_view(packed, 0, n, at::kChar).to(at::kFloat);
  if (nb * block != n) codes = at::constant_pad_nd(codes, {0, nb * block - n}, 0);
  at::Tensor v = codes.view({nb, block}).mul_(packed_scales(packed, n, block).view({nb, 1}));
  out.copy_(v.view({nb * block}).narrow(0, 0, n));
}

at::Tensor dequantize(const at::Tensor& packed, int64_t n, int64_t block) {
  at::Tensor out = at::empty({n}, packed.options().dtype(at::kFloat));
  dequantize_into(packed, n, block, out);
  return out;
}

std::pair<double, double> squared_error_and_reference(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor bd = b.to(at::kDouble);
  const double err = (a.to(at::kDouble) - bd).pow(2).sum().item<double>();
  const double ref = bd.pow(2).sum().item<double>();
  return {err, ref};
}

double relative_error(double err2, double ref2) {
  if (!std::isfinite(ref2)) return std::numeric_limits<double>::quiet_NaN();
  if (!std::isfinite(err2)) return std::numeric_limits<double>::infinity();
  if (ref2 == 0) return err2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(err2 / ref2);
}

}  // namespace shardtrain::fsdp
