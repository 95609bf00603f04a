// The NF4 shard's layout, quantization and dequantization (nf4_shard.h), over nf4.h's codec.
#include "shardtrain/fsdp/nf4_shard.h"

#include <algorithm>

#include <ATen/Parallel.h>

#include "shardtrain/fsdp/nf4.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp::nf4 {
namespace {

// The index of 0.0 in the dynamic map: the absmax code of a gap block (its values are 0 anyway).
int64_t dynamic_zero() {
  static const int64_t z = [] {
    const at::Tensor m = dynamic_map();
    for (int64_t i = 0; i < m.numel(); ++i)
      if (m[i].item<float>() == 0.0f) return i;
    return int64_t{0};
  }();
  return z;
}

// fp32 [count] over bytes [byte_offset, + 4 * count) of a uint8 vector.
at::Tensor floats_at(const at::Tensor& bytes, int64_t byte_offset, int64_t count) {
  return bytes.narrow(0, byte_offset, 4 * count).view(at::kFloat);
}

// On the CPU, one pass over the codes: each value level * absmax in fp32 (the product the ATen
// path computes), converted once to the output dtype (c10's round-to-nearest-even conversions,
// ATen's copy_ too): the same bits, without the index and product temporaries.
template <typename T>
void scale_into(const uint8_t* codes, const float* absmax, int64_t block, int64_t blocks, T* out) {
  at::parallel_for(0, blocks, std::max<int64_t>(1, (int64_t{1} << 16) / block), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float am = absmax[b];
      const uint8_t* c = codes + b * block / 2;
      T* o = out + b * block;
      for (int64_t j = 0; j < block / 2; ++j) {
        o[2 * j] = static_cast<T>(kLevels[c[j] >> 4] * am);
        o[2 * j + 1] = static_cast<T>(kLevels[c[j] & 15] * am);
      }
    }
  });
}

void cpu_scale(const at::Tensor& codes, const at::Tensor& absmax, int64_t block, const at::Tensor& out) {
  const int64_t blocks = absmax.numel();
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const float* am = absmax.data_ptr<float>();
  switch (out.scalar_type()) {
    case at::kFloat: return scale_into(c, am, block, blocks, out.data_ptr<float>());
    case at::kBFloat16: return scale_into(c, am, block, blocks, out.data_ptr<at::BFloat16>());
    case at::kHalf: return scale_into(c, am, block, blocks, out.data_ptr<at::Half>());
    default: {
      at::Tensor tmp = at::empty({out.numel()}, out.options().dtype(at::kFloat));
      scale_into(c, am, block, blocks, tmp.data_ptr<float>());
      out.copy_(tmp);
    }
  }
}

struct Parts {
  at::Tensor codes, absmax, qabsmax, absmax2, offset;  // absmax without, the other three with double quantization
};

Parts parts_of(const at::Tensor& packed, int64_t L, const Format& f) {
  ST_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 1 && packed.numel() == f.shard_bytes(L), "nf4 shard: ",
           packed.numel(), " bytes for ", L, " values, the layout needs ", f.shard_bytes(L));
  Parts p;
  const int64_t nb = L / f.block;
  p.codes = packed.narrow(0, 0, L / 2);
  if (!f.double_quant) {
    p.absmax = floats_at(packed, L / 2, nb);
  } else {
    const int64_t ng = nb / kDoubleQuantBlock;
    p.qabsmax = packed.narrow(0, L / 2, nb);
    p.absmax2 = floats_at(packed, L / 2 + nb, ng);
    p.offset = floats_at(packed, L / 2 + nb + 4 * ng, ng);
  }
  return p;
}

}  // namespace

int64_t Format::align() const { return double_quant ? block * kDoubleQuantBlock : block; }

int64_t Format::shard_bytes(int64_t L) const {
  ST_CHECK(block >= 2 && block % 2 == 0 && L % align() == 0, "nf4 shard of ", L, " values in blocks of ", block,
           double_quant ? " (double-quantized)" : "");
  const int64_t nb = L / block;
  return L / 2 + (double_quant ? nb + 8 * (nb / kDoubleQuantBlock) : 4 * nb);
}

at::Tensor flat_absmax(const at::Tensor& values, int64_t begin, const std::vector<Span>& tensors, const Format& f) {
  const int64_t L = values.numel();
  ST_CHECK(begin % f.block == 0 && L % f.block == 0, "nf4: absmax of [", begin, ", ", begin + L, ") in blocks of ", f.block);
  at::Tensor out = at::zeros({L / f.block}, at::TensorOptions().dtype(at::kFloat).device(values.device()));
  for (const Span& t : tensors) {
    const int64_t a = std::max(begin, t.offset), b = std::min(begin + L, t.offset + t.numel);
    if (a >= b) continue;
    const at::Tensor am = block_absmax(values.narrow(0, a - begin, b - a), f.block);
    out.narrow(0, (a - begin) / f.block, am.numel()).copy_(am);
  }
  return out;
}

at::Tensor quantize_shard(const at::Tensor& values, int64_t begin, const std::vector<Span>& tensors, const Format& f,
                          const at::Tensor& whole_absmax) {
  const int64_t L = values.numel();
  ST_CHECK(values.scalar_type() == at::kFloat && values.dim() == 1, "nf4: a shard quantizes fp32 [L]");
  ST_CHECK(begin % f.align() == 0, "nf4: a shard starting at ", begin, " is not aligned to ", f.align());
  Format plain = f;
  plain.double_quant = false;
  at::Tensor packed = at::empty({plain.shard_bytes(L)}, values.options().dtype(at::kByte));
  Parts p = parts_of(packed, L, plain);
  p.codes.fill_(0x77);  // two zeros (level 7) per byte: the gaps
  p.absmax.zero_();
  for (const Span& t : tensors) {
    ST_CHECK(t.offset % f.align() == 0, "nf4: a tensor at flat offset ", t.offset, " is not aligned to ", f.align());
    const int64_t a = std::max(begin, t.offset), b = std::min(begin + L, t.offset + t.numel);
    if (a >= b) continue;
    // Parts starting at a block boundary of their tensor and ending at the tensor's end or at a
    // block boundary: quantized alone, each gets the whole tensor's codes. In chunks, so the
    // temporaries stay small.
    const int64_t chunk = std::max<int64_t>(f.block, kDequantChunkElems / f.block * f.block);
    for (int64_t c0 = a; c0 < b; c0 += chunk) {
      const int64_t c1 = std::min(b, c0 + chunk);
      const Codes c = quantize(values.narrow(0, c0 - begin, c1 - c0), f.block);
      p.codes.narrow(0, (c0 - begin) / 2, c.packed.numel()).copy_(c.packed);
      p.absmax.narrow(0, (c0 - begin) / f.block, c.absmax.numel()).copy_(c.absmax);
    }
  }
  return f.double_quant ? double_quantize(packed, L, begin, tensors, f, whole_absmax) : packed;
}

at::Tensor plain_absmax(const at::Tensor& plain_packed, int64_t L, const Format& f) {
  Format plain = f;
  plain.double_quant = false;
  return parts_of(plain_packed, L, plain).absmax;
}

at::Tensor double_quantize(const at::Tensor& plain_packed, int64_t L, int64_t begin, const std::vector<Span>& tensors,
                           const Format& f, const at::Tensor& whole_absmax) {
  Format plain = f;
  plain.double_quant = false;
  const Parts in = parts_of(plain_packed, L, plain);
  at::Tensor packed = at::empty({f.shard_bytes(L)}, plain_packed.options());
  Parts p = parts_of(packed, L, f);
  p.codes.copy_(in.codes);
  p.qabsmax.fill_(dynamic_zero());
  p.absmax2.zero_();
  p.offset.zero_();
  for (const Span& t : tensors) {
    const int64_t a = std::max(begin, t.offset), b = std::min(begin + L, t.offset + t.numel);
    if (a >= b) continue;
    ST_CHECK(whole_absmax.defined() && whole_absmax.numel() * f.block >= t.offset + t.numel,
             "nf4: double quantization needs the whole flat's absmax");
    // bitsandbytes' offset: the mean of all of the tensor's absmax values (nf4.h). The part starts
    // at a boundary of the tensor's blocks of 256 statistics (the layout's alignment).
    const at::Tensor offset =
        whole_absmax.narrow(0, t.offset / f.block, num_blocks(t.numel, f.block)).to(plain_packed.device()).mean();
    const int64_t k0 = (a - begin) / f.block, kn = num_blocks(b - a, f.block);
    const DoubleQuant dq = quantize_absmax(in.absmax.narrow(0, k0, kn).contiguous(), offset, kDoubleQuantBlock);
    p.qabsmax.narrow(0, k0, kn).copy_(dq.codes);
    const int64_t g0 = k0 / kDoubleQuantBlock, gn = dq.absmax2.numel();
    p.absmax2.narrow(0, g0, gn).copy_(dq.absmax2);
    p.offset.narrow(0, g0, gn).copy_(offset.expand({gn}));
  }
  return packed;
}

namespace {
int64_t dequant_chunk(const Format& f) { return std::max<int64_t>(f.align(), kDequantChunkElems / f.align() * f.align()); }
}  // namespace

int64_t dequant_temp_bytes(int64_t L, const Format& f, bool cuda) {
  const int64_t n = std::min(L, dequant_chunk(f));
  return (cuda ? 12 * n : 0) + (f.double_quant ? 20 * (n / f.block) : 0);
}

void dequantize_shard(const at::Tensor& packed, int64_t L, const Format& f, const at::Tensor& out) {
  ST_CHECK(out.numel() == L && out.is_contiguous(), "nf4: dequantizing ", L, " values into ", out.numel());
  const Parts p = parts_of(packed, L, f);
  // Each byte's two levels (high nibble first) as one table row: one index per byte, not per value.
  static const at::Tensor pairs_cpu = [] {
    std::vector<float> t;
    for (int b = 0; b < 256; ++b) {
      t.push_back(kLevels[b >> 4]);
      t.push_back(kLevels[b & 15]);
    }
    return at::tensor(t, at::TensorOptions().dtype(at::kFloat)).view({256, 2});
  }();
  const at::Tensor pairs = pairs_cpu.to(packed.device());
  const at::Tensor map = f.double_quant ? dynamic_map().to(packed.device()) : at::Tensor();
  const at::Tensor flat_out = out.view({L});
  // Chunks of whole blocks of statistics, so the temporaries stay kDequantChunkElems-sized however
  // large the shard (a 70B layer's slice is 10^8 values).
  const int64_t chunk = dequant_chunk(f);
  for (int64_t a = 0; a < L; a += chunk) {
    const int64_t n = std::min(chunk, L - a), nb = n / f.block, b0 = a / f.block;
    at::Tensor absmax;
    if (!f.double_quant) {
      absmax = p.absmax.narrow(0, b0, nb);
    } else {
      // dequantize_absmax's order: code value * absmax2 in fp32, then + offset.
      const int64_t ng = nb / kDoubleQuantBlock, g0 = b0 / kDoubleQuantBlock;
      const at::Tensor v = map.index_select(0, p.qabsmax.narrow(0, b0, nb).to(at::kLong));
      absmax = (v.view({ng, kDoubleQuantBlock}) * p.absmax2.narrow(0, g0, ng).view({ng, 1})) +
               p.offset.narrow(0, g0, ng).view({ng, 1});
    }
    const at::Tensor dst = flat_out.narrow(0, a, n);
    if (packed.device().is_cpu()) {
      cpu_scale(p.codes.narrow(0, a / 2, n / 2), absmax.contiguous(), f.block, dst);
      continue;
    }
    const at::Tensor values = pairs.index_select(0, p.codes.narrow(0, a / 2, n / 2).to(at::kLong));
    dst.copy_((values.view({nb, f.block}) * absmax.reshape({nb, 1})).view({n}));
  }
}

}  // namespace shardtrain::fsdp::nf4
