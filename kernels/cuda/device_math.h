// Per-element math of the CUDA primitives, written once for host and device: the kernels call
// these from device code, and the CPU build compiles the same functions so tests check them
// against kernels/reference without a GPU (tests/cuda/device_math_test.cc).
// Plain C++17 when not compiled by nvcc; no dependencies beyond <cstdint>/<cmath>.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/splitmix.h"

#if defined(__CUDACC__)
#define SPEX_HD __host__ __device__ __forceinline__
#else
#define SPEX_HD inline
#endif

namespace spex {
namespace gpu {

SPEX_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}

// |x| >= t under IEEE rules (NaN never qualifies, a NaN threshold selects nothing).
SPEX_HD bool AbsAtLeast(float x, float t) { return fabsf(x) >= t; }

// AbsHistogram16's bin: bits 30..15 of the float, i.e. the top 16 bits of |x|'s pattern.
SPEX_HD uint32_t AbsBin16(float x) { return (FloatBits(x) & 0x7fffffffu) >> 15; }

// A 32-bit key whose unsigned order is TopK's order of magnitudes: every NaN is 0 (below every
// number), -0 and +0 share key 1, and +-Inf is the largest key (0x7f800001).
SPEX_HD uint32_t MagnitudeKey(float x) {
  const uint32_t a = FloatBits(x) & 0x7fffffffu;
  return a > 0x7f800000u ? 0u : a + 1u;
}

// Sample's draw j: splitmix64 of seed + (j + 1) * golden ratio (primitives.h).
SPEX_HD uint64_t SampleRandom(uint64_t seed, uint64_t j) {
  return SplitMix64Mix(seed + (j + 1) * kSplitMix64Gamma);
}

// floor(r * n / 2^64): the index draw j reads (always < n for n > 0).
SPEX_HD uint64_t SampleIndex(uint64_t r, uint64_t n) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(r, n);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
#endif
}

// Partial moments of |x| (AbsMoments in kernels/primitives.h, as a trivially copyable
// reduction value for cub).
struct MomentsAcc {
  unsigned long long count;
  double sum;
  double sum_sq;
  double sum_log;
  unsigned long long log_count;
  float max;
};

SPEX_HD MomentsAcc MomentsZero() { return MomentsAcc{0, 0.0, 0.0, 0.0, 0, 0.0f}; }

// The contribution of one entry: counted when |x| > lower_bound (never for NaN).
SPEX_HD MomentsAcc MomentsOf(float x, float lower_bound) {
  MomentsAcc m = MomentsZero();
  const float a = fabsf(x);
  if (!(a > lower_bound)) return m;
  m.count = 1;
  m.sum = a;
  m.sum_sq = static_cast<double>(a) * a;
  if (a > 0) {
    m.sum_log = log(static_cast<double>(a));
    m.log_count = 1;
  }
  m.max = a;
  return m;
}

SPEX_HD MomentsAcc MomentsCombine(const MomentsAcc& a, const MomentsAcc& b) {
  MomentsAcc m;
  m.count = a.count + b.count;
  m.sum = a.sum + b.sum;
  m.sum_sq = a.sum_sq + b.sum_sq;
  m.sum_log = a.sum_log + b.sum_log;
  m.log_count = a.log_count + b.log_count;
  m.max = a.max > b.max ? a.max : b.max;
  return m;
}

// The radix top-k's digit choice (radix_top_k.h ChooseDigit) on the device, in two levels so
// one block of kPickChunks threads does it without copying the 2^16 bins back: chunk c holds
// bins [c * kPickBins, (c + 1) * kPickBins); `partial[c]` is the sum of its bins. The digit
// holding the k-th largest key (given `above` larger keys) is in the chunk c with
// above + S(c) < k <= above + S(c) + partial[c], S(c) the sum of the chunks above c; inside it the
// bins are scanned from the top as ChooseDigit does. ok = 0 when no digit holds it (k <= above,
// or fewer than k - above entries).
inline constexpr uint32_t kPickChunks = 1024;
inline constexpr uint32_t kPickBins = 65536 / kPickChunks;

struct DigitPick {
  uint32_t digit = 0;
  uint32_t ok = 0;
  uint64_t above = 0;     // above + entries in digits > digit
  uint64_t in_digit = 0;  // counts[digit]
  uint64_t total = 0;     // every entry of the histogram
};

// The chunk level: which chunk, and the count above it (`partial` has kPickChunks entries).
SPEX_HD uint32_t PickChunk(const unsigned long long* partial, uint64_t above, uint64_t k,
                           uint64_t* seen_above_chunk, uint64_t* total) {
  uint64_t seen = above, sum = 0;
  uint32_t found = kPickChunks;
  for (uint32_t c = kPickChunks; c-- > 0;) {
    if (found == kPickChunks && k > seen && seen + partial[c] >= k) {
      found = c;
      *seen_above_chunk = seen;
    }
    seen += partial[c];
    sum += partial[c];
  }
  *total = sum;
  return found;
}

// The bin level inside chunk `c` (found by PickChunk, `seen` entries above it).
SPEX_HD DigitPick PickInChunk(const unsigned long long* counts, uint32_t c, uint64_t seen,
                              uint64_t k, uint64_t total) {
  DigitPick p;
  p.total = total;
  for (uint32_t d = (c + 1) * kPickBins; d-- > c * kPickBins;) {
    if (seen + counts[d] >= k) {
      p.digit = d;
      p.ok = 1;
      p.above = seen;
      p.in_digit = counts[d];
      return p;
    }
    seen += counts[d];
  }
  return p;
}

}  // namespace gpu
}  // namespace spex
