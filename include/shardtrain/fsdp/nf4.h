// NF4: the 4-bit NormalFloat codes of QLoRA (Dettmers et al. 2023) with bitsandbytes'
// semantics (`quantize_4bit(quant_type="nf4")`, its default backend), the storage format of a
// frozen base's linear weights (lora.base_dtype = "nf4").
//
// A flat vector of n values is cut into blocks of `block` values (the last may be shorter); each
// block keeps its absmax in fp32 and each value the index of the nearest of the 16 levels below
// to x / absmax, two indices per byte (value 2i in the HIGH nibble of byte i, 2i+1 in the low
// one; an odd n's last low nibble is 7, the level 0.0). Bit for bit as bitsandbytes:
//   - a full block scales by x * (1 / max(absmax, 1e-38f)), the last short block by
//     x / max(absmax, 1e-38f), both clamped to [-1, 1]; the stored absmax of a full block is its
//     max |x| (0 for zeros), of a short last block that value clamped to 1e-38f;
//   - the index is the number of midpoints (l[i] + l[i+1]) / 2 (fp32) strictly below the scaled
//     value (torch.bucketize), so a value on a midpoint takes the lower level;
//   - a value is level[index] * absmax in fp32, cast once to the compute dtype.
// Double quantization (bitsandbytes' compress_statistics, lora.nf4_double_quant): the absmax
// values less their mean are block-quantized to 8 bits with the signed dynamic map
// (create_dynamic_map), blocks of 256, one fp32 absmax each; dequantized they are code * absmax2
// + mean. All ATen ops: CPU and CUDA alike.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>

namespace shardtrain::fsdp::nf4 {

// The 16 NF4 levels (the QLoRA paper's, as bitsandbytes stores them in fp32), ascending.
extern const std::array<float, 16> kLevels;

struct Codes {
  at::Tensor packed;  // uint8 [ceil(n / 2)]
  at::Tensor absmax;  // fp32 [ceil(n / block)]
};

// Bytes of the packed codes and number of absmax values of n values.
int64_t packed_bytes(int64_t n);
int64_t num_blocks(int64_t n, int64_t block);

// Quantizes x (fp32, bf16 or fp16; any shape, read as its row-major flattening).
Codes quantize(const at::Tensor& x, int64_t block);
// Only the absmax values quantize(x, block) stores (fp32 [num_blocks]), without the codes.
at::Tensor block_absmax(const at::Tensor& x, int64_t block);

// The n values of `c` (blocks of `block`) in `dtype`, on c.packed's device.
at::Tensor dequantize(const Codes& c, int64_t n, int64_t block, at::ScalarType dtype);

// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)): 256 fp32 values,
// ascending, on the CPU.
const at::Tensor& dynamic_map();

struct DoubleQuant {
  at::Tensor codes;    // uint8 [absmax.numel()]: indices into dynamic_map()
  at::Tensor absmax2;  // fp32 [ceil(absmax.numel() / block2)]
  at::Tensor offset;   // fp32 scalar: the mean of the absmax values
};
constexpr int64_t kDoubleQuantBlock = 256;

// Double quantization of a vector of absmax values (fp32) and its inverse (fp32).
DoubleQuant quantize_absmax(const at::Tensor& absmax, int64_t block2 = kDoubleQuantBlock);
// The same for a part of a tensor's absmax vector starting at one of its blocks of block2, with the
// whole vector's mean (`offset`, an fp32 scalar) given: the codes and absmax2 of that part are
// those quantize_absmax of the whole vector gives it.
DoubleQuant quantize_absmax(const at::Tensor& absmax_part, const at::Tensor& offset, int64_t block2 = kDoubleQuantBlock);
at::Tensor dequantize_absmax(const DoubleQuant& q, int64_t block2 = kDoubleQuantBlock);

}  // namespace shardtrain::fsdp::nf4
