// Block-quantized int8 and int4: the wire format of the quantized weight all-gather and the
// quantized gradient reduction across replicas (ZeRO++ qwZ / qgZ, int8) and of DiLoCo's outer
// gradients (diloco.outer_dtype int8 / int4). A vector of n values is cut into blocks of `block`
// values; each block has its own fp32 scale s = max|x| / Q (s = 0 for an all-zero block) and
// its values are stored as codes q = round(x / s) in [-Q, Q]:
//   int8 (Q = 127): one int8 code per value;
//   int4 (Q = 7):   two codes per byte, excess-8 nibbles (q + 8 in [1, 15]; 0 unused, the
//                   grid symmetric like int8's): value 2i in the low nibble of byte i, value
//                   2i+1 in the high one (an odd n's last high nibble is 8, code 0).
// The packed bytes:
//   [ codes: n bytes (int8) or ceil(n / 2) bytes (int4) | pad to a multiple of 4 (int4: zeros;
//     int8: unspecified) | ceil(n / block) fp32 scales ]
// so that one packed vector's size is a multiple of 4 bytes and vectors of equal n can sit
// side by side in one all-gather buffer. Round trip bound per element: |x - dequant(q)| <=
// s / 2 (half a step of its block), for finite x. All ATen ops: CPU and CUDA alike.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "shardtrain/fsdp/options.h"
#include <utility>

namespace shardtrain::fsdp {

enum class QuantBits { Int8, Int4 };
int quant_max(QuantBits bits);  // Q: 127 or 7

// Bytes of one packed vector of n values (a multiple of 4).
int64_t quantized_bytes(int64_t n, int64_t block, QuantBits bits = QuantBits::Int8);

// Quantizes x (any floating dtype, contiguous, n = x.numel()) into `packed` (uint8,
// quantized_bytes(n, block, bits) bytes, contiguous, on x's device).
void quantize_into(const at::Tensor& x, const at::Tensor& packed, int64_t block, QuantBits bits = QuantBits::Int8);

// Dequantizes a packed vector of n values into `out` (any floating dtype, [n], contiguous),
// computed in fp32 and cast once.
void dequantize_into(const at::Tensor& packed, int64_t n, int64_t block, const at::Tensor& out,
                     QuantBits bits = QuantBits::Int8);
at::Tensor dequantize(const at::Tensor& packed, int64_t n, int64_t block,
                      QuantBits bits = QuantBits::Int8);  // fp32 [n]

// The per-block scales of a packed vector (fp32 [ceil(n / block)], a view of `packed`).
at::Tensor packed_scales(const at::Tensor& packed, int64_t n, int64_t block, QuantBits bits = QuantBits::Int8);

// Views a byte count of a buffer of any dtype as uint8 (a buffer the comm layer can move is
// float16; the codes and scales are written into its bytes).
at::Tensor as_bytes(const at::Tensor& t, int64_t byte_offset, int64_t nbytes);

// ---- wire formats of a group average (DiLoCo's outer gradients) ---------------------------

// WireFormat (options.h): how DiLoCo's outer gradients travel (diloco.outer_dtype).
WireFormat parse_wire_format(const std::string& name);  // a kOuterDtypes name; UserError otherwise
const char* wire_format_name(WireFormat f);
bool is_quantized(WireFormat f);
QuantBits quant_bits(WireFormat f);  // Int8 / Int4; an fp32 or bf16 format is an error

// Bytes one rank sends averaging n values over `ranks` ranks in format f (blocks of `block`
// values when quantized), by the ring model (comm::ring_bytes_sent): fp32 / bf16 an all-reduce
// of 4n / 2n bytes, int8 / int4 an all-gather of ranks packed vectors. With `exact` (an
// accuracy-guard step of a quantized format) plus the fp32 all-reduce beside it. What the
// engine's byte counters count for that call; 0 for one rank.
double wire_average_bytes_sent(int64_t n, WireFormat f, int64_t block, int ranks, bool exact = false);

// The accuracy guard's measure. Squared L2 norms of a - b and of b, in fp64.
std::pair<double, double> squared_error_and_reference(const at::Tensor& a, const at::Tensor& b);
// sqrt(err2 / ref2): NaN when the exact result is not finite itself (nothing to judge: the
// trainer's divergence guard handles that step); infinite when only the quantized one is not.
double relative_error(double err2, double ref2);

}  // namespace shardtrain::fsdp
