// The NF4 shard: how a frozen flat of NF4 weights (QLoRA, EngineOptions::nf4) is laid out, stored
// and moved. One statement of the layout for the engine (FlatParam, its all-gather), the planner
// (FlatPlan::shard_bytes) and the tests.
//
// Layout of the flat. Each tensor starts at a multiple of align() elements (block, or block * 256
// with double quantization) and the flat is padded to a multiple of S * align(), so every shard
// boundary is a block boundary (and a boundary of the statistics' blocks of 256): a rank's part of
// a tensor is quantized exactly as bitsandbytes quantizes the whole tensor (nf4.h), whatever S is.
// The gaps between tensors hold code 7 (the level 0.0) and dequantize to 0.
//
// A shard of L elements is one byte vector, stored and all-gathered as it is:
//   [ codes: L / 2 bytes (two per byte, nf4.h)
//   | without double quantization: absmax fp32 [L / block]
//   | with it: absmax codes uint8 [L / block] | absmax2 fp32 [L / (block * 256)]
//                                             | offset fp32 [L / (block * 256)] (its tensor's mean) ]
// so a shard's bytes are a multiple of 4 (L is a multiple of block >= 32).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace shardtrain::fsdp::nf4 {

struct Format {
  int64_t block = 64;
  bool double_quant = false;
  int64_t align() const;                       // elements: block, or block * 256 with double quantization
  int64_t shard_bytes(int64_t shard_numel) const;  // the byte vector of a shard (shard_numel a multiple of align())
};

// A tensor inside a flat: its element offset (a multiple of align()) and size.
struct Span {
  int64_t offset = 0, numel = 0;
};

// The absmax of every block of [begin, begin + n) of a flat (fp32 [n / block]; n and begin
// multiples of the block): each tensor's blocks as bitsandbytes computes them for the whole
// tensor, 0 for the blocks of the gaps. `values`: the flat's elements [begin, begin + n), fp32.
at::Tensor flat_absmax(const at::Tensor& values, int64_t begin, const std::vector<Span>& tensors, const Format& f);

// Quantizes a shard: `values` fp32 [L] are the flat's elements [begin, begin + L). With double
// quantization `whole_absmax` is flat_absmax of the whole flat (each tensor's mean needs all of its
// blocks); otherwise it is not read. Returns the shard's byte vector (uint8 [f.shard_bytes(L)]).
at::Tensor quantize_shard(const at::Tensor& values, int64_t begin, const std::vector<Span>& tensors, const Format& f,
                          const at::Tensor& whole_absmax);
// The same in two steps, for a rank that holds only its slice of the tensors: quantize_shard in f
// without double quantization (codes and fp32 absmax: `plain_packed`) first; then, once every
// rank's plain_absmax has been gathered into the whole flat's, double_quantize gives what
// quantize_shard in f gives.
at::Tensor plain_absmax(const at::Tensor& plain_packed, int64_t L, const Format& f);  // fp32 [L / block], a view
at::Tensor double_quantize(const at::Tensor& plain_packed, int64_t L, int64_t begin, const std::vector<Span>& tensors,
                           const Format& f, const at::Tensor& whole_absmax);

// The L values of a shard's byte vector `packed` (any device) into `out` ([L], any floating dtype,
// on packed's device): level * absmax in fp32, cast once, as nf4::dequantize. It works through
// chunks of kDequantChunkElems values (rounded to a multiple of align()), so a gather's extra
// memory is one chunk's temporaries whatever the flat's size: dequant_temp_bytes, which the
// memory planner counts.
constexpr int64_t kDequantChunkElems = int64_t{1} << 20;
void dequantize_shard(const at::Tensor& packed, int64_t L, const Format& f, const at::Tensor& out);
// The most bytes dequantize_shard of L values holds in temporaries at once: on CUDA (ATen ops) a
// chunk's byte indices widened to int64, the levels and their products (12 bytes per value), and
// with double quantization the absmax codes widened, dequantized, scaled and offset (20 bytes per
// block); on the CPU (one pass over the codes) only the latter.
int64_t dequant_temp_bytes(int64_t L, const Format& f, bool cuda);

}  // namespace shardtrain::fsdp::nf4
