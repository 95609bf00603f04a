// Element conversions between storage types and accumulation types (fp32 for halves).
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace shardtrain::comm::detail {

// Accum<T>: the type a reduction of T accumulates in (fp32 for fp32 and both halves).
template <typename T> struct Accum { using type = float; };
template <> struct Accum<double> { using type = double; };

template <typename T, typename A>
inline A load_as(T v) { return static_cast<A>(v); }
// bf16 -> fp32 is a shift; spelled out so the loop vectorises.
template <>
inline float load_as<c10::BFloat16, float>(c10::BFloat16 v) {
  uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename T, typename A>
inline T store_as(A v) { return static_cast<T>(v); }  // c10 rounds to nearest even

}  // namespace shardtrain::comm::detail
