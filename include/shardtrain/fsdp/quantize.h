// Block-quantized int8: the wire format of the quantized weight all-gather and the quantized
// gradient reduction across replicas (ZeRO++ qwZ / qgZ). A vector of n values is cut into
// blocks of `block` values; each block is stored as int8 codes q = round(x / s) in [-127, 127]
// with its own fp32 scale s = max|x| / 127 (s = 0 for an all-zero block). The packed bytes:
//   [ n int8 codes | pad to a multiple of 4 | ceil(n / block) fp32 scales ]
// so that one packed vector's size is a multiple of 4 bytes and vectors of equal n can sit
// side by side in one all-gather buffer. Round trip bound per element: |x - dequant(q)| <=
// s / 2 (half a step of its block), for finite x. All ATen ops: CPU and CUDA alike.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace shardtrain::fsdp {

// Bytes of one packed vector of n values (a multiple of 4).
int64_t quantized_bytes(int64_t n, int64_t block);

// Quantizes x (any floating dtype, contiguous, n = x.numel()) into `packed` (uint8,
// quantized_bytes(n, block) bytes, contiguous, on x's device).
void quantize_into(const at::Tensor& x, const at::Tensor& packed, int64_t block);

// Dequantizes a packed vector of n values into `out` (any floating dtype, [n], contiguous),
// computed in fp32 and cast once.
void dequantize_into(const at::Tensor& packed, int64_t n, int64_t block, const at::Tensor& out);
at::Tensor dequantize(const at::Tensor& packed, int64_t n, int64_t block);  // fp32 [n]

// The per-block scales of a packed vector (fp32 [ceil(n / block)], a view of `packed`).
at::Tensor packed_scales(const at::Tensor& packed, int64_t n, int64_t block);

// Views a byte count of a buffer of any dtype as uint8 (a buffer the comm layer can move is
// float16; the codes and scales are written into its bytes).
at::Tensor as_bytes(const at::Tensor& t, int64_t byte_offset, int64_t nbytes);

// The accuracy guard's measure. Squared L2 norms of a - b and of b, in fp64.
std::pair<double, double> squared_error_and_reference(const at::Tensor& a, const at::Tensor& b);
// sqrt(err2 / ref2): NaN when the exact result is not finite itself (nothing to judge: the
// trainer's divergence guard handles that step); infinite when only the quantized one is not.
double relative_error(double err2, double ref2);

}  // namespace shardtrain::fsdp
