// Half-precision bucket data (bfloat16, float16) beside float32: the data types a bucket may
// have, and the conversions between them. Buckets of a half type keep their local sum, their
// error-feedback residual and every compressor's work in float32; only the trainers' inputs,
// the published output and (by default) the values on the wire are half (docs/dtypes.md).
//
// Scalar conversions are here, inline; the bulk passes (widening, narrowing, and the fused
// widen-and-sum of the local reduce) are Highway loops in kernels/cpu/half_kernels.cc. Both
// round to nearest, ties to even, and are bit-exact: widening is exact for every half bit
// pattern (NaN payloads kept; a float16 NaN comes out quiet), narrowing rounds once, overflows to
// +-Inf and keeps NaN a NaN (quiet, sign kept).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"

namespace spex {

// The codes are the BucketHeader's `dtype` field (proto/contract/layout.h): 0 is float32, so a
// header written before half buckets existed reads as float32.
enum class DType : uint32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }
inline bool IsHalf(DType t) { return t != DType::kFloat32; }
const char* DTypeName(DType t);  // "float32", "bfloat16", "float16"
// Parses a name as DTypeName prints it (also "fp32", "bf16", "fp16"); InvalidArgument naming
// the accepted names otherwise.
absl::StatusOr<DType> ParseDType(const std::string& name);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float32
    const float v = static_cast<float>(m) * 0x1p-24f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (e == 31) {  // Inf; NaN quiet, payload kept (as the F16C instruction widens it)
    return BitsFloat(sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0));
  }
  return BitsFloat(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00 | ((a >> 13) & 0x3ff);  // NaN: quiet, never Inf
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds (ties to even) to Inf
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero); 2^24 scaling is exact
    return sign | static_cast<uint16_t>(std::nearbyint(BitsFloat(a) * 0x1p24f));
  }
  const uint32_t t = a - (112u << 23);  // rebias the exponent: 127 -> 15
  return sign | static_cast<uint16_t>((t + 0xfffu + ((t >> 13) & 1)) >> 13);
}

inline float HalfToFloat(DType t, uint16_t h) {
  return t == DType::kBFloat16 ? Bf16ToFloat(h) : F16ToFloat(h);
}
inline uint16_t FloatToHalf(DType t, float f) {
  return t == DType::kBFloat16 ? FloatToBf16(f) : FloatToF16(f);
}

// Whether v survives rounding to `t`: false only for a finite v that rounds to +-Inf (float16:
// |v| >= 65520; bfloat16: past its largest value by half an ulp or more). A wire that rounds a
// value to `t` checks this first and sends wider where it fails (docs/dtypes.md).
inline bool HalfFits(DType t, float v) {
  // The first magnitude FloatToF16 / FloatToBf16 round to Inf: 65,520 (the tie above 65,504)
  // and 0x7f7f8000 (the tie above bfloat16's largest); Inf and NaN stay what they are.
  const uint32_t a = FloatBits(v) & 0x7fffffffu;
  return a < (t == DType::kBFloat16 ? 0x7f7f8000u : 0x477ff000u) || a >= 0x7f800000u;
}

// Bulk passes (Highway, dispatched at run time to the CPU's best target; single-threaded).
// `t` must be a half type.
namespace half {

// y[i] = float(x[i]).
void Widen(DType t, const uint16_t* x, float* y, size_t n);
// y[i] = x[i] rounded to `t`.
void Narrow(DType t, const float* x, uint16_t* y, size_t n);
// The local reduce of half inputs: y[i] = a * (acc[i] + float(xs[0][i]) + ... +
// float(xs[count-1][i])), summed left to right in float32 (acc == nullptr: no acc term, the sum
// starts at xs[0]); a == 1 skips the multiply. y may equal acc. Returns the lowest i whose y[i]
// is NaN or +-Inf when `check` (n when none, or unchecked).
size_t SumWidenScaled(DType t, float* y, const float* acc, const uint16_t* const* xs, int count,
                      float a, size_t n, bool check);
// SumWidenScaled's y rounded once to `t` and stored as half values (the float32 sum is never
// stored): y[i] = round_t(a * (acc[i] + float(xs[0][i]) + ...)), bit for bit Narrow of
// SumWidenScaled's y. y may equal one of xs (the sum is written in place), not overlap it
// otherwise. Returns the lowest i whose float32 sum is NaN or +-Inf when `check` (n when none).
size_t SumWidenNarrow(DType t, uint16_t* y, const float* acc, const uint16_t* const* xs, int count,
                      float a, size_t n, bool check);
// The wire's rounding kept in an error-feedback residual (docs/dtypes.md), at `count` distinct
// positions: acc[idx[j]] = v - float(round_t(v)), where v = val[j] (pattern B: the selected
// values, whose positions the selection zeroed) or, with val == nullptr, acc[idx[j]] itself
// (pattern A: acc at the union, all of which was sent). Bit for bit the scalar formula; the
// conversion is vectorised, the loads and stores at idx go lane by lane. Only for values that
// went out rounded to `t`, so every v fits (HalfFits): a value past t's range is sent as
// float32 instead and its residual is zeroed, never left at -Inf.
void KeepRounding(DType t, float* acc, const uint32_t* idx, const float* val, size_t count);
// Gather and KeepRounding (pattern A, val null) in one pass: gathered[j] = v = acc[idx[j]], then
// acc[idx[j]] = v - float(round_t(v)); bit for bit the two passes. For the sender of a union's
// values as `t` (the half all-reduce rounds them alike); where they end up sent as float32
// instead, the caller writes acc back from gathered or zeroes it.
void GatherKeepRounding(DType t, float* acc, const uint32_t* idx, size_t count, float* gathered);
// Name of the Highway target these passes run on.
const char* TargetName();

}  // namespace half
}  // namespace spex
