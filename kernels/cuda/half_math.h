// The half-precision conversions of the CUDA primitives (bfloat16 and float16 buckets,
// docs/dtypes.md), written once for host and device in integer arithmetic on the bit patterns:
// the kernels of half.cu call them, and the CPU build compiles the same functions so
// tests/cuda/half_device_test checks them against kernels/half.h for every half pattern and
// every rounding boundary, without a GPU. They round as kernels/half.h does: to nearest, ties to
// even; overflow gives +-Inf; a NaN stays a NaN (quiet, sign and top payload bits kept), and
// widening is exact (a float16 NaN comes out quiet with its payload, as F16C widens it).
// Plain C++17 when not compiled by nvcc.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.h"  // SPEX_HD, FloatBits

namespace spex {
namespace gpu {

SPEX_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

SPEX_HD float WidenBf16(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

SPEX_HD uint16_t NarrowBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

SPEX_HD float WidenF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return BitsToFloat(sign);
    // Subnormal m * 2^-24: normalise the mantissa (its top bit at bit 10), adjusting the
    // exponent; exact.
    uint32_t mant = m, exp = 113;  // 2^-14 is float exponent 113 (127 - 14)
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    return BitsToFloat(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
  }
  if (e == 31) return BitsToFloat(sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0));
  return BitsToFloat(sign | ((e + 112) << 23) | (m << 13));
}

SPEX_HD uint16_t NarrowF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00 | ((a >> 13) & 0x3ff);  // NaN: quiet, never Inf
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds (ties to even) to Inf
  if (a < 0x38800000u) {
    // Below 2^-14: a float16 subnormal (or zero), round(|f| * 2^24) in integers. |f| < 2^-25
    // rounds to 0 (2^-25 itself is the tie between 0 and the smallest subnormal: even, 0).
    const uint32_t exp = a >> 23;
    if (exp < 102) return sign;                         // |f| < 2^-25
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // |f| = mant * 2^(exp - 150)
    const uint32_t shift = 126 - exp;                   // |f| * 2^24 = mant >> shift, 14..24
    const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    const uint32_t up = rem > half || (rem == half && (q & 1));
    return sign | static_cast<uint16_t>(q + up);
  }
  const uint32_t t = a - (112u << 23);  // rebias the exponent: 127 -> 15
  return sign | static_cast<uint16_t>((t + 0xfffu + ((t >> 13) & 1)) >> 13);
}

// The bucket's type as the kernels take it: bfloat16 when true, float16 when false.
SPEX_HD float WidenHalf(bool bf16, uint16_t h) { return bf16 ? WidenBf16(h) : WidenF16(h); }
SPEX_HD uint16_t NarrowHalf(bool bf16, float f) { return bf16 ? NarrowBf16(f) : NarrowF16(f); }

}  // namespace gpu
}  // namespace spex
