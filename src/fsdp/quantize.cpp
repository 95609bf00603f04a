// Block-quantized int8 / int4 packing and the group-average wire formats' byte counts (see
// quantize.h).
#include "shardtrain/fsdp/quantize.h"

#include <cmath>
#include <limits>

#include "shardtrain/comm/ring_model.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {
namespace {

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }
// Bytes of the codes themselves, then padded to a multiple of 4 (where the scales start).
int64_t code_bytes(int64_t n, QuantBits bits) { return bits == QuantBits::Int8 ? n : (n + 1) / 2; }
int64_t codes_bytes(int64_t n, QuantBits bits) { return (code_bytes(n, bits) + 3) / 4 * 4; }

at::Tensor typed_view(const at::Tensor& bytes, int64_t byte_offset, int64_t count, at::ScalarType t) {
  ST_CHECK(bytes.scalar_type() == at::kByte && bytes.is_contiguous(), "packed buffer must be contiguous uint8");
  ST_CHECK(byte_offset + count * static_cast<int64_t>(c10::elementSize(t)) <= bytes.numel(),
           "packed buffer too small: ", bytes.numel(), " bytes");
  auto* p = static_cast<uint8_t*>(bytes.data_ptr()) + byte_offset;
  return at::from_blob(p, {count}, bytes.options().dtype(t));
}

// int4: the codes (fp32 integers in [-7, 7], [n]) as excess-8 nibbles, two per byte. All in
// fp32 arithmetic, exact for these small integers: lo + 16 hi <= 255.
at::Tensor pack_nibbles(at::Tensor codes) {
  const int64_t n = codes.numel(), m = (n + 1) / 2;
  codes = codes.add(8.0f);
  if (2 * m != n) codes = at::constant_pad_nd(codes, {0, 1}, 8.0f);  // code 0
  at::Tensor pairs = codes.view({m, 2});
  return pairs.select(1, 1).mul(16.0f).add_(pairs.select(1, 0)).to(at::kByte);
}

// int4: the n codes (fp32, in [-7, 7]) of m = ceil(n / 2) packed bytes.
at::Tensor unpack_nibbles(const at::Tensor& bytes, int64_t n) {
  at::Tensor b = bytes.to(at::kFloat);
  at::Tensor lo = at::remainder(b, 16.0f);
  at::Tensor hi = (b - lo).div_(16.0f);
  return at::stack({lo, hi}, 1).view({-1}).narrow(0, 0, n).sub_(8.0f);
}

}  // namespace

int quant_max(QuantBits bits) { return bits == QuantBits::Int8 ? 127 : 7; }

int64_t quantized_bytes(int64_t n, int64_t block, QuantBits bits) {
  ST_CHECK(block >= 1 && n >= 0, "quantized_bytes: n ", n, ", block ", block);
  return codes_bytes(n, bits) + 4 * blocks_of(n, block);
}

at::Tensor as_bytes(const at::Tensor& t, int64_t byte_offset, int64_t nbytes) {
  ST_CHECK(t.is_contiguous(), "as_bytes: tensor must be contiguous");
  ST_CHECK(byte_offset >= 0 && byte_offset + nbytes <= t.numel() * static_cast<int64_t>(t.element_size()),
           "as_bytes: range past the tensor's bytes");
  auto* p = static_cast<uint8_t*>(t.data_ptr()) + byte_offset;
  return at::from_blob(p, {nbytes}, t.options().dtype(at::kByte));
}

at::Tensor packed_scales(const at::Tensor& packed, int64_t n, int64_t block, QuantBits bits) {
  return typed_view(packed, codes_bytes(n, bits), blocks_of(n, block), at::kFloat);
}

void quantize_into(const at::Tensor& x, const at::Tensor& packed, int64_t block, QuantBits bits) {
  const int64_t n = x.numel(), nb = blocks_of(n, block);
  ST_CHECK(packed.numel() == quantized_bytes(n, block, bits), "quantize_into: packed buffer of ", packed.numel(),
           " bytes for ", n, " values (", quantized_bytes(n, block, bits), " needed)");
  if (n == 0) return;
  const float Q = static_cast<float>(quant_max(bits));
  at::Tensor v = x.reshape({n}).to(at::kFloat);
  if (nb * block != n) v = at::constant_pad_nd(v, {0, nb * block - n}, 0);
  v = v.view({nb, block});
  at::Tensor amax = v.abs().amax({1}, /*keepdim=*/true);
  at::Tensor scale = amax / Q;
  // inv = Q / max|x| (0 for an all-zero block: its codes are 0 and its scale 0).
  at::Tensor inv = at::where(amax > 0, Q / amax, at::zeros_like(amax));
  at::Tensor q = (v * inv).round_().clamp_(-Q, Q).view({nb * block}).narrow(0, 0, n);
  if (bits == QuantBits::Int8) {
    typed_view(packed, 0, n, at::kChar).copy_(q.to(at::kChar));
  } else {
    const int64_t m = code_bytes(n, bits);
    typed_view(packed, 0, m, at::kByte).copy_(pack_nibbles(q));
    // int4's pad bytes are zeros: a packed vector's bytes depend on x alone.
    packed.narrow(0, m, codes_bytes(n, bits) - m).zero_();
  }
  packed_scales(packed, n, block, bits).copy_(scale.view({nb}));
}

void dequantize_into(const at::Tensor& packed, int64_t n, int64_t block, const at::Tensor& out, QuantBits bits) {
  ST_CHECK(out.numel() == n && out.is_contiguous(), "dequantize_into: output of ", out.numel(), " for ", n);
  if (n == 0) return;
  const int64_t nb = blocks_of(n, block);
  at::Tensor codes = bits == QuantBits::Int8 ? typed_view(packed, 0, n, at::kChar).to(at::kFloat)
                                             : unpack_nibbles(typed_view(packed, 0, code_bytes(n, bits), at::kByte), n);
  if (nb * block != n) codes = at::constant_pad_nd(codes, {0, nb * block - n}, 0);
  at::Tensor v = codes.view({nb, block}).mul_(packed_scales(packed, n, block, bits).view({nb, 1}));
  out.copy_(v.view({nb * block}).narrow(0, 0, n));
}

at::Tensor dequantize(const at::Tensor& packed, int64_t n, int64_t block, QuantBits bits) {
  at::Tensor out = at::empty({n}, packed.options().dtype(at::kFloat));
  dequantize_into(packed, n, block, out, bits);
  return out;
}

// ---- wire formats --------------------------------------------------------------------

// The enum's order is choices::kOuterDtypes's order (the deck schema's diloco.outer_dtype).
static_assert(static_cast<int>(WireFormat::Int4) + 1 == static_cast<int>(choices::kOuterDtypes.size()));

WireFormat parse_wire_format(const std::string& name) {
  return choices::parse_choice<WireFormat>(choices::kOuterDtypes, name, "outer dtype");
}

const char* wire_format_name(WireFormat f) { return choices::kOuterDtypes[static_cast<size_t>(f)]; }

bool is_quantized(WireFormat f) { return f == WireFormat::Int8 || f == WireFormat::Int4; }

QuantBits quant_bits(WireFormat f) {
  ST_CHECK(is_quantized(f), "quant_bits: wire format ", wire_format_name(f), " is not quantized");
  return f == WireFormat::Int8 ? QuantBits::Int8 : QuantBits::Int4;
}

double wire_average_bytes_sent(int64_t n, WireFormat f, int64_t block, int ranks, bool exact) {
  using comm::RingOp;
  const double fp32 = 4.0 * static_cast<double>(n);
  switch (f) {
    case WireFormat::Fp32: return comm::ring_bytes_sent(RingOp::AllReduce, ranks, fp32);
    case WireFormat::Bf16: return comm::ring_bytes_sent(RingOp::AllReduce, ranks, fp32 / 2) +
                                  (exact ? comm::ring_bytes_sent(RingOp::AllReduce, ranks, fp32) : 0.0);
    case WireFormat::Int8:
    case WireFormat::Int4: {
      const double packed = static_cast<double>(quantized_bytes(n, block, quant_bits(f)));
      return comm::ring_bytes_sent(RingOp::AllGather, ranks, ranks * packed) +
             (exact ? comm::ring_bytes_sent(RingOp::AllReduce, ranks, fp32) : 0.0);
    }
  }
  return 0;
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
