// Inputs shared by the GPU-path tests: gradient-like vectors with NaN/Inf/-0/denormals mixed in,
// and a bitwise float comparison (so NaNs and signed zeros compare exactly).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace testdata {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Normal with a heavy tail and a few exact zeros.
inline std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_int_distribution<int> pick(0, 999);
  std::vector<float> x(n);
  for (float& v : x) {
    const int p = pick(gen);
    v = normal(gen);
    if (p < 5) v *= 100.0f;
    if (p == 999) v = 0.0f;
  }
  return x;
}

// Few distinct magnitudes, both signs: many ties for top-k.
inline std::vector<float> Quantized(size_t n, uint32_t seed, int levels) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(-levels, levels);
  std::vector<float> x(n);
  for (float& v : x) v = 0.25f * pick(gen);
  return x;
}

inline float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// NaN with two payloads, +-Inf, -0, denormals and FLT_MAX sprinkled over x.
inline void AddSpecials(std::vector<float>* x, uint32_t seed) {
  if (x->empty()) return;
  const float specials[] = {kNaN,
                            -kNaN,
                            FromBits(0x7fc12345u),
                            FromBits(0xff800001u),
                            kInf,
                            -kInf,
                            -0.0f,
                            1e-42f,
                            -3e-39f,
                            std::numeric_limits<float>::max()};
  std::mt19937 gen(seed);
  std::uniform_int_distribution<size_t> at(0, x->size() - 1);
  const size_t count = std::max<size_t>(10, x->size() / 500);
  for (size_t j = 0; j < count; ++j) (*x)[at(gen)] = specials[j % 10];
}

// Bit-identical, except that any two NaNs are equal: IEEE leaves the sign and payload of a NaN an
// operation generates (e.g. Inf - Inf) to the hardware and compiler, so a scalar and a vector
// path may give nan and -nan.
inline ::testing::AssertionResult SameBits(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != a[i] && b[i] != b[i]) continue;
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << " of " << n << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult SameBits(const std::vector<float>& a,
                                           const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  return SameBits(a.data(), b.data(), a.size());
}

}  // namespace testdata
}  // namespace spex
