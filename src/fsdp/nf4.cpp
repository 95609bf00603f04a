// NF4 codes and their double-quantized statistics with bitsandbytes' semantics (nf4.h). Each
// step is the ATen op bitsandbytes' default backend uses, in its order, so that the values are
// the same bits on every device: tests/python/nf4_reference.py checks it.
#include "shardtrain/fsdp/nf4.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "shardtrain/util/error.h"

namespace shardtrain::fsdp::nf4 {

const std::array<float, 16> kLevels = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

namespace {

// bitsandbytes clamps a block's absmax to 1e-38 (an fp32 subnormal) before scaling by it.
constexpr double kMinAbsmax = 1e-38;

at::Tensor levels_on(const at::Device& device) {
  return at::tensor(std::vector<float>(kLevels.begin(), kLevels.end()), at::TensorOptions().dtype(at::kFloat)).to(device);
}

// bitsandbytes' blockwise scaling of a flat fp32 vector against a sorted code table: the index
// of each value (int32 [n]) and each block's absmax (fp32). `pad_even`: a zero appended to an odd
// count of scaled values (4-bit packing).
std::pair<at::Tensor, at::Tensor> blockwise(const at::Tensor& flat, const at::Tensor& code, int64_t block, bool pad_even) {
  const int64_t n = flat.numel(), rem = n % block, full = n - rem, blocks = full / block;
  const int64_t k = code.numel();
  // Midpoints in fp32, as bitsandbytes computes them: (code[:-1] + code[1:]) / 2.
  const at::Tensor bounds = (code.narrow(0, 0, k - 1) + code.narrow(0, 1, k - 1)) / 2;
  std::vector<at::Tensor> absmax, scaled;
  if (blocks > 0) {
    const at::Tensor com = flat.narrow(0, 0, full).view({blocks, block});
    const at::Tensor am = std::get<0>(com.abs().max(-1));
    // Python's 1.0 / t is t.reciprocal() * 1.0; the product by 1.0 changes no bit.
    const at::Tensor inv = at::reciprocal(at::clamp_min(am, kMinAbsmax)).view({-1, 1});
    scaled.push_back(at::clamp(com * inv, -1, 1).reshape(-1));
    absmax.push_back(am);
  }
  if (rem > 0) {
    const at::Tensor tail = flat.narrow(0, full, rem);
    const at::Tensor am = at::clamp_min(tail.abs().max(), kMinAbsmax);
    scaled.push_back(at::clamp(tail / am, -1, 1));
    absmax.push_back(am.unsqueeze(0));
  }
  at::Tensor s = scaled.size() == 1 ? scaled[0] : at::cat(scaled);
  if (pad_even && s.numel() % 2 != 0) s = at::cat({s, at::zeros({1}, s.options())});
  at::Tensor a = absmax.size() == 1 ? absmax[0] : at::cat(absmax);
  return {at::bucketize(s, bounds, /*out_int32=*/true, /*right=*/false), a};
}

// values[i] = code[index[i]] * absmax[i / block] in fp32.
at::Tensor scale_back(const at::Tensor& values, const at::Tensor& absmax, int64_t block) {
  const int64_t n = values.numel(), rem = n % block, full = n - rem, blocks = full / block;
  if (rem == 0) return (values.view({-1, block}) * absmax.view({-1, 1})).reshape(n);
  at::Tensor out = at::empty({n}, values.options());
  if (blocks > 0)
    out.narrow(0, 0, full).copy_((values.narrow(0, 0, full).view({blocks, block}) * absmax.narrow(0, 0, blocks).view({-1, 1})).reshape(full));
  out.narrow(0, full, rem).copy_(values.narrow(0, full, rem) * absmax.select(0, blocks));
  return out;
}

}  // namespace

int64_t packed_bytes(int64_t n) { return (n + 1) / 2; }
int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

Codes quantize(const at::Tensor& x, int64_t block) {
  ST_CHECK(block > 0, "nf4: block size ", block);
  ST_CHECK(x.numel() > 0, "nf4: nothing to quantize");
  ST_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
           "nf4: quantizes fp32, bf16 or fp16, not ", x.scalar_type());
  const at::Tensor flat = x.reshape(-1).to(at::kFloat);
  auto [index, absmax] = blockwise(flat, levels_on(x.device()), block, /*pad_even=*/true);
  const at::Tensor q = index.to(at::kByte);
  const int64_t bytes = q.numel() / 2;
  // The even value in the high nibble: q * 16 stays below 256 for a 4-bit index.
  Codes c;
  c.packed = q.slice(0, 0, 2 * bytes, 2) * 16 + q.slice(0, 1, 2 * bytes, 2);
  c.absmax = absmax;
  return c;
}

at::Tensor block_absmax(const at::Tensor& x, int64_t block) {
  ST_CHECK(block > 0 && x.numel() > 0, "nf4: block_absmax of ", x.numel(), " values in blocks of ", block);
  const at::Tensor flat = x.reshape(-1).to(at::kFloat);
  const int64_t n = flat.numel(), rem = n % block, full = n - rem;
  std::vector<at::Tensor> parts;
  if (full > 0) parts.push_back(std::get<0>(flat.narrow(0, 0, full).view({full / block, block}).abs().max(-1)));
  if (rem > 0) parts.push_back(at::clamp_min(flat.narrow(0, full, rem).abs().max(), kMinAbsmax).unsqueeze(0));
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

at::Tensor dequantize(const Codes& c, int64_t n, int64_t block, at::ScalarType dtype) {
  ST_CHECK(c.packed.scalar_type() == at::kByte && c.packed.numel() == packed_bytes(n), "nf4: ", c.packed.numel(),
           " packed bytes for ", n, " values");
  ST_CHECK(c.absmax.scalar_type() == at::kFloat && c.absmax.numel() == num_blocks(n, block), "nf4: ",
           c.absmax.numel(), " absmax values for ", n, " values in blocks of ", block);
  const at::Tensor p = c.packed.reshape(-1).to(at::kLong);
  const at::Tensor lo = at::bitwise_and(p, 15);
  const at::Tensor hi = (p - lo).div(16, "trunc");
  const at::Tensor index = at::stack({hi, lo}, 1).reshape(-1).narrow(0, 0, n);
  const at::Tensor values = levels_on(p.device()).index_select(0, index);
  return scale_back(values, c.absmax, block).to(dtype);
}

const at::Tensor& dynamic_map() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for each exponent i in
  // 0..6, the midpoints of linspace(0.1, 1, 2^i + 1) (fp32) times +-10^(i - 6); then 0 and 1.
  static const at::Tensor map = [] {
    at::NoGradGuard ng;
    std::vector<float> data;
    for (int i = 0; i < 7; ++i) {
      const int64_t items = (int64_t{1} << i) + 1;
      const at::Tensor b = at::linspace(0.1, 1, items, at::TensorOptions().dtype(at::kFloat));
      const at::Tensor means = (b.narrow(0, 0, items - 1) + b.narrow(0, 1, items - 1)) / 2.0;
      // Python's 10 ** (i - 6): an int for i = 6, pow(10.0, i - 6) below.
      const double scale = i == 6 ? 1.0 : std::pow(10.0, i - 6);
      for (double sign : {1.0, -1.0}) {
        const at::Tensor v = (means * (sign * scale)).contiguous();
        data.insert(data.end(), v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
      }
    }
    data.push_back(0.0f);
    data.push_back(1.0f);
    ST_CHECK(data.size() == 256, "nf4: the dynamic map has ", data.size(), " values");
    std::sort(data.begin(), data.end());
    return at::tensor(data, at::TensorOptions().dtype(at::kFloat));
  }();
  return map;
}

DoubleQuant quantize_absmax(const at::Tensor& absmax, int64_t block2) {
  ST_CHECK(absmax.scalar_type() == at::kFloat && absmax.dim() == 1 && absmax.numel() > 0, "nf4: absmax must be fp32 [blocks]");
  return quantize_absmax(absmax, absmax.mean(), block2);
}

DoubleQuant quantize_absmax(const at::Tensor& absmax, const at::Tensor& offset, int64_t block2) {
  ST_CHECK(absmax.scalar_type() == at::kFloat && absmax.dim() == 1 && absmax.numel() > 0, "nf4: absmax must be fp32 [blocks]");
  DoubleQuant q;
  q.offset = offset;
  auto [index, a2] = blockwise(absmax - q.offset, dynamic_map().to(absmax.device()), block2, /*pad_even=*/false);
  q.codes = index.to(at::kByte);
  q.absmax2 = a2;
  return q;
}

at::Tensor dequantize_absmax(const DoubleQuant& q, int64_t block2) {
  const at::Tensor values = dynamic_map().to(q.codes.device()).index_select(0, q.codes.to(at::kLong));
  return scale_back(values, q.absmax2, block2) + q.offset;
}

}  // namespace shardtrain::fsdp::nf4
