// Synthetic gradients for the tests: one deterministic value per (node, trainer, bucket, step,
// position), from splitmix64's output function (kernels/splitmix.h), so that every test, every
// trainer thread and every oracle computes the same inputs without sharing a generator. Integer
// values (sums exact in any order) or real ones, roughly Gaussian or uniform, with a few larger
// positions and an optional slow drift, as gradients have.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/splitmix.h"

namespace spex::test {

// Where a value sits. `bucket` 0 for tests with one bucket.
struct GradientAt {
  int node = 0;
  int trainer = 0;
  uint64_t bucket = 0;
  uint64_t step = 0;
  size_t i = 0;
};

// The value's 64 random bits: the mixed key node << 56 ^ trainer << 48 ^ bucket << 40 ^
// step << 32 ^ position.
inline uint64_t GradientBits(const GradientAt& at) {
  return SplitMix64Mix((static_cast<uint64_t>(at.node) << 56) ^
                       (static_cast<uint64_t>(at.trainer) << 48) ^ (at.bucket << 40) ^
                       (at.step << 32) ^ at.i);
}

// An integer in [-1000, 1000]: sums are exact in any order, so results compare bit for bit.
inline float IntegerGradient(const GradientAt& at) {
  return static_cast<float>(static_cast<int>(GradientBits(at) % 2001) - 1000);
}

// A real-valued gradient: not integers, so the order of additions shows in the bits.
struct GradientShape {
  enum Kind { kGaussian, kUniform };
  Kind kind = kGaussian;  // Box-Muller normal, or uniform in (-0.5, 0.5)
  double scale = 1e-3;    // the magnitude, times the value of `kind`
  // Every `spike_every`-th position (by a hash of the position, the same on every node and
  // step) is 1 + `spike` times as large; 0: none.
  uint64_t spike_every = 97;
  double spike = 4.0;
  // A per-position scale drifting slowly over positions and steps (+ 0.5 sin(0.001 i +
  // 0.05 step)), so that thresholds see structure that persists across steps.
  bool drift = false;
};

inline float Gradient(const GradientAt& at, const GradientShape& shape = {}) {
  const uint64_t x = GradientBits(at);
  const double u1 = ((x & 0xffffffull) + 0.5) / 16777216.0;
  double v;
  if (shape.kind == GradientShape::kGaussian) {
    const double u2 = (((x >> 24) & 0xffffffull) + 0.5) / 16777216.0;
    v = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  } else {
    v = u1 - 0.5;
  }
  const bool spiked = shape.spike_every != 0 && (at.i * 2654435761u) % shape.spike_every == 0;
  double scale = 1.0 + shape.spike * spiked;
  if (shape.drift) scale += 0.5 * std::sin(at.i * 0.001 + at.step * 0.05);
  return static_cast<float>(v * scale * shape.scale);
}

}  // namespace spex::test
